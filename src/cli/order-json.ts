// An order as the CLI prints it as JSON (`orders show|list|create --json`, and the local order of `trades get|link`).
// Its columns as they are, but for the create's pending mark: trade_create_wait_ms is stored negative while a create is
// marked and not yet sent (open-trade-for-order.ts), an encoding of our own that printed as `"tradeCreateWaitMs":
// -20000`. Here it is said in a field of its own, as `orders show` says it in text (`pending (marked, not sent)`):
//   tradeCreateSent    while pending, false for a create marked and not sent, true for one sent (stamped as it left,
//                      or marked by a version that stamped no such thing); null in any other create state
//   tradeCreateWaitMs  the create's whole time in ms from updatedAt, never negative; null for a mark with none
import { type Order, unsentCreate } from '../orders/order.js'

export type OrderJson = Omit<Order, 'tradeCreateWaitMs'> & { tradeCreateSent: boolean | null; tradeCreateWaitMs: number | null }

export function orderJson(order: Order): OrderJson {
  const shown: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(order)) {
    shown[key] = key === 'tradeCreateWaitMs' && typeof value === 'number' ? Math.abs(value) : value
    // beside the state it qualifies
    if (key === 'tradeCreateState') shown.tradeCreateSent = order.tradeCreateState === 'pending' ? !unsentCreate(order) : null
  }
  return shown as OrderJson
}
