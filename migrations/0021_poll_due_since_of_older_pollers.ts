import { type Kysely, sql } from 'kysely'

// orders.poll_due_since (migrations/0020) for the orders a poller of a build before 0020 holds or backs off: those it
// held or backed off when 0020 ran, and those it claims beside this build during a rolling upgrade. Such a poller
// writes next_poll_at (its lease's end, its backoff's) and neither poll_due_since nor poll_retry_at, so the due gauges
// (countDueOrders, src/orders/poll-schedule.repository.ts) missed every order it held or backed off, and counted one
// from its backoff's end, then kept that time at this build's next claim. Measured with the build before 0020 polling a
// platform that held every GET beside this build's /metrics, 7 orders due: 0 to 4 of them counted, 0 while its cycle
// held them all, and the oldest 31 s when it had been due about 230 s (README, Upgrading).
//
// The backfill: an order held (a live lease, next_poll_at its end) or backing off (no live lease, poll_attempts > 0,
// next_poll_at later than now and no more than an hour on, the longest backoff a failed poll writes: a later time is a
// webhook's or an API call's; and updated_at no later than next_poll_at less half the backoff of its
// poll_attempts-th failure, below) with no poll_due_since is due from the latest time it can have come due by its
// columns:
// - held: now(). It came due before its claim, and the claim was before now; the lease's length is the claiming
//   replica's setting, not in the row, so its end says nothing of when it began;
// - backing off: now(), or earlier, next_poll_at less half the backoff of its poll_attempts-th failure (30 s doubling,
//   at most an hour, half of it fixed: src/reconcile/backoff-delay.ts, the poller's DEFAULT_BACKOFF, unchanged since
//   the first poller and written out here since a migration never changes): the failed poll was written back at least
//   that long before its retry, and claimed, and due, before that. A Retry-After only made the wait longer.
// poll_retry_at takes next_poll_at, so the order counts until a poll of it is answered (a webhook, an API call or an
// operator that reschedules it since writes next_poll_at alone, and it is due by that time, as for this build's own).
// poll_attempts goes back to 0 only when a poll is answered, so an order a webhook or an API call rescheduled after a
// failed poll (a `cancelled` webhook: EXPECTED_WEBHOOK_S on) has the columns of one backing off. updated_at tells most
// of them apart: an older build's claim and failed poll's write-back never write it, while a webhook or an API call
// does (apply-observation.ts, schedulePollAfterApiCall, markTradeCreated: the write's time, next_poll_at that time
// plus EXPECTED_WEBHOOK_S or STALE_AFTER_S), so a real backoff's updated_at is no later than its claim, which was at
// least half the backoff before next_poll_at. One rescheduled by less than half its backoff (after the 1st failure,
// 15 s; after the 7th, 960 s) still counts, from the same time, until a poll of it is answered; so does one
// `reconcile --requeue-open` gave a due time within the hour (it writes next_poll_at alone). The times are the
// writers' clocks: a poller's clock behind the database's, a webhook written back just before its write-back, leaves a
// real backoff uncounted, as before this migration.
//
// The trigger: a claim or a write-back of an older build (one that moves the lease token and writes neither column;
// this build's write poll_retry_at anew) is given the two columns this build's statements write, from the row as it
// was (the claim's dueSince, the backoff's or the given-back due time as poll_retry_at, a poll answered, an order
// flagged or requeued clearing both). Its WHEN is checked for each row an update names poll_lease_token in (the
// claim, the write-backs), and fails for this build's statements but where one writes the poll_retry_at the row
// already has: this build's failed poll's write-back (rescheduleAfterError) whose retry time is the lease's end (the
// claim's poll_retry_at). The function then runs for it and writes poll_retry_at = next_poll_at, the value the
// statement set anyway; where the order became terminal while the poll ran, it clears both (next_poll_at is none, and
// the order counts in neither case); where a webhook or an API call rescheduled it meanwhile, it clears poll_retry_at
// where the statement wrote the lease's end, and the order counts from next_poll_at in both cases.
/** Ids per statement of the backfill: 50,000 orders all backing off are written in well under a second. */
const BACKFILL_SLICE = 50_000

/** Half the backoff of the poll_attempts-th failure: the fixed half of its delay (DEFAULT_BACKOFF: 30 s doubling, 1 h). */
const HALF_BACKOFF = sql`least(3600, 30 * power(2, least(poll_attempts, 30) - 1)) / 2 * interval '1 second'`

export async function up(db: Kysely<unknown>): Promise<void> {
  // first, so no claim of an older poller commits between the backfill's read of the table and the trigger (creating
  // it takes a lock every update waits on until this transaction ends)
  await sql`
    create function orders_poll_due_since_of_older_pollers() returns trigger language plpgsql as $$
    begin
      if new.poll_lease_token is not null then
        -- a claim: when the order came due, kept from an earlier claim while that one's schedule stands
        new.poll_due_since := case when old.poll_due_since is not null and old.next_poll_at = old.poll_retry_at
          then least(old.poll_due_since, old.next_poll_at) else old.next_poll_at end;
        new.poll_retry_at := new.next_poll_at;
      elsif new.poll_attempts = 0 or new.next_poll_at is null then
        -- a poll answered, an order flagged or requeued, or its first claim given back untried (due at its due time)
        new.poll_due_since := null;
        new.poll_retry_at := null;
      elsif old.next_poll_at is not distinct from old.poll_lease_expires_at then
        -- a failed poll's backoff, or a claim given back untried: the poller's own schedule
        new.poll_retry_at := new.next_poll_at;
      else
        -- a webhook or an API call rescheduled the order while its poll ran: it is due by that time
        new.poll_retry_at := null;
      end if;
      return new;
    end $$`.execute(db)
  await sql`
    create trigger orders_poll_due_since_of_older_pollers
    before update of poll_lease_token on orders
    for each row
    when (new.poll_lease_token is distinct from old.poll_lease_token
      and new.poll_retry_at is not distinct from old.poll_retry_at
      and new.poll_due_since is not distinct from old.poll_due_since)
    execute function orders_poll_due_since_of_older_pollers()`.execute(db)
  // in slices of ids, each its own statement, which keeps each statement short (harmless: all of them run in the
  // migrations' one transaction, on a connection with no statement or answer timeout, db/migrate.ts). Measured over a
  // million orders backing off (a platform outage at the upgrade), 20 to 30 s in all (three runs)
  const { rows } = await sql<{ first: number | null; last: number | null }>`select min(id) as first, max(id) as last from orders`.execute(db)
  const { first, last } = rows[0]!
  if (first === null || last === null) return
  for (let from = first; from <= last; from += BACKFILL_SLICE) {
    await sql`
      update orders
      set poll_due_since = case when poll_lease_token is not null then now()
            else least(now(), next_poll_at - ${HALF_BACKOFF}) end,
          poll_retry_at = next_poll_at
      where id >= ${from}::bigint and id < ${from + BACKFILL_SLICE}::bigint
        and poll_due_since is null and next_poll_at > now() and trade_id is not null and not is_terminal
        and ((poll_lease_token is not null and poll_lease_expires_at > now() and next_poll_at = poll_lease_expires_at)
          or (poll_lease_token is null and poll_attempts > 0 and next_poll_at <= now() + interval '1 hour'
            and updated_at <= next_poll_at - ${HALF_BACKOFF}))`.execute(db)
  }
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`drop trigger orders_poll_due_since_of_older_pollers on orders`.execute(db)
  await sql`drop function orders_poll_due_since_of_older_pollers()`.execute(db)
}
