// A new delivery matching one of `orders` seeded orders (bench-1..N), as the ingest statement takes it: the
// index-th names order (index mod orders) + 1, each pass over the orders one status further up the lifecycle,
// so every delivery moves its order. Shared by the benches that call the statement directly.
import { createHash } from 'node:crypto'
import type { DeliveryObservation } from '../src/orders/apply-observation.js'
import { webhookObservation } from '../src/orders/observations.js'

const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'resolved']

export function matchedDelivery(index: number, orders: number): DeliveryObservation {
  const order = (index % orders) + 1
  const status = STATUSES[Math.min(Math.floor(index / orders), STATUSES.length - 1)]!
  const body = JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` })
  const deliveryId = `d-${index}`
  return {
    delivery: { deliveryId, eventType: `trade.${status}`, rawBody: body, bodySha256: createHash('sha256').update(body).digest('hex') },
    observation: webhookObservation({ externalReference: `bench-${order}`, tradeId: `trd-${order}`, tradeReference: `R-${order}`, status }, deliveryId, new Date()),
  }
}
