// What an X-Partner-Delivery-Id may be: 1 to 200 characters from ! to ~ (printable ASCII, no space). The receiver
// refuses any other (400), and `webhook sign|send --delivery-id` refuses to make one (exit 2).

const DELIVERY_ID = /^[\x21-\x7e]{1,200}$/

export const DELIVERY_ID_RULE = '1 to 200 characters from ! to ~ (printable ASCII, no space)'

export function isDeliveryId(value: string): boolean {
  return DELIVERY_ID.test(value)
}
