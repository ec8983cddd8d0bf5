// Creating orders in tests: src's createOrder with the observation settings most tests need (the
// service's defaults, no reaction handlers) and the wall clock, unless a test names its own.
import { type Kysely, sql } from 'kysely'
import { expect } from 'vitest'
import type { Database } from '../../src/db/database.js'
import { applyObservation, type ObservationSettings } from '../../src/orders/apply-observation.js'
import { createOrder as createOrderWith } from '../../src/orders/create-order.js'
import { observationSettings } from '../../src/orders/observations.js'
import type { TradeCreateState } from '../../src/orders/order.js'
import { markTradeCreateSending, startTradeCreate } from '../../src/orders/order.repository.js'

/** STALE_AFTER_S's default (21,600 s) and no reaction handlers. */
export const TEST_OBSERVATION_SETTINGS: ObservationSettings = observationSettings({ poll: { staleAfterS: 21_600 } })

export function createOrder(
  db: Kysely<Database>,
  { externalReference, now = () => new Date() }: { externalReference: string; now?: () => Date },
  settings: ObservationSettings = TEST_OBSERVATION_SETTINGS,
) {
  return createOrderWith(db, { externalReference, now }, settings)
}

/**
 * Moves an order's trade create mark (updated_at, stamped by the database's clock) to `ageMs` before the database's
 * now: a create marked, or last set unknown, that long ago.
 */
export async function backdateCreateMark(db: Kysely<Database>, orderId: number, ageMs: number): Promise<void> {
  await sql`update orders set updated_at = date_trunc('milliseconds', now()) - ${ageMs}::double precision * interval '1 millisecond'
    where id = ${orderId}`.execute(db)
}

/**
 * Puts an order's trade create mark back to `mark`: the one its command wrote, after a test aged it
 * (backdateCreateMark) for another command to judge. The mark is also that command's claim on the create, and its
 * answer is recorded only under it (open-trade-for-order.ts).
 */
export async function restoreCreateMark(db: Kysely<Database>, orderId: number, mark: Date): Promise<void> {
  await db.updateTable('orders').set({ updatedAt: mark }).where('id', '=', orderId).execute()
}

/**
 * A new order moved through `statuses` by API answers at `now`, each applied (every move writes its event for
 * `handlersFor`'s handlers); returns the order's id.
 */
export async function moveNewOrder(
  db: Kysely<Database>,
  { externalReference, statuses, handlersFor, now }: { externalReference: string; statuses: readonly string[]; handlersFor: (type: string) => readonly string[]; now: () => Date },
): Promise<number> {
  const { order } = await createOrder(db, { externalReference })
  for (const status of statuses) {
    const result = await applyObservation(
      db,
      { target: { orderId: order.id }, tradeId: `trd_${externalReference}`, status, source: 'api', observedAt: now() },
      { staleAfterS: 3_600, handlersFor },
    )
    expect(result.outcome).toBe('applied')
  }
  return order.id
}

/**
 * Marks an order's create pending and stamps it as sent, as `trades open` does right before its create leaves
 * (startTradeCreate, then markTradeCreateSending): a create at the platform, or one whose command stopped mid-call.
 * A mark alone is a create never sent. Returns the mark, or undefined when it was not marked.
 */
export async function markCreateSent(
  db: Kysely<Database>,
  orderId: number,
  previousState: TradeCreateState,
  { waitMs }: { waitMs: number },
): Promise<Date | undefined> {
  const marked = await startTradeCreate(db, orderId, previousState, { waitMs })
  return marked && markTradeCreateSending(db, orderId, marked, waitMs)
}
