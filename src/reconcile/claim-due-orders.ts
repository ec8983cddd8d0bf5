// The one statement that hands a replica its share of the poll work.
//
// It locks up to `limit` due orders with FOR UPDATE SKIP LOCKED (rows another replica is claiming at
// this instant are skipped, not waited for) and, in the same statement, writes a lease on them: a token
// only this cycle knows, and next_poll_at pushed out by the lease. So no other replica sees them as due
// while they are being polled, and if this replica dies mid-cycle they simply come due again when the
// lease runs out. The write-back of a poll checks the token, so a replica whose lease ran out (and
// whose orders were claimed again) cannot overwrite what the newer claim wrote.
//
// poll_attempts counts consecutive polls that did not come back with an answer: the claim counts the
// attempt (a replica that crashed mid-poll counts too), a poll that is answered resets it, and the error
// backoff grows with it. A claim that is released untried (the cycle stopped) takes its count back.
//
// Cost: the inner select walks the partial index orders_due_idx (next_poll_at, only pollable orders) in
// order and stops after `limit` rows, so it stays O(batch) however many orders exist.
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'

export interface ClaimedOrder {
  orderId: number
  externalReference: string
  tradeId: string
  tradeStatus: string | null
  /** Consecutive unanswered polls, this one included. */
  pollAttempts: number
  /** When the order came due (before the claim moved next_poll_at). */
  dueAt: Date
}

export interface ClaimOptions {
  /** The clock's now: a parameter rather than SQL now(), so an injected clock decides what is due. */
  now: Date
  limit: number
  leaseS: number
  leaseToken: string
}

export async function claimDueOrders(db: Kysely<Database>, options: ClaimOptions): Promise<ClaimedOrder[]> {
  const rows = await claimDueOrdersQuery(db, options).execute()
  return rows
    .map((row) => ({
      orderId: row.id,
      externalReference: row.externalReference,
      tradeId: row.tradeId!,
      tradeStatus: row.tradeStatus,
      pollAttempts: row.pollAttempts,
      dueAt: new Date(row.dueAt!),
    }))
    .sort((a, b) => a.dueAt.getTime() - b.dueAt.getTime() || a.orderId - b.orderId)
}

/** The statement itself, unexecuted: what a plan check (EXPLAIN) compiles. */
export function claimDueOrdersQuery(db: Kysely<Database>, { now, limit, leaseS, leaseToken }: ClaimOptions) {
  const leaseEnd = new Date(now.getTime() + leaseS * 1000)
  return (
    db
      // materialized: the locked set is computed once, before the update joins it
      .with(
        (cte) => cte('due').materialized(),
        (qb) =>
          qb
            .selectFrom('orders')
            .select(['id', 'nextPollAt'])
            .where('nextPollAt', '<=', now)
            // the invariant already keeps these out of the index; the check makes "never claimed" certain
            .where('tradeId', 'is not', null)
            .where('isTerminal', '=', false)
            .orderBy('nextPollAt')
            .limit(limit)
            .forUpdate()
            .skipLocked(),
      )
      .updateTable('orders')
      .from('due')
      .set((eb) => ({
        pollLeaseToken: leaseToken,
        pollLeaseExpiresAt: leaseEnd,
        nextPollAt: leaseEnd,
        pollAttempts: eb('orders.pollAttempts', '+', 1),
      }))
      .whereRef('orders.id', '=', 'due.id')
      .returning([
        'orders.id',
        'orders.externalReference',
        'orders.tradeId',
        'orders.tradeStatus',
        'orders.pollAttempts',
        'due.nextPollAt as dueAt',
      ])
  )
}
