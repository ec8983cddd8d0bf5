// The poll statements of a build before migration 0020 (commit 2fd973f, src/orders/poll-schedule.repository.ts and the
// observation statement), as such a replica sends them during a rolling upgrade: they move next_poll_at and the lease
// and write neither orders.poll_due_since nor orders.poll_retry_at. Written out (it is that build's SQL, not this
// one's) so a test can run them beside this build's statements on the same rows.
import { type Kysely, sql } from 'kysely'
import type { Database } from '../../src/db/database.js'

/** The older build's claim: every due order of the sandbox, up to `limit`, leased until now + leaseS. */
export async function olderClaim(db: Kysely<Database>, { now, leaseS, leaseToken, limit = 100 }: { now: Date; leaseS: number; leaseToken: string; limit?: number }) {
  const leaseEnd = new Date(now.getTime() + leaseS * 1000)
  const { rows } = await sql<{ id: number }>`
    with due as materialized (
      select id, next_poll_at from orders
      where next_poll_at <= ${now} and trade_id is not null and is_terminal = false
        and (partner_env is null or partner_env = 'sandbox')
        and (poll_lease_expires_at is null or poll_lease_expires_at <= ${now})
      order by next_poll_at limit ${limit} for update skip locked)
    update orders set poll_lease_token = ${leaseToken}, poll_lease_expires_at = ${leaseEnd}, next_poll_at = ${leaseEnd},
      poll_attempts = orders.poll_attempts + 1
    from due where orders.id = due.id
    returning orders.id`.execute(db)
  return rows.length
}

const scheduleUnlessChanged = (fallback: Date | ReturnType<typeof sql>) => sql`case
  when orders.is_terminal then null
  when orders.next_poll_at is distinct from orders.poll_lease_expires_at then orders.next_poll_at
  else ${fallback}::timestamptz end`

/** The older build's write-back of a failed poll: due again at `nextPollAt` (its backoff). */
export async function olderRescheduleAfterError(db: Kysely<Database>, { orderId, leaseToken, nextPollAt }: { orderId: number; leaseToken: string; nextPollAt: Date }) {
  await sql`update orders set next_poll_at = ${scheduleUnlessChanged(nextPollAt)}, poll_lease_token = null, poll_lease_expires_at = null
    where id = ${orderId} and poll_lease_token = ${leaseToken}`.execute(db)
}

/** The older build's claim given back untried: due again when it was due before the claim. */
export async function olderRelease(db: Kysely<Database>, { orderId, leaseToken, dueAt }: { orderId: number; leaseToken: string; dueAt: Date }) {
  await sql`update orders set next_poll_at = ${scheduleUnlessChanged(dueAt)}, poll_lease_token = null, poll_lease_expires_at = null,
      poll_attempts = greatest(orders.poll_attempts - 1, 0)
    where id = ${orderId} and poll_lease_token = ${leaseToken}`.execute(db)
}

/** The lease columns of the older build's observation statement for a poll's answer: polled again `staleAfterS` on. */
export async function olderAnswer(db: Kysely<Database>, { orderId, leaseToken, now, staleAfterS }: { orderId: number; leaseToken: string; now: Date; staleAfterS: number }) {
  await sql`update orders set next_poll_at = ${new Date(now.getTime() + staleAfterS * 1000)}, poll_lease_token = null,
      poll_lease_expires_at = null, last_polled_at = ${now}, poll_attempts = 0, updated_at = ${now}
    where id = ${orderId} and poll_lease_token = ${leaseToken}`.execute(db)
}

/** The older build's flag for an operator (a 404): off the schedule. */
export async function olderFlag(db: Kysely<Database>, { orderId, leaseToken, now }: { orderId: number; leaseToken: string; now: Date }) {
  await sql`update orders set attention = 'trade_not_found', next_poll_at = null, poll_lease_token = null, poll_lease_expires_at = null,
      last_polled_at = ${now}
    where id = ${orderId} and poll_lease_token = ${leaseToken}`.execute(db)
}
