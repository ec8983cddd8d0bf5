// A value as one word of a POSIX shell command line, for commands printed for a person to copy.

// the characters no POSIX shell treats specially, anywhere in a word
const PLAIN = /^[A-Za-z0-9_@%+=:,./-]+$/

/** `text` as it is when the shell takes it as it is; otherwise in single quotes, each ' written '\''. */
export function quoteForShell(text: string): string {
  return PLAIN.test(text) ? text : `'${text.replaceAll("'", `'\\''`)}'`
}
