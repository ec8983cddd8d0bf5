// Pure: does `header` carry a valid signature of `rawBody` under any of `secrets`? And its pair, the
// header a sender computes (the CLI's `webhook send`; the sandbox, the tests and the benchmark sign with
// code of their own on purpose, so a mistake here cannot hide in both ends).
// The header is `sha256=` and 64 hex digits: HMAC-SHA256 of the exact raw bytes, keyed with the
// webhook secret. Compared in constant time on the decoded 32 bytes, so hex case does not matter.
// Anything malformed is simply not valid: this function never throws on input.
import { createHmac, timingSafeEqual } from 'node:crypto'

const SIGNATURE_HEADER = /^sha256=([0-9a-fA-F]{64})$/

export function verifySignature(secrets: readonly string[], rawBody: Buffer, header: string | undefined): boolean {
  if (typeof header !== 'string') return false
  const match = SIGNATURE_HEADER.exec(header.trim())
  if (!match) return false
  const presented = Buffer.from(match[1]!, 'hex')
  let valid = false
  // every secret is tried (no early return), so timing does not tell which one matched
  for (const secret of secrets) {
    const expected = createHmac('sha256', secret).update(rawBody).digest()
    if (timingSafeEqual(expected, presented)) valid = true
  }
  return valid
}

/** Could `header` verify any body at all? False when it is missing or malformed: no body needs reading. */
export function signatureHeaderWellFormed(header: string | undefined): boolean {
  return typeof header === 'string' && SIGNATURE_HEADER.test(header.trim())
}

/** The X-Partner-Signature value for `rawBody`: `sha256=` and the HMAC-SHA256 in lower-case hex. */
export function signWebhookBody(secret: string, rawBody: Buffer | string): string {
  return `sha256=${createHmac('sha256', secret).update(rawBody).digest('hex')}`
}
