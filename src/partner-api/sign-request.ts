// Outbound request signing (spec section 5). Pure: the inputs in, the four X-Partner-* headers out.
//
// signature = hex(HMAC-SHA256(secret, `${METHOD}.${path}.${timestamp}.${nonce}.${body}`))
//
// `path` is the request path exactly as sent (with any prefix of the base URL); `body` is the exact body
// sent, byte for byte, and the empty string for a GET.
import { createHmac, randomBytes } from 'node:crypto'

export interface SignRequestInput {
  method: string
  path: string
  /** Unix seconds. */
  timestamp: number
  nonce: string
  /** The exact body sent: a string is signed as its UTF-8 bytes. Empty for a GET. */
  body: string | Uint8Array
  keyId: string
  secret: string
}

export interface PartnerAuthHeaders {
  'X-Partner-Key-Id': string
  'X-Partner-Timestamp': string
  'X-Partner-Nonce': string
  'X-Partner-Signature': string
}

export function signRequest({
  method,
  path,
  timestamp,
  nonce,
  body,
  keyId,
  secret,
}: SignRequestInput): PartnerAuthHeaders {
  const timestampText = String(timestamp)
  const signature = createHmac('sha256', secret)
    .update(`${method.toUpperCase()}.${path}.${timestampText}.${nonce}.`, 'utf8')
    // raw bytes: the signature covers the exact body as sent, never a re-serialization of it
    .update(typeof body === 'string' ? Buffer.from(body, 'utf8') : body)
    .digest('hex')
  return {
    'X-Partner-Key-Id': keyId,
    'X-Partner-Timestamp': timestampText,
    'X-Partner-Nonce': nonce,
    'X-Partner-Signature': signature,
  }
}

/** 16 random bytes, hex: unique per request, so a captured request cannot be replayed. */
export function newNonce(): string {
  return randomBytes(16).toString('hex')
}
