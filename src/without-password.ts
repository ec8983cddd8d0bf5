// Text that may quote a URL, with its password hidden: what the CLI prints of a refusal (fetch's quote the URL) and
// what the service logs of outside text (another application's name on the database server).

/** `text` with the password of any `scheme://user:password@` in it shown as `***`. */
export function withoutPassword(text: string): string {
  // up to the last @ before the path: a password may hold a raw @ (`admin:Tr0ub4dor@3xyz@host`), and its end showed
  return text.replace(/(\/\/[^/\s:@]*):[^/\s]*@/g, '$1:***@')
}
