// The poll schedule: every query on the orders table's poll columns (next_poll_at, the poll lease,
// poll_attempts, last_polled_at, attention). The poller (src/reconcile) decides when; this file is how.
// The one other writer of next_poll_at is the observation statement (apply-observation.ts), which
// reschedules an order and clears the lease in the same statement that applies what a poll saw.
//
// The claim: the one statement that hands a replica its share of the poll work.
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
//
// The environment: an order linked under the other PARTNER_ENV (orders.partner_env, migrations/0018) is not claimed,
// polled nor flagged: its trade is on the other platform, which answered 404 for every sandbox order once a partner
// went live on the same database, and each was flagged trade_not_found for good. It stays as it is, due, and the
// claim takes it again when the service runs in its environment again. A filter, not an index column: partner_env is
// written once with the link, and the other environment's due orders are only read past, at the head of the index,
// by each claim (they are also counted apart, countOtherEnvironmentDue, so an operator sees them).
//
// Every write-back names the lease token of the claim it finishes: a replica whose lease ran out, and
// whose order another replica claimed since, changes nothing.
//
// A claim holds no row lock while its polls run: a webhook, an API call or an operator may change the order
// meanwhile. A write-back that knows nothing newer than the claim (a failed poll, a claim given back untried)
// therefore leaves a terminal order off the schedule, and keeps any next_poll_at written since the claim (it is
// no longer the lease's end), earlier or later: that writer knew more than the claim did. Without this, a poll
// that timed out while a `released` webhook came made the terminal order due for good (a false
// PartnerEscrowOldestDueOrderLate, and a row in orders_due_idx that never leaves; an outside attack).
import { type ExpressionBuilder, type Kysely, type RawBuilder, sql, type Transaction } from 'kysely'
import type { PartnerEnv } from '../config.js'
import type { Database } from '../db/database.js'
import { writeTime, writeTimePlus } from '../db/write-time.js'

export interface ClaimedOrder {
  orderId: number
  externalReference: string
  tradeId: string
  tradeStatus: string | null
  /** The order's version when claimed: its poll's answer is judged against it (Observation.askedAtVersion). */
  version: number
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
  /** PARTNER_ENV the poll runs under: orders linked under the other one are left (absent: sandbox, its default). */
  partnerEnv?: PartnerEnv | undefined
}

/** An order of `partnerEnv`'s platform: linked under it, or before orders.partner_env (null: the service's own). */
function ofEnvironment(eb: ExpressionBuilder<Database, 'orders'>, partnerEnv: PartnerEnv = 'sandbox') {
  return eb.or([eb('partnerEnv', 'is', null), eb('partnerEnv', '=', partnerEnv)])
}

/**
 * When an order came due for the poll it waits on (migrations/0020): poll_due_since while next_poll_at is still the
 * time the poller wrote itself (poll_retry_at: a lease's end, a backoff's), else next_poll_at. A claim moves
 * next_poll_at to its lease's end and a failed poll to its backoff's: from next_poll_at alone, an order a cycle held or
 * one backing off after the platform failed was not due, and the oldest due order's age read 0 through a platform
 * outage. A webhook, an API call or an operator that reschedules the order writes next_poll_at alone, and the order is
 * due by that time again.
 */
function dueSince(): RawBuilder<Date> {
  return sql<Date>`case when orders.poll_due_since is not null and orders.next_poll_at = orders.poll_retry_at
    then least(orders.poll_due_since, orders.next_poll_at) else orders.next_poll_at end`
}

export async function claimDueOrders(db: Kysely<Database>, options: ClaimOptions): Promise<ClaimedOrder[]> {
  const rows = await claimDueOrdersQuery(db, options).execute()
  return rows
    .map((row) => ({
      orderId: row.id,
      externalReference: row.externalReference,
      tradeId: row.tradeId!,
      tradeStatus: row.tradeStatus,
      version: row.version,
      pollAttempts: row.pollAttempts,
      dueAt: new Date(row.dueAt!),
    }))
    .sort((a, b) => a.dueAt.getTime() - b.dueAt.getTime() || a.orderId - b.orderId)
}

/** The statement itself, unexecuted: what a plan check (EXPLAIN) compiles. */
export function claimDueOrdersQuery(db: Kysely<Database>, { now, limit, leaseS, leaseToken, partnerEnv }: ClaimOptions) {
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
            // the other environment's orders are left where they are (see the top of this file)
            .where((eb) => ofEnvironment(eb, partnerEnv))
            // an observation may bring next_poll_at forward while a poll holds the lease (a webhook
            // reschedules the order): a live lease is still its claim's alone
            .where((eb) => eb.or([eb('pollLeaseExpiresAt', 'is', null), eb('pollLeaseExpiresAt', '<=', now)]))
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
        // when the order came due: kept from an earlier claim while that one's schedule stands (see dueSince)
        pollDueSince: dueSince(),
        pollRetryAt: leaseEnd,
      }))
      .whereRef('orders.id', '=', 'due.id')
      .returning([
        'orders.id',
        'orders.externalReference',
        'orders.tradeId',
        'orders.tradeStatus',
        'orders.version',
        'orders.pollAttempts',
        'due.nextPollAt as dueAt',
      ])
  )
}

/**
 * Why an order is waiting for an operator instead of being polled (orders.attention): trade_not_found, the
 * platform answered 404 for its trade; trade_mismatch, it answered a record of another trade or of another
 * order (an external_reference other than the order's). Polling again would get the same answer either way.
 * trade_create_unknown: its trade create got no answer (the process died at the platform, or it timed out) and no
 * webhook has linked a trade within EXPECTED_WEBHOOK_S: without a trade id there is nothing to poll.
 * unusable_trade_id: its stored trade id is one the client refuses in a request's path ("..", ".", blank; stored
 * by a version that did not refuse it): no GET can be sent for it, and none is (the CLI's [unusable_trade_id]).
 */
export const TRADE_NOT_FOUND = 'trade_not_found'
export const TRADE_MISMATCH = 'trade_mismatch'
export const TRADE_CREATE_UNKNOWN = 'trade_create_unknown'
export const UNUSABLE_TRADE_ID = 'unusable_trade_id'
export type AttentionFlag =
  | typeof TRADE_NOT_FOUND
  | typeof TRADE_MISMATCH
  | typeof TRADE_CREATE_UNKNOWN
  | typeof UNUSABLE_TRADE_ID
/** Every flag, for those that list them all (the orders_needing_attention gauge has a sample for each). */
export const ATTENTION_FLAGS: readonly AttentionFlag[] = [TRADE_NOT_FOUND, TRADE_MISMATCH, TRADE_CREATE_UNKNOWN, UNUSABLE_TRADE_ID]

/**
 * Flags `trade_create_unknown` the orders whose trade create has gone unanswered, with no trade linked, for more than
 * `unresolvedAfterS` (migrations/0013's index); a create still `pending` only once its command's call is over
 * whatever it got: the whole time that command stored with its mark (trade_create_wait_ms), or
 * `createWholeTimeMs` (this process's) for a mark written before that column. Both are judged by the database's clock,
 * the one the mark is stamped with (startTradeCreate, setTradeCreateState), never this process's. Returns their
 * references. A webhook or a poll that links a trade, and a create sent again, clear the flag (apply-observation.ts,
 * startTradeCreate).
 *
 * updated_at is left as it was: on a pending create it is the mark its command's own later write names
 * (setTradeCreateState's claim), and the time `trades open` tells an operator the create began. With
 * EXPECTED_WEBHOOK_S under PARTNER_API_TIMEOUT_MS the flag came while the call was at the platform and moved that
 * mark: a create the platform then refused stayed `pending` and flagged, where it was back to `none`, and the next
 * `trades open` called it unanswered (an outside attack).
 */
export async function flagUnresolvedCreates(
  db: Kysely<Database>,
  { unresolvedAfterS, createWholeTimeMs }: { unresolvedAfterS: number; createWholeTimeMs: number },
): Promise<string[]> {
  const rows = await db
    .updateTable('orders')
    .set({ attention: TRADE_CREATE_UNKNOWN })
    .where('tradeCreateState', 'in', ['pending', 'unknown'])
    .where('tradeId', 'is', null)
    .where('attention', 'is', null)
    .where('updatedAt', '<', sql<Date>`now() - ${unresolvedAfterS}::double precision * interval '1 second'`)
    .where((eb) =>
      eb.or([
        eb('tradeCreateState', '=', 'unknown'),
        eb(
          sql<Date>`${eb.ref('updatedAt')} + abs(coalesce(${eb.ref('tradeCreateWaitMs')}, ${createWholeTimeMs}::integer)) * interval '1 millisecond'`,
          '<',
          sql<Date>`now()`,
        ),
      ]),
    )
    .returning('externalReference')
    .execute()
  return rows.map((row) => row.externalReference)
}

export interface LeaseRef {
  orderId: number
  leaseToken: string
}

/**
 * The next_poll_at a write-back that learned nothing of the order leaves: none for a terminal order, the time
 * written since the claim if any (see the top of this file), else `fallback`.
 */
function scheduleUnlessChanged(fallback: RawBuilder<Date>): RawBuilder<Date | null> {
  return sql<Date | null>`case
    when orders.is_terminal then null
    when orders.next_poll_at is distinct from orders.poll_lease_expires_at then orders.next_poll_at
    else ${fallback} end`
}

/**
 * A failed poll: the order is tried again at `nextPollAt`, unless it became terminal or was rescheduled while the
 * poll ran (a webhook or an API call: that schedule stands). False when the lease was lost.
 */
export async function rescheduleAfterError(
  db: Kysely<Database>,
  { orderId, leaseToken, nextPollAt }: LeaseRef & { nextPollAt: Date },
): Promise<boolean> {
  const result = await db
    .updateTable('orders')
    .set({
      nextPollAt: scheduleUnlessChanged(sql<Date>`${nextPollAt}::timestamptz`),
      // the backoff is the poller's own schedule: the order stays due from when it came due (a time written since the
      // claim, kept above, is not, and the order is due by that time)
      pollRetryAt: nextPollAt,
      pollLeaseToken: null,
      pollLeaseExpiresAt: null,
    })
    .where('id', '=', orderId)
    .where('pollLeaseToken', '=', leaseToken)
    .executeTakeFirst()
  return result.numUpdatedRows > 0n
}

/**
 * A poll whose answer polling again would not change (a 404, a record of another trade or order, or a trade id no
 * request can carry): the order leaves the poll schedule and is flagged for an operator (see requeueOrders). False
 * when the lease was lost: a replica whose claim ran out writes nothing.
 */
export async function flagForOperator(
  db: Kysely<Database>,
  { orderId, leaseToken, now, attention, sent = true }: LeaseRef & { now: Date; attention: AttentionFlag; sent?: boolean },
): Promise<boolean> {
  const result = await db
    .updateTable('orders')
    .set((eb) => ({
      attention,
      nextPollAt: null,
      pollLeaseToken: null,
      pollLeaseExpiresAt: null,
      pollDueSince: null,
      pollRetryAt: null,
      // `sent: false`, no request went out (unusable_trade_id): the claim's count of an attempt is taken back, and the
      // order was not polled (the console said "1 failed attempts" for it)
      ...(sent ? { lastPolledAt: now } : { pollAttempts: eb('pollAttempts', '-', 1) }),
    }))
    .where('id', '=', orderId)
    .where('pollLeaseToken', '=', leaseToken)
    .executeTakeFirst()
  return result.numUpdatedRows > 0n
}

/**
 * An order whose trade create was answered with a trade other than the one it is linked to (the create was sent
 * again, and the first one's trade was linked meanwhile by its webhook or another command): a second trade may be
 * on the platform, and only an operator can say which one stands. Flagged as a poll answering another trade is,
 * off the poll schedule until requeued; there is no lease to name, the caller holds the order's row lock.
 */
export async function flagLinkedOrder(
  db: Kysely<Database> | Transaction<Database>,
  { orderId, now, attention }: { orderId: number; now: Date; attention: AttentionFlag },
): Promise<void> {
  await db
    .updateTable('orders')
    .set({ attention, nextPollAt: null, updatedAt: now })
    .where('id', '=', orderId)
    .where('tradeId', 'is not', null)
    .execute()
}

/**
 * Gives back claims that were never polled (the cycle stopped): each order is due again at the time it
 * was due before the claim (unless it became terminal or was rescheduled since the claim: see the top of this
 * file), and the attempt the claim counted is taken back.
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
    set next_poll_at = ${scheduleUnlessChanged(sql<Date>`released.due_at`)},
        poll_retry_at = released.due_at,
        poll_lease_token = null,
        poll_lease_expires_at = null,
        poll_attempts = greatest(orders.poll_attempts - 1, 0)
    from unnest(${ids}::integer[], ${dueTimes}::timestamptz[]) as released(id, due_at)
    where orders.id = released.id and orders.poll_lease_token = ${leaseToken}
  `.execute(db)
  return Number(result.numAffectedRows ?? 0n)
}

/**
 * After an API call: the order expects a webhook; poll `pollAfterS` (EXPECTED_WEBHOOK_S) on if none moved it first. A
 * poll already due stays due: the call's answer asked for it (an answer the order had moved past,
 * apply-observation.ts), or the order was waiting for one anyway. "Now" is `now`, the caller's clock, or the
 * database's time when that is earlier (db/write-time.ts): by the clock of a machine an hour ahead of the database,
 * the poll came an hour late, and one due within that hour was taken for due already and left.
 */
export async function schedulePollAfterApiCall(db: Kysely<Database>, orderId: number, { pollAfterS, now }: { pollAfterS: number; now: Date }): Promise<void> {
  const at = writeTime(now)
  await db
    .updateTable('orders')
    .set({ nextPollAt: sql<Date>`case when next_poll_at <= ${at} then next_poll_at else ${writeTimePlus(pollAfterS, now)} end`, updatedAt: at })
    .where('id', '=', orderId)
    .where('tradeId', 'is not', null)
    .where('isTerminal', '=', false)
    .execute()
}

export interface DueOrderStats {
  /**
   * Orders whose poll has come due and has not been answered: waiting for a claim, held by a cycle under way (or by
   * one whose replica died, until its lease runs out), or waiting out the backoff of a failed poll.
   */
  ordersDue: number
  /** Seconds since the longest-waiting of them came due (dueSince); 0 when none is due. */
  oldestDueAgeS: number
}

/** The orders a claim may take, whatever their next poll: a trade to poll, not terminal. */
function pollableOrders(db: Kysely<Database>) {
  return db.selectFrom('orders').where('tradeId', 'is not', null).where('isTerminal', '=', false)
}

/**
 * The orders due at `now`, in the partial index orders_due_idx: the counts below filter them further. As the claim:
 * an order it would never take is not due, whatever a broken invariant left in next_poll_at.
 */
function dueOrders(db: Kysely<Database>, now: Date) {
  return pollableOrders(db).where('nextPollAt', '<=', now)
}

/**
 * The most orders the poller gauges and the console count as due: past it they read this many. Through an outage of
 * the platform every open order comes to be held or backing off, and a count of them all read 1,000,000 rows at every
 * scrape (360 ms on Postgres, found by an outside review), toward the scrape's 2-s read limit, past which the gauges
 * went missing and the alert on them with them.
 */
export const DUE_COUNT_CAP = 10_000

/**
 * One query over the partial indexes orders_due_idx and orders_poll_due_since_idx: what the poller metrics report,
 * every order whose poll came due and has not been answered (up to DUE_COUNT_CAP), and the age of the one that came
 * due first (dueSince), so an order a cycle holds or one backing off after a failed poll counts from then. Read from
 * next_poll_at alone, the oldest due order's age read 0 at a scrape while a cycle held every due order, and through
 * the backoffs of a platform outage, and PartnerEscrowOldestDueOrderLate flapped through a long one. The oldest is the
 * first entry of each index that qualifies (the earlier of the two), not a minimum over every due order, so its cost
 * does not grow with them. The other environment's orders are not counted (PARTNER_ENV `partnerEnv`, absent:
 * sandbox): no claim takes them, and they would have made the oldest due order late for good once a partner went live.
 */
export async function countDueOrders(db: Kysely<Database>, now: Date, partnerEnv?: PartnerEnv): Promise<DueOrderStats> {
  const row = await countDueOrdersQuery(db, now, partnerEnv).executeTakeFirstOrThrow()
  const firsts = [row.firstWaiting, row.firstHeld].filter((at) => at !== null).map((at) => new Date(at).getTime())
  const oldest = firsts.length > 0 ? Math.min(...firsts) : undefined
  return {
    ordersDue: Number(row.due),
    oldestDueAgeS: oldest === undefined ? 0 : Math.max(0, (now.getTime() - oldest) / 1000),
  }
}

/** countDueOrders' statement, unexecuted: what a plan check (EXPLAIN) compiles. */
export function countDueOrdersQuery(db: Kysely<Database>, now: Date, partnerEnv?: PartnerEnv) {
  // held or backing off: next_poll_at is the poller's own (lease, backoff), the due time in poll_due_since
  const held = (eb: ExpressionBuilder<Database, 'orders'>) =>
    eb.and([eb('pollDueSince', '<=', now), eb('nextPollAt', 'is not', null), eb(eb.ref('nextPollAt'), '=', eb.ref('pollRetryAt'))])
  const due = pollableOrders(db)
    .where((eb) => eb.or([eb('nextPollAt', '<=', now), held(eb)]))
    .where((eb) => ofEnvironment(eb, partnerEnv))
  return db.selectNoFrom((eb) => [
    eb
      .selectFrom(due.select(sql<number>`1`.as('one')).limit(DUE_COUNT_CAP).as('capped'))
      .select(eb.fn.countAll<string>().as('n'))
      .as('due'),
    // an order both waiting and held came due at the earlier of its two times (dueSince): each is a candidate
    dueOrders(db, now)
      .where((eb) => ofEnvironment(eb, partnerEnv))
      .select('nextPollAt')
      .orderBy('nextPollAt')
      .limit(1)
      .as('firstWaiting'),
    pollableOrders(db)
      .where(held)
      .where((eb) => ofEnvironment(eb, partnerEnv))
      .select('pollDueSince')
      .orderBy('pollDueSince')
      .limit(1)
      .as('firstHeld'),
  ])
}

/**
 * The due orders no claim under `partnerEnv` takes: linked under the other PARTNER_ENV, left as they are until the
 * service runs in theirs again (README, "Going live").
 */
export async function countOtherEnvironmentDue(db: Kysely<Database>, now: Date, partnerEnv: PartnerEnv): Promise<number> {
  const row = await dueOrders(db, now)
    .select((eb) => eb.fn.countAll<string>().as('due'))
    .where('partnerEnv', '<>', partnerEnv)
    .executeTakeFirstOrThrow()
  return Number(row.due)
}

/**
 * The orders of `partnerEnv` another poller's claim holds at `now` and no claim takes before its lease ends: a cycle
 * under way, or one whose process stopped mid-cycle (killed, its host lost). Those due by the lease's end only (a
 * webhook may have put one's poll later meanwhile); `until`, the latest lease's end, when all of them are due again.
 * Not on a due index: a one-off command's count, over the orders that have a next poll. (partnerEnv absent: sandbox, as
 * the claim's.)
 */
export async function countLeasedDue(db: Kysely<Database>, now: Date, partnerEnv?: PartnerEnv): Promise<{ due: number; until: Date | null }> {
  const row = await pollableOrders(db)
    .select((eb) => [eb.fn.countAll<string>().as('due'), eb.fn.max('pollLeaseExpiresAt').as('until')])
    .where('nextPollAt', 'is not', null)
    .where('pollLeaseExpiresAt', '>', now)
    .whereRef('nextPollAt', '<=', 'pollLeaseExpiresAt')
    .where((eb) => ofEnvironment(eb, partnerEnv))
    .executeTakeFirstOrThrow()
  return { due: Number(row.due), until: row.until === null ? null : new Date(row.until) }
}

export interface RequeueResult {
  externalReference: string
  /** requeued: due now; not_pollable: no trade id or a terminal status, so there is nothing to poll. */
  outcome: 'requeued' | 'not_pollable'
  previousAttention: string | null
  /** The PARTNER_ENV the order was linked under (orders.partner_env): only a poller of that one polls it. */
  partnerEnv: PartnerEnv | null
}

/** References or ids per statement of a requeue by name: well under a statement's 65,535 parameters. */
const REQUEUE_SLICE = 10_000

function* slices<T>(values: readonly T[], size: number): Generator<T[]> {
  for (let start = 0; start < values.length; start += size) yield values.slice(start, start + size)
}

/**
 * The operator's way out of `attention`: clears the flag and makes the order due now (if it has a trade
 * and is not terminal). With no references, every flagged order is requeued, whatever its flag: one whose
 * cause is not fixed is flagged again by its next poll (one GET), and one cause (a wrong PARTNER_ENV or base
 * URL) answers 404 for some trades and may answer another trade's record for others.
 * "Now" is the database's time, or `now` when that is earlier (db/write-time.ts): the console passes its replica's
 * clock, which its poller's claim compares due times with; a command passes none (`reconcile --requeue` from a
 * machine an hour ahead made the order due an hour later, while it said due now).
 */
export async function requeueOrders(
  db: Kysely<Database>,
  { externalReferences, now }: { externalReferences?: readonly string[]; now?: Date },
): Promise<RequeueResult[]> {
  if (externalReferences && externalReferences.length === 0) return []
  return db.transaction().execute(async (trx) => {
    const columns = ['id', 'externalReference', 'tradeId', 'isTerminal', 'attention', 'partnerEnv'] as const
    let orders: {
      id: number
      externalReference: string
      tradeId: string | null
      isTerminal: boolean
      attention: string | null
      partnerEnv: string | null
    }[]
    if (!externalReferences) {
      orders = await trx.selectFrom('orders').select(columns).where('attention', 'is not', null).orderBy('id').forUpdate().execute()
    } else {
      // A statement takes at most 65,535 parameters: 70,001 references in one `in` list failed as "connection
      // exception, try again later", which no later try could pass. So the ids are found a slice of references at
      // a time, then locked a slice of ids at a time in the order of their ids, as one list would lock them (two
      // requeues of overlapping lists wait for each other instead of deadlocking)
      const ids: number[] = []
      for (const slice of slices(externalReferences, REQUEUE_SLICE)) {
        const rows = await trx.selectFrom('orders').select('id').where('externalReference', 'in', slice).execute()
        for (const { id } of rows) ids.push(id)
      }
      ids.sort((a, b) => a - b)
      orders = []
      for (const slice of slices(ids, REQUEUE_SLICE)) {
        orders.push(...(await trx.selectFrom('orders').select(columns).where('id', 'in', slice).orderBy('id').forUpdate().execute()))
      }
    }
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
          pollDueSince: null,
          pollRetryAt: null,
          ...(pollable ? { nextPollAt: writeTime(now) } : {}),
        })
        .where('id', '=', order.id)
        .execute()
      results.push({
        externalReference: order.externalReference,
        outcome: pollable ? 'requeued' : 'not_pollable',
        previousAttention: order.attention,
        partnerEnv: order.partnerEnv as PartnerEnv | null,
      })
    }
    return results
  })
}

export interface OpenRequeueResult {
  /** Open orders of the environment given a due time within the window (none was due within it already). */
  requeued: number
  /** Open orders of the environment flagged for an operator: left as they are (`reconcile --requeue` clears them). */
  flagged: number
  /** The window's start, by the database's clock. */
  from: Date
  /** How many were to be requeued; more than `requeued` when `signal` stopped it between slices. */
  total: number
  /** True when `signal` stopped it after a slice: the slices before are committed, the rest left as they were. */
  stopped: boolean
}

/** Whether an open order of `partnerEnv`, not flagged and not held by a poll under way at `at`, waits past `until`. */
function waitsPast(partnerEnv: PartnerEnv, at: Date, until: Date) {
  return sql`o.trade_id is not null and not o.is_terminal and o.attention is null
    and (o.partner_env is null or o.partner_env = ${partnerEnv})
    and (o.next_poll_at is null or o.next_poll_at > ${until})
    and (o.poll_lease_expires_at is null or o.poll_lease_expires_at <= ${at})`
}

/**
 * Gives every open order of `partnerEnv` that waits for its poll past the next `withinS` seconds a due time within
 * them, spread evenly in the order of their ids (`reconcile --requeue-open`): linked to a trade, not terminal, not
 * flagged, not held by a poll under way. After the database was restored from a backup or failed over to a standby
 * that lagged, the transitions it lost are on the platform only, and the orders would have waited up to STALE_AFTER_S
 * for their poll. Spread, not all due at once: the claim takes the longest due first, and a million orders due at
 * one moment would have kept every order due after it (a webhook that asks for a poll now, a hold lifted) waiting
 * behind them all. Times are the database's (the command may run on a machine whose clock is off: found by a
 * review). In slices of REQUEUE_SLICE orders, each its own transaction: a million do not hold the ingest's row locks
 * for one long statement, and a run with nothing to do locks nothing.
 */
export async function requeueOpenOrders(
  db: Kysely<Database>,
  { withinS, partnerEnv, signal }: { withinS: number; partnerEnv: PartnerEnv; signal?: AbortSignal },
): Promise<OpenRequeueResult> {
  const { rows } = await sql<{ from: Date }>`select statement_timestamp() as "from"`.execute(db)
  const from = rows[0]!.from
  const until = new Date(from.getTime() + withinS * 1000)
  const counted = await sql<{ n: string }>`select count(*) as n from orders o where ${waitsPast(partnerEnv, from, until)}`.execute(db)
  const total = Number(counted.rows[0]!.n)
  let requeued = 0
  let after = 0
  let stopped = false
  while (requeued < total) {
    // each slice is a statement of its own, committed: a stop asked for ends it between two
    if (signal?.aborted) {
      stopped = true
      break
    }
    // each order's place among all of them (its offset in the window), so the slices together spread evenly
    const { rows: moved } = await sql<{ id: number }>`
      with locked as (
        select o.id from orders o
        where o.id > ${after} and ${waitsPast(partnerEnv, from, until)}
        order by o.id limit ${REQUEUE_SLICE} for update
      ),
      slice as (select id, ${requeued}::bigint + row_number() over (order by id) - 1 as place from locked)
      update orders o set next_poll_at = ${from}::timestamptz + make_interval(secs => ${withinS}::double precision * s.place / ${total}::bigint)
      from slice s where o.id = s.id
      returning o.id`.execute(db)
    if (moved.length === 0) break
    requeued += moved.length
    after = Math.max(...moved.map((row) => row.id))
  }
  const flagged = await db
    .selectFrom('orders')
    .select((eb) => eb.fn.countAll<string>().as('flagged'))
    .where('tradeId', 'is not', null)
    .where('isTerminal', '=', false)
    .where('attention', 'is not', null)
    .where((eb) => ofEnvironment(eb, partnerEnv))
    .executeTakeFirstOrThrow()
  return { requeued, flagged: Number(flagged.flagged), from, total, stopped }
}
