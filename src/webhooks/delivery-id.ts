import { createHash } from 'node:crypto'

// What an X-Partner-Delivery-Id may be: 1 to 200 characters from ! to ~ (printable ASCII, no space). The receiver
// refuses any other (400), and `webhook sign|send --delivery-id` refuses to make one (exit 2).

const DELIVERY_ID = /^[\x21-\x7e]{1,200}$/

export const DELIVERY_ID_RULE = '1 to 200 characters from ! to ~ (printable ASCII, no space)'

export function isDeliveryId(value: string): boolean {
  return DELIVERY_ID.test(value)
}

// A delivery id is the sender's (an unverified request's is anyone's, and a verified one's is not signed): every
// log line of the webhook path gives it through here, as is only when it looks like an id, never when it could
// carry a signature or a secret (then only its hash is logged).
export function loggableDeliveryId(value: string | undefined): { deliveryId?: string; deliveryIdSha256?: string } {
  if (value === undefined) return {}
  if (/^[A-Za-z0-9_\-:.]{1,100}$/.test(value) && !/[0-9a-fA-F]{64}/.test(value)) return { deliveryId: value }
  return { deliveryIdSha256: createHash('sha256').update(value).digest('hex').slice(0, 16) }
}
