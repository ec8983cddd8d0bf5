// The poller's own writes to orders, besides the claim (claim-due-orders.ts) and the observation
// (src/orders applies what a poll saw and clears the lease). Every write-back names the lease token of
// the claim it finishes: a replica whose lease ran out, and whose order another replica claimed since,
// changes nothing.
import { type Kysely, sql } from 'kysely'
import type { Database } from '../db/database.js'

/** Why an order is waiting for an operator instead of being polled. */
export const TRADE_NOT_FOUND = 'trade_not_found'

export interface LeaseRef {
  orderId: number
  leaseToken: string
}

/** A failed poll: the order is tried again at `nextPollAt`. False when the lease was lost. */
export async function rescheduleAfterError(
  db: Kysely<Database>,
  { orderId, leaseToken, nextPollAt }: LeaseRef & { nextPollAt: Date },
): Promise<boolean> {
  const result = await db
    .updateTable('orders')
    .set((eb) => ({
      // an earlier time set while the poll ran (an API call rescheduled the order) stands
      nextPollAt: sql<Date>`least(${nextPollAt}::timestamptz,
        case when ${eb.ref('nextPollAt')} is distinct from ${eb.ref('pollLeaseExpiresAt')} then ${eb.ref('nextPollAt')} end)`,
      pollLeaseToken: null,
      pollLeaseExpiresAt: null,
    }))
    .where('id', '=', orderId)
    .where('pollLeaseToken', '=', leaseToken)
    .executeTakeFirst()
  return result.numUpdatedRows > 0n
}

/**
 * The platform does not know the order's trade (404): polling again would get the same answer, so the
 * order leaves the poll schedule and is flagged for an operator (see requeueOrders). False when the lease
 * was lost.
 */
export async function flagTradeNotFound(
  db: Kysely<Database>,
  { orderId, leaseToken, now }: LeaseRef & { now: Date },
): Promise<boolean> {
  const result = await db
    .updateTable('orders')
    .set({
      attention: TRADE_NOT_FOUND,
      nextPollAt: null,
      pollLeaseToken: null,
      pollLeaseExpiresAt: null,
      lastPolledAt: now,
    })
    .where('id', '=', orderId)
    .where('pollLeaseToken', '=', leaseToken)
    .executeTakeFirst()
  return result.numUpdatedRows > 0n
}

/**
 * Gives back claims that were never polled (the cycle stopped): each order is due again at the time it
 * was due before the claim, and the attempt the claim counted is taken back.
 */
export async function releaseClaims(
  db: Kysely<Database>,
  leaseToken: string,
  orders: readonly { orderId: number; dueAt: Date }[],
): Promise<number> {
  if (orders.length === 0) return 0
  const ids = orders.map((order) => order.orderId)
  const dueTimes = orders.map((order) => order.dueAt.toISOString())
  // raw SQL (snake_case: the camelCase plugin does not rewrite it) for the unnest() of two arrays
  const result = await sql`
    update orders
    set next_poll_at = released.due_at,
        poll_lease_token = null,
        poll_lease_expires_at = null,
        poll_attempts = greatest(orders.poll_attempts - 1, 0)
    from unnest(${ids}::integer[], ${dueTimes}::timestamptz[]) as released(id, due_at)
    where orders.id = released.id and orders.poll_lease_token = ${leaseToken}
  `.execute(db)
  return Number(result.numAffectedRows ?? 0n)
}

export interface DueOrderStats {
  /** Orders whose next poll time has passed (claimed orders are not due until their lease runs out). */
  ordersDue: number
  /** Seconds since the longest-waiting due order came due; 0 when none is due. */
  oldestDueAgeS: number
}

/** One query over the partial index orders_due_idx: what the poller metrics report. */
export async function countDueOrders(db: Kysely<Database>, now: Date): Promise<DueOrderStats> {
  const row = await db
    .selectFrom('orders')
    .select((eb) => [eb.fn.countAll<string>().as('due'), eb.fn.min('nextPollAt').as('oldest')])
    .where('nextPollAt', '<=', now)
    .executeTakeFirstOrThrow()
  const oldest = row.oldest === null ? null : new Date(row.oldest)
  return {
    ordersDue: Number(row.due),
    oldestDueAgeS: oldest ? Math.max(0, (now.getTime() - oldest.getTime()) / 1000) : 0,
  }
}

export interface RequeueResult {
  externalReference: string
  /** requeued: due now; not_pollable: no trade id or a terminal status, so there is nothing to poll. */
  outcome: 'requeued' | 'not_pollable'
  previousAttention: string | null
}

/**
 * The operator's way out of `attention`: clears the flag and makes the order due now (if it has a trade
 * and is not terminal). With no references, every order flagged trade_not_found is requeued.
 */
export async function requeueOrders(
  db: Kysely<Database>,
  { externalReferences, now }: { externalReferences?: readonly string[]; now: Date },
): Promise<RequeueResult[]> {
  if (externalReferences && externalReferences.length === 0) return []
  return db.transaction().execute(async (trx) => {
    let query = trx
      .selectFrom('orders')
      .select(['id', 'externalReference', 'tradeId', 'isTerminal', 'attention'])
    query = externalReferences
      ? query.where('externalReference', 'in', externalReferences)
      : query.where('attention', '=', TRADE_NOT_FOUND)
    const orders = await query.orderBy('id').forUpdate().execute()
    const results: RequeueResult[] = []
    for (const order of orders) {
      const pollable = order.tradeId !== null && !order.isTerminal
      await trx
        .updateTable('orders')
        .set({
          attention: null,
          pollAttempts: 0,
          pollLeaseToken: null,
          pollLeaseExpiresAt: null,
          ...(pollable ? { nextPollAt: now } : {}),
        })
        .where('id', '=', order.id)
        .execute()
      results.push({
        externalReference: order.externalReference,
        outcome: pollable ? 'requeued' : 'not_pollable',
        previousAttention: order.attention,
      })
    }
    return results
  })
}
