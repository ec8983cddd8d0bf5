// An Authorization header read as RFC 9110 has it: the scheme is case-insensitive (`Bearer`, `bearer`, `BEARER`),
// and the credential is the whole rest of the header after the scheme and its spaces, so a credential holding a
// space is kept whole and words after a right token are part of what is compared.
export function authorizationOf(header: string | undefined): { scheme: string; credential: string } | undefined {
  const [, scheme, credential = ''] = /^(\S+)(?:\s+(.*))?$/s.exec(header?.trim() ?? '') ?? []
  return scheme === undefined ? undefined : { scheme: scheme.toLowerCase(), credential }
}

/** The credential of a `Bearer` header, in any case; '' for a missing header or another scheme. */
export function bearerCredential(header: string | undefined): string {
  const authorization = authorizationOf(header)
  return authorization?.scheme === 'bearer' ? authorization.credential : ''
}
