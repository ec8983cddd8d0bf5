// Parked deliveries and re-applying: one home for every time a stored trade delivery is applied after
// its own statement.
//
// A trade event whose external_reference has no order yet is stored as `unmatched` (parked). It is
// applied later, from its stored columns (never by parsing its raw body again):
// - when its order is created: createOrder (orders/create-order.ts) runs applyParkedDeliveries in the
//   creating transaction and once more after the commit, so a delivery parked while that transaction ran
//   is not missed;
// - when a delivery was parked by a statement that ran while its order was being created: the ingest's
//   late pass (ingestDeliveries below) looks again once the statement committed;
// - when an operator re-applies it (`deliveries reapply`, the console): reapplyDelivery, which also
//   re-runs a delivery that was applied, stale or a mismatch. Applying is idempotent: a status the order
//   already has is a duplicate_effect and changes nothing. A seller or buyer event has no order: its re-apply
//   runs its event handlers again on its stored body (rerunEventHandlers below).
import type { Kysely, Transaction } from 'kysely'
import { loggableError } from '../db/database-errors.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import { loggableDeliveryId } from './delivery-id.js'
import { type EventHandler, type EventHandlers, runHandlers } from './event-handlers.js'
import {
  applyObservation,
  type DeliveryObservation,
  type DeliveryResult,
  isForeignReference,
  type ObservationSettings,
  recordDeliveriesAndApply,
} from '../orders/apply-observation.js'
import { existingOrderReferences, findOrderByExternalReference, lockOrderReference } from '../orders/order.repository.js'
import { storedDeliveryObservation } from '../orders/observations.js'
import {
  type DeliveryOutcome,
  lockParkedDeliveries,
  type ParkedDelivery,
  recordDuplicateEffects,
  recordReapplyOutcome,
  type StoredDelivery,
  updateDeliveryOutcome,
} from './delivery.repository.js'

type Executor = Kysely<Database> | Transaction<Database>

/** What applying one parked delivery did: its outcome, and the order's status after it where it has one. */
export interface ParkedDeliveryResult {
  deliveryId: string
  outcome: DeliveryOutcome
  toStatus: string | null
}

/**
 * Applies the deliveries parked for a reference, oldest first, if its order exists; each parked row is
 * given the outcome that applying it had. Returns those outcomes, in the order applied.
 */
export async function applyParkedDeliveries(
  db: Executor,
  externalReference: string,
  settings: ObservationSettings,
  now: () => Date,
): Promise<ParkedDeliveryResult[]> {
  const run = async (trx: Transaction<Database>) => {
    const order = await findOrderByExternalReference(trx, externalReference)
    if (!order) return []
    const parked = await lockParkedDeliveries(trx, externalReference)
    const results: ParkedDeliveryResult[] = []
    // a body parked again under another delivery id (before the ingest told replays apart) changes nothing the
    // first does: recorded a duplicate of its effect, all in one statement. Applied one by one, 50,000 replays of
    // one body took 16 minutes in this transaction, holding every reaction stream back
    const applied = new Map<string, string | null>()
    const repeats: ParkedDelivery[] = []
    for (const delivery of parked) {
      if (applied.has(delivery.bodySha256)) {
        repeats.push(delivery)
        results.push({ deliveryId: delivery.deliveryId, outcome: 'duplicate_effect', toStatus: applied.get(delivery.bodySha256)! })
        continue
      }
      const appliedAt = now()
      const result = await applyObservation(
        trx,
        storedDeliveryObservation({ ...delivery, externalReference }, order.id, appliedAt),
        settings,
      )
      await updateDeliveryOutcome(trx, delivery, {
        outcome: result.outcome,
        orderId: order.id,
        appliedAt: result.outcome === 'applied' ? appliedAt : null,
      })
      results.push({ deliveryId: delivery.deliveryId, outcome: result.outcome, toStatus: result.toStatus })
      applied.set(delivery.bodySha256, result.toStatus)
    }
    await recordDuplicateEffects(trx, repeats, order.id)
    return results
  }
  return db.isTransaction ? run(db as Transaction<Database>) : db.transaction().execute(run)
}

export type WriteResult = DeliveryResult | 'duplicate' | 'replayed'

/**
 * The ingest's write of a batch of trade deliveries (what the group commit runs): records and applies
 * them in one statement, then looks again at the ones it parked. If an order named by one of those was
 * created while the statement ran (and so missed the parked row), its parked deliveries are applied now,
 * before the answer. If that fails, the deliveries stay stored (parked) and answered 200: `deliveries
 * reapply` applies them later.
 */
export function ingestDeliveries(deps: {
  db: Kysely<Database>
  settings: ObservationSettings
  logger: Logger
  /** Told how many deliveries each batch parked (the statistics watch: StatisticsWatch.parkedStored). */
  onParked?: ((count: number) => void) | undefined
}) {
  return async (items: readonly DeliveryObservation[]): Promise<WriteResult[]> => {
    const results = await recordDeliveriesAndApply(deps.db, items, deps.settings)
    const parked = items
      .filter((_, index) => typeof results[index] === 'object' && results[index].outcome === 'unmatched')
      .map((item) => item.observation)
    if (parked.length === 0) return results
    deps.onParked?.(parked.length)
    try {
      const references = [...new Set(parked.map((observation) => observation.target.externalReference))].sort()
      // A creation of one of these orders under way holds its reference's lock: wait for its commit, then look. Looked
      // at before it, the order was not there, the delivery was answered 200 parked, and its sender's next delivery
      // was applied to the new order before createOrder's second pass applied this one, as stale: a transition lost.
      const existing = await deps.db.transaction().execute(async (trx) => {
        for (const reference of references) await lockOrderReference(trx, reference, { shared: true })
        return existingOrderReferences(trx, references)
      })
      for (const observation of parked.filter((each) => existing.has(each.target.externalReference))) {
        // the clock's time of the delivery that found the order: "now", as the service's clock tells it
        await applyParkedDeliveries(deps.db, observation.target.externalReference, deps.settings, () => observation.observedAt)
      }
    } catch (error) {
      deps.logger.warn(
        { err: loggableError(error), parked: parked.length },
        'parked deliveries not applied yet; run `deliveries reapply` on them',
      )
    }
    return results
  }
}

export type ReapplyResult =
  | {
      kind: 'reapplied'
      outcome: DeliveryOutcome
      orderId: number | null
      fromStatus: string | null
      toStatus: string | null
    }
  /** Not a trade event (ignored), and no event handler takes it (or none was given): there is no effect to re-run. */
  | { kind: 'not_a_trade_event'; eventType: string }
  /**
   * A seller or buyer event whose handlers ran again (partner-event-handlers.ts): `outcome` is what the row records
   * after them (a delivery that applied stays applied).
   */
  | { kind: 'handlers_run'; eventType: string; outcome: DeliveryOutcome; handlers: number }
  /** Its handlers ran again, and one threw (logged with the delivery id and the event type): nothing recorded. */
  | { kind: 'handler_failed'; eventType: string }
  /** A seller or buyer event its handlers take, whose raw body was pruned (RETENTION_DAYS): nothing to run them on. */
  | { kind: 'body_pruned'; eventType: string }
  /** Stored as invalid (its payload failed the checks, or the database refused a value of it): nothing of it was read to apply. */
  | { kind: 'invalid'; eventType: string }

/** The seller and buyer event handlers a re-apply runs again, and the logger their failure is told to. */
export interface ReapplyEvents {
  handlers: EventHandlers
  logger: Logger
}

/**
 * Re-runs a stored delivery's effect on its order (the order matched by its external reference now). The
 * order's move and the delivery's new outcome commit together: a failure (or a process stopped) between the
 * two would leave the order moved and the delivery still saying, say, `unmatched`. A seller or buyer event's effect
 * is its handlers' (`events`; none given: not re-run), run again on its stored body as the ingest ran them.
 */
export async function reapplyDelivery(
  db: Kysely<Database>,
  delivery: StoredDelivery,
  settings: ObservationSettings,
  now: Date,
  events?: ReapplyEvents,
): Promise<ReapplyResult> {
  if (delivery.outcome === 'invalid') return { kind: 'invalid', eventType: delivery.eventType }
  if (!isTradeEvent(delivery)) {
    const handlers = events?.handlers.handlersFor(delivery.eventType) ?? []
    if (handlers.length === 0) return { kind: 'not_a_trade_event', eventType: delivery.eventType }
    return rerunEventHandlers(db, delivery, handlers, events!.logger, now)
  }
  const { externalReference } = delivery
  const result = await db.transaction().execute(async (trx) => {
    const order = await findOrderByExternalReference(trx, externalReference)
    if (!order) {
      // parked again, unless an operator dismissed it or ORDER_REFERENCE_PATTERN says no order of this backend will
      // have the reference: a reapply that finds no order does not undo `deliveries dismiss`
      const outcome: DeliveryOutcome = isForeignReference(settings, externalReference) ? 'dismissed' : 'unmatched'
      const kept = await recordReapplyOutcome(trx, delivery, { outcome, orderId: null, appliedAt: null })
      // what re-applying did; a dismissed delivery it found no order for is still dismissed
      return { outcome: kept === 'dismissed' ? kept : outcome, orderId: null, fromStatus: null, toStatus: null }
    }
    const applied = await applyObservation(trx, storedDeliveryObservation({ ...delivery, externalReference }, order.id, now), settings)
    await recordReapplyOutcome(trx, delivery, {
      outcome: applied.outcome,
      orderId: applied.orderId,
      appliedAt: applied.outcome === 'applied' ? now : null,
    })
    return applied
  })
  return {
    kind: 'reapplied',
    outcome: result.outcome,
    orderId: result.orderId,
    fromStatus: result.fromStatus,
    toStatus: result.toStatus,
  }
}

/** Whether re-applying `delivery` is running event handlers again: a seller or buyer event one of `handlers` takes. */
export function rerunsEventHandlers(delivery: StoredDelivery, handlers: EventHandlers): boolean {
  return delivery.outcome !== 'invalid' && !isTradeEvent(delivery) && handlers.handlersFor(delivery.eventType).length > 0
}

/** A trade event, stored with the columns an order's move is applied from (migrations/0006). */
function isTradeEvent(delivery: StoredDelivery): delivery is StoredDelivery & { externalReference: string; tradeId: string; observedStatus: string } {
  return delivery.externalReference !== null && delivery.tradeId !== null && delivery.observedStatus !== null
}

// A seller or buyer event's handlers, run again on the body stored. The platform retries a delivery its handler failed
// (answered 500) under a fresh id, at most five times; after those, nothing ran the handler again, and `deliveries
// reapply` refused the delivery as no trade event: the README's "redo by hand" had no tool. As at the ingest, the
// handlers run outside a transaction (each is its own code), and 'applied' from any of them is recorded on the row.
async function rerunEventHandlers(
  db: Kysely<Database>,
  delivery: StoredDelivery,
  handlers: readonly EventHandler[],
  logger: Logger,
  now: Date,
): Promise<ReapplyResult> {
  const { deliveryId, bodySha256, eventType } = delivery
  if (delivery.rawBody === null) return { kind: 'body_pruned', eventType }
  // stored only once parsed as a JSON object with an `event` string (classifyDelivery)
  const body = JSON.parse(delivery.rawBody) as Record<string, unknown>
  let outcome: 'applied' | 'ignored'
  try {
    outcome = await runHandlers(handlers, { db, logger, deliveryId, eventType, body })
  } catch (error) {
    logger.error(
      { ...loggableDeliveryId(deliveryId), eventType, err: loggableError(error) },
      'webhook event handler failed again on a re-apply; the delivery stays stored as it was',
    )
    return { kind: 'handler_failed', eventType }
  }
  // a delivery that applied keeps the time it first did, as a trade event's re-apply keeps it
  if (outcome === 'applied' && delivery.outcome !== 'applied') {
    await updateDeliveryOutcome(db, { deliveryId, bodySha256 }, { outcome: 'applied', appliedAt: now })
  }
  return { kind: 'handlers_run', eventType, outcome: outcome === 'applied' ? 'applied' : delivery.outcome, handlers: handlers.length }
}
