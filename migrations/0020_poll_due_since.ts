import { type Kysely, sql } from 'kysely'

// orders.poll_due_since and orders.poll_retry_at: when the poll an order waits on came due, kept while the poller
// holds it or backs it off, so the due gauges (countDueOrders, src/orders/poll-schedule.repository.ts) count the order
// from then. A claim moves next_poll_at to its lease's end, and a failed poll to the end of its backoff: read from
// next_poll_at alone, every due order claimed by a cycle under way, and every one backing off after the platform
// failed, was not due, so poller_oldest_due_age_seconds read 0 at a scrape during a cycle and through the backoffs of
// a platform outage, and PartnerEscrowOldestDueOrderLate flapped through a long outage (found by a review of an
// on-call night).
//
// poll_due_since is written by the claim (the time the order came due, kept from an earlier claim while that one's
// schedule still stands) and cleared by a poll's answer; poll_retry_at is the next_poll_at the poller wrote itself
// (the lease's end, the backoff's, the due time a claim given back untried returns to). poll_due_since counts only
// while next_poll_at is still poll_retry_at: a webhook, an API call or an operator that reschedules the order writes
// next_poll_at alone, and the order is due by that time again, whichever writer it was.
//
// Nullable, no default: a catalog change only, no rewrite of the table. The partial index holds the orders the
// poller holds or backs off (and, until their next claim, those a webhook rescheduled after a failed poll): a poll's
// answer clears poll_due_since, and an order off the schedule (next_poll_at null: terminal, flagged) leaves it. It is
// small while the platform answers; through an outage of the platform it holds every open order, and a scrape reads
// only its first entry and counts at most DUE_COUNT_CAP of them (src/orders/poll-schedule.repository.ts).
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('orders').addColumn('poll_due_since', 'timestamptz').addColumn('poll_retry_at', 'timestamptz').execute()
  await db.schema
    .createIndex('orders_poll_due_since_idx')
    .on('orders')
    .column('poll_due_since')
    .where(sql<boolean>`poll_due_since is not null and next_poll_at is not null`)
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropIndex('orders_poll_due_since_idx').execute()
  await db.schema.alterTable('orders').dropColumn('poll_due_since').dropColumn('poll_retry_at').execute()
}
