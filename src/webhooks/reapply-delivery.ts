// Re-running a stored trade delivery's effect (after an operator created the missing order or fixed a
// mapping): the `deliveries reapply` command and the operator console both come here. Applying is
// idempotent: a status the order already has is a duplicate_effect and changes nothing.
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'
import { applyObservation, type ObservationSettings } from '../orders/apply-observation.js'
import { findOrderByExternalReference } from '../orders/order.repository.js'
import { type DeliveryOutcome, type StoredDelivery, updateDeliveryOutcome } from './delivery.repository.js'
import { classifyDelivery, parseBody } from './parse-delivery.js'

export type ReapplyResult =
  | {
      kind: 'reapplied'
      outcome: DeliveryOutcome
      orderId: number | null
      fromStatus: string | null
      toStatus: string | null
    }
  /** Not a trade event (or a body that no longer parses): there is no effect to re-run. */
  | { kind: 'not_a_trade_event'; eventType: string }

export async function reapplyDelivery(
  db: Kysely<Database>,
  delivery: StoredDelivery,
  settings: ObservationSettings,
  now: Date,
): Promise<ReapplyResult> {
  let event
  try {
    event = classifyDelivery(parseBody(Buffer.from(delivery.rawBody)).body)
  } catch {
    return { kind: 'not_a_trade_event', eventType: delivery.eventType }
  }
  if (event.kind !== 'trade') return { kind: 'not_a_trade_event', eventType: event.eventType }
  const order = await findOrderByExternalReference(db, event.externalReference)
  const result = order
    ? await applyObservation(
        db,
        {
          target: { orderId: order.id },
          tradeId: event.tradeId,
          tradeReference: event.tradeReference,
          externalReference: event.externalReference,
          status: event.status,
          source: 'webhook',
          deliveryId: delivery.deliveryId,
          observedAt: now,
        },
        settings,
      )
    : { outcome: 'unmatched' as const, orderId: null, fromStatus: null, toStatus: null }
  await updateDeliveryOutcome(db, delivery, result.outcome, result.outcome === 'applied' ? now : null)
  return {
    kind: 'reapplied',
    outcome: result.outcome,
    orderId: result.orderId,
    fromStatus: result.fromStatus,
    toStatus: result.toStatus,
  }
}
