// A server certificate the TLS layer refused (an unknown CA, a self-signed one, a name that does not match, an
// expired one): this machine cannot tell the server apart from an impostor, and retrying will not change that.
// Behind a firewall it is most often the company's own CA, which Node does not trust until it is given.

/** Node's codes for a refused server certificate. */
const REFUSED_CERTIFICATE_CODES = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'CERT_UNTRUSTED',
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_SIGNATURE_FAILURE',
  'ERR_TLS_CERT_ALTNAME_INVALID',
])

export function isRefusedCertificateCode(code: unknown): code is string {
  return typeof code === 'string' && REFUSED_CERTIFICATE_CODES.has(code)
}

/** The refused certificate's code on `error` or one of its causes; undefined for any other failure. */
export function refusedCertificateCode(error: unknown): string | undefined {
  for (let at = error, depth = 0; at instanceof Error && depth < 8; at = at.cause, depth++) {
    const code = (at as { code?: unknown }).code
    if (isRefusedCertificateCode(code)) return code
  }
  return undefined
}

/** What an operator does about a certificate of the company's own CA (README: "Your own certificate authority"). */
export const OWN_CA_HINT = 'if a CA of your own signed it, give the service NODE_EXTRA_CA_CERTS=/path/to/ca.pem (read at start)'

/** OpenSSL's codes for an answer that is no TLS at all: a plain-text port reached with TLS. */
const NOT_TLS_CODES = new Set(['ERR_SSL_WRONG_VERSION_NUMBER', 'ERR_SSL_PACKET_LENGTH_TOO_LONG', 'ERR_SSL_HTTP_REQUEST'])

/**
 * OpenSSL's codes for a handshake that found no TLS version or cipher both sides speak: the server's alert
 * (protocol_version from one that offers only TLS 1.0 or 1.1, handshake_failure when no cipher is shared) or our
 * refusal of the version it chose. Each comes before the handshake is done, so before any byte of a request.
 */
const NO_COMMON_TLS_CODES = new Set([
  'ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION',
  'ERR_SSL_UNSUPPORTED_PROTOCOL',
  'ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE',
  // the same alert as OpenSSL 3.5 (Node 22 and 24) names it
  'ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE',
  'ERR_SSL_NO_PROTOCOLS_AVAILABLE',
])

/** The first of `codes` on `error` or one of its causes. */
function codeAmong(error: unknown, codes: ReadonlySet<string>): string | undefined {
  for (let at = error, depth = 0; at instanceof Error && depth < 8; at = at.cause, depth++) {
    const code = (at as { code?: unknown }).code
    if (typeof code === 'string' && codes.has(code)) return code
  }
  return undefined
}

/**
 * Whether `error`, or one of its causes, says the server answered the TLS handshake with something that is not
 * TLS: an amqps:// URL on the broker's plain port (5672), where the error was OpenSSL's own text
 * (`ssl3_get_record:wrong version number:../deps/openssl/…`).
 */
export function answeredWithoutTls(error: unknown): boolean {
  return codeAmong(error, NOT_TLS_CODES) !== undefined
}

/**
 * OpenSSL's code when the TLS handshake failed for a reason other than the certificate: the server answered
 * without TLS, or shares no TLS version or cipher with this machine; undefined for any other failure. Like a
 * refused certificate, it fails the same way at every attempt, and no byte of a request went out.
 */
export function failedHandshakeCode(error: unknown): string | undefined {
  return codeAmong(error, NOT_TLS_CODES) ?? codeAmong(error, NO_COMMON_TLS_CODES)
}
