// Applying an observed trade status to the partner's order: ONE statement, whatever the source.
//
// Webhooks, polls, API answers and parked deliveries all go through `observationStatement`, so the
// rank rules cannot diverge. The statement locks the order row (FOR UPDATE: concurrent observations
// of one order queue on it and each decides on the row as the previous one left it), decides the
// outcome in SQL with the same table as decideTransition() in trade-status.ts, updates the order,
// appends the history row and, for a webhook, records the delivery: all in one round trip.
//
// The statement takes a set of observations (one JSON parameter), so concurrent webhook deliveries
// share one statement and one commit (the group commit in webhooks/group-commit.ts); a poll or an API
// answer is a set of one.
//
// Reactions (the transactional outbox): the history row of an applied transition IS the event (a stable
// event_id, the order's sequence = its version after the move, its place in the handlers' streams). So a
// transition and its event commit together or not at all; each handler reads the events from the history
// (src/reactions/reaction-stream.repository.ts), and the statement writes nothing else for them. The dispatchers are woken by pg_notify('reaction_jobs'): inside an outer transaction the
// statement calls it itself (delivered when that transaction commits); on its own (its own transaction,
// the webhook ingest and every other hot path) the settings' onJobsEnqueued runs right after the commit
// (the service wakes its own dispatcher at once and sends the NOTIFY for the other replicas), or else
// the NOTIFY is sent right after the commit, in a statement of its own, coalesced: a NOTIFY in a committing transaction holds Postgres's notification lock through the
// commit's WAL flush, which serializes every such commit (measured: 5 concurrent writers committing 20
// rows each, 350-420 commits/s with the NOTIFY inside against 630-790 without or with it after).
//
// Deduplication: a delivery is its id AND its body (SHA-256 of the exact bytes). A webhook's delivery
// row is inserted ON CONFLICT (delivery_id, body_sha256) DO NOTHING, and the order update and history
// insert only happen when that insert did. Two replicas receiving the same delivery at once: one
// inserts and applies, the other's insert conflicts and changes nothing. The same id with another body
// is a new delivery (a reused id): stored, applied by the status rules, and reported as `reused` when
// a row with that id and another body was already committed when the statement began.
import { type CompiledQuery, type Kysely, type RawBuilder, sql, type Transaction } from 'kysely'
import type { PartnerEnv } from '../config.js'
import type { Database } from '../db/database.js'
import { PREPARED } from '../db/open-database.js'
import { reactionChannelSql } from '../db/reaction-channel.js'
import type { ObservationSource } from './order.js'
import { isTerminalStatus, pollAfterS, statusRank, TRADE_STATUSES } from './trade-status.js'

export type ObservationTarget = { externalReference: string } | { orderId: number; leaseToken?: string }

export interface Observation {
  target: ObservationTarget
  tradeId: string
  tradeReference?: string | null
  externalReference?: string | null
  status: string
  source: ObservationSource
  deliveryId?: string | null
  observedAt: Date
  /**
   * A poll's or an API call's: the order's version when the request was sent. An answer the order moved past
   * while it was on its way (a webhook applied meanwhile) is stale wherever the rank order cannot place it (an
   * unknown status, or a return from one), and asks for a poll now, whose answer can: an old `on_hold` moved an
   * order back past a `delivered` webhook, and the handlers were given a second `trade.delivered`.
   */
  askedAtVersion?: number
}

export interface ObservationSettings {
  /** After any observation a non-terminal order is polled again this many seconds later. */
  staleAfterS: number
  /**
   * After a move to a status the platform follows on its own (cancelled), this many seconds instead, if shorter
   * (trade-status.ts pollAfterS); absent, STALE_AFTER_S there too.
   */
  expectedWebhookS?: number | undefined
  /**
   * The names of the reaction handlers registered for an event type ('trade.<status>'): when there are any,
   * the dispatchers are woken after the commit. Only the names matter here (the registry's handlersFor).
   */
  handlersFor: (type: string) => readonly string[]
  /**
   * ORDER_REFERENCE_PATTERN (whole-reference): a webhook for a reference it does not match, with no order, is
   * stored `dismissed`, not parked. Absent: every reference may be an order's.
   */
  referencePattern?: RegExp
  /**
   * Called right after a statement that is its own transaction committed events a handler takes: what wakes the dispatchers
   * (the service wakes its own directly and NOTIFYs the other replicas). Absent: a NOTIFY after the commit.
   */
  onJobsEnqueued?: () => void
  /**
   * PARTNER_ENV of the service or command applying the observation: written on an order as it is first linked to a
   * trade (orders.partner_env), and an order linked under the other one is not moved (trade_mismatch). Absent: sandbox,
   * PARTNER_ENV's default.
   */
  partnerEnv?: PartnerEnv
}

/** Routing for a service without reaction handlers (and for tests of the status rules alone). */
export const NO_REACTION_HANDLERS: ObservationSettings['handlersFor'] = () => []

/**
 * applied: the order moved. duplicate_effect: it already had this status. stale: a lower rank, a
 * status the order had before, a change to a terminal order, or a poll's or API call's answer of an unknown
 * status (or of a return from one) sent before the order's last move (Observation.askedAtVersion). unknown_status: a webhook named a
 * status the table does not know: the order is not moved but polled at once. unmatched: no such
 * order (yet). lease_lost: a poll whose claim expired and was taken by another replica.
 * trade_mismatch: the order is linked to another trade, or the record observed names another external
 * reference than the order's (a poll or an API call answered a record of another order), or its trade is
 * already linked to another order, or the order was linked under the other PARTNER_ENV (orders.partner_env): a
 * record of the other platform's trade. The order row is left as it was, a poll's lease included: the poller
 * flags the order under that lease.
 */
export type ObservationOutcome =
  | 'applied'
  | 'duplicate_effect'
  | 'stale'
  | 'unknown_status'
  | 'unmatched'
  | 'lease_lost'
  | 'trade_mismatch'

export interface ObservationResult {
  outcome: ObservationOutcome
  orderId: number | null
  fromStatus: string | null
  toStatus: string | null
}

/** A webhook to record with the observation; absent for polls, API answers and parked deliveries. */
export interface DeliveryRecord {
  deliveryId: string
  eventType: string
  /** The exact body received, as text (verified UTF-8, byte-order mark kept). */
  rawBody: string
  /** SHA-256 (hex) of the exact bytes received: with the delivery id, what makes a delivery unique. */
  bodySha256: string
}

type Executor = Kysely<Database> | Transaction<Database>

export async function applyObservation(
  db: Executor,
  observation: Observation,
  settings: ObservationSettings,
): Promise<ObservationResult> {
  const [row] = await runStatement(db, [{ observation }], settings)
  return toResult(row, observation)
}

/** A webhook delivery with the observation it carries, for recordDeliveriesAndApply. */
export interface DeliveryObservation {
  delivery: DeliveryRecord
  observation: Observation & { target: { externalReference: string } }
}

/**
 * A stored delivery's effect; idReused: its id was already stored with another body. `dismissed`: no order has
 * its reference, which ORDER_REFERENCE_PATTERN says is not this backend's (it is not parked).
 */
export type DeliveryResult = Omit<ObservationResult, 'outcome'> & { outcome: ObservationOutcome | 'dismissed'; idReused: boolean }

/** Whether `externalReference` is one ORDER_REFERENCE_PATTERN says no order of this backend has. */
export function isForeignReference(settings: Pick<ObservationSettings, 'referencePattern'>, externalReference: string): boolean {
  return settings.referencePattern !== undefined && !settings.referencePattern.test(externalReference)
}

/**
 * Records webhook deliveries and applies their observations, all in one statement (a group commit of
 * concurrent deliveries). Each result is `duplicate` when the same delivery id with the same body was
 * stored. The deliveries must name distinct orders and distinct delivery ids: one statement cannot
 * update a row twice, and a reused id is only told apart from a delivery stored before the statement.
 */
export async function recordDeliveriesAndApply(
  db: Executor,
  items: readonly DeliveryObservation[],
  settings: ObservationSettings,
): Promise<(DeliveryResult | 'duplicate' | 'replayed')[]> {
  if (items.length === 0) return []
  const foreign = items.map((item) => isForeignReference(settings, item.observation.target.externalReference))
  const rows = new Map((await runStatement(db, items, settings, foreign)).map((row) => [row.n, row]))
  return items.map((item, index) => {
    const row = rows.get(index)
    // never call a delivery a duplicate without the statement's word for it
    if (!row) throw new Error(`the ingest statement returned no row for delivery ${item.delivery.deliveryId}`)
    if (!row.inserted) return row.replayed ? 'replayed' : 'duplicate'
    const result = toResult(row, item.observation)
    // as the statement stored it: no order, and a reference that is not this backend's
    const outcome = result.outcome === 'unmatched' && foreign[index] ? 'dismissed' : result.outcome
    return { ...result, outcome, idReused: row.reused }
  })
}

interface StatementRow {
  n: number
  inserted: boolean
  /** Not stored: another id's delivery that changed nothing has this body (see the delivery insert). */
  replayed: boolean
  reused: boolean
  outcome: ObservationOutcome | null
  orderId: number | null
  fromStatus: string | null
}

/**
 * A coalesced notifier of the dispatchers: a NOTIFY asked for while one is on its way is sent once more
 * after it (so every commit is followed by a NOTIFY sent after it), however many were asked for. A lost
 * NOTIFY (the database away) only delays the dispatchers until their next look. `payload` says who sent
 * it (the service's own listener ignores its own: it woke its dispatcher directly).
 */
export function createDispatcherNotifier(db: Executor, payload = ''): () => void {
  let sending = false
  let again = false
  return () => {
    if (sending) {
      again = true
      return
    }
    sending = true
    void (async () => {
      do {
        again = false
        await sql`${sql.raw(PREPARED)} select pg_notify(${reactionChannelSql}, ${payload})`.execute(db).catch(() => {})
      } while (again)
      sending = false
    })()
  }
}

// without settings.onJobsEnqueued: one notifier per database handle
const notifiers = new WeakMap<object, () => void>()

function notifyDispatchersSoon(db: Executor): void {
  let notify = notifiers.get(db)
  if (!notify) {
    notify = createDispatcherNotifier(db)
    notifiers.set(db, notify)
  }
  notify()
}

function toResult(row: StatementRow | undefined, observation: Observation): ObservationResult {
  const leaseTarget = 'orderId' in observation.target && observation.target.leaseToken !== undefined
  const outcome = row?.outcome ?? (leaseTarget ? 'lease_lost' : 'unmatched')
  return {
    outcome,
    orderId: row?.orderId ?? null,
    fromStatus: row?.fromStatus ?? null,
    toStatus: outcome === 'applied' ? observation.status : (row?.fromStatus ?? null),
  }
}

type TargetKind = 'externalReference' | 'orderId' | 'lease'

function targetOf(target: ObservationTarget): { kind: TargetKind; key: string; lease: string | null } {
  if ('externalReference' in target) return { kind: 'externalReference', key: target.externalReference, lease: null }
  if (target.leaseToken !== undefined) return { kind: 'lease', key: String(target.orderId), lease: target.leaseToken }
  return { kind: 'orderId', key: String(target.orderId), lease: null }
}

const TARGET_CONDITIONS: Record<TargetKind, RawBuilder<unknown>> = {
  externalReference: sql`o.external_reference = i.target`,
  orderId: sql`o.id = i.target::int`,
  lease: sql`o.id = i.target::int and o.poll_lease_token = i.lease`,
}

async function runStatement(
  db: Executor,
  items: readonly { observation: Observation; delivery?: DeliveryRecord }[],
  settings: ObservationSettings,
  /** Per delivery: its reference is not this backend's (isForeignReference), so without an order it is dismissed. */
  foreign: readonly boolean[] = [],
): Promise<StatementRow[]> {
  const kinds = new Set(items.map((item) => targetOf(item.observation.target).kind))
  const withDelivery = new Set(items.map((item) => item.delivery !== undefined))
  if (kinds.size !== 1 || withDelivery.size !== 1) throw new Error('one statement takes one kind of target, all with or all without a delivery')
  // on its own, the statement is its own transaction: the wake comes after its commit, decided here from the
  // rows it applied (the same statement as with no handler at all); inside an outer transaction the statement
  // sends the NOTIFY itself, delivered at that commit
  const notifyInside = db.isTransaction
  const reacting: boolean[] = []
  const input = items.map(({ observation, delivery }, n) => {
    const target = targetOf(observation.target)
    const handlers = settings.handlersFor(`trade.${observation.status}`)
    reacting.push(handlers.length > 0)
    return {
      n,
      target: target.key,
      lease: target.lease,
      trade_id: observation.tradeId,
      trade_reference: observation.tradeReference ?? null,
      external_reference: observation.externalReference ?? null,
      status: observation.status,
      rank: statusRank(observation.status) ?? null,
      terminal: isTerminalStatus(observation.status),
      poll_after_s: pollAfterS(observation.status, settings),
      source: observation.source,
      history_delivery_id: observation.deliveryId ?? null,
      stated_at: observation.observedAt.toISOString(),
      asked_version: observation.askedAtVersion ?? null,
      delivery_id: delivery?.deliveryId ?? null,
      event_type: delivery?.eventType ?? null,
      raw_body: delivery?.rawBody ?? null,
      body_sha256: delivery?.bodySha256 ?? null,
      not_ours: foreign[n] ?? false,
      partner_env: settings.partnerEnv ?? 'sandbox',
      // names are [a-z0-9_.-]+ (the registry checks), so a comma joins them unambiguously
      handlers: notifyInside && handlers.length > 0 ? handlers.join(',') : null,
    }
  })
  const [kind] = kinds
  const [hasDelivery] = withDelivery
  const withReactions = reacting.includes(true)
  const { rows } = await db.executeQuery(compiledStatement(db, JSON.stringify(input), kind!, hasDelivery!, withReactions && notifyInside, settings))
  // a transition some handler takes was committed: an applied outcome whose delivery (if any) was new
  if (withReactions && !notifyInside && rows.some((row) => row.outcome === 'applied' && row.inserted && reacting[row.n])) {
    if (settings.onJobsEnqueued) settings.onJobsEnqueued()
    else notifyDispatchersSoon(db)
  }
  return rows
}

// The statement for a set of observations of one target kind. The input is one JSON parameter (a
// row per observation), so a batch of 1 and a batch of 100 share one prepared statement.

// Its text depends on the target kind, the delivery, the NOTIFY and STALE_AFTER_S alone, never on the observations: it
// is built and compiled once for each, and each run passes its own input. Built every time, it was about 3 kB of
// allocation a delivery in the ingest (the query's tree, its text, and a copy of the text made flat), and a hash
// of its 6 kB of text each statement (its prepared name).
const compiledStatements = new Map<string, CompiledQuery<StatementRow>>()
// where the input goes, found again in the compiled parameters by identity
const INPUT_PLACE = Object.freeze({ input: 'the observations' })

function compiledStatement(
  db: Executor,
  input: string,
  kind: TargetKind,
  withDelivery: boolean,
  notifies: boolean,
  settings: ObservationSettings,
): CompiledQuery<StatementRow> {
  const key = `${kind} ${withDelivery} ${notifies} ${settings.staleAfterS}`
  let compiled = compiledStatements.get(key)
  if (compiled === undefined) {
    compiled = observationStatement(INPUT_PLACE, kind, withDelivery, notifies, settings).compile(db)
    if (compiled.parameters.filter((value) => value === INPUT_PLACE).length !== 1) throw new Error('the observation statement takes its input once')
    compiledStatements.set(key, compiled)
  }
  return { ...compiled, parameters: compiled.parameters.map((value) => (value === INPUT_PLACE ? input : value)) }
}

// The statuses the table knows (trade-status.ts), as SQL literals: the order's current status is unknown when it is
// none of them (status_rank then keeps the last known one's rank)
const atUnknownStatus = (status: RawBuilder<unknown>) =>
  sql`${status} <> all(array[${sql.join(Object.keys(TRADE_STATUSES).map((each) => sql.lit(each)))}]::text[])`

/**
 * A webhook's known status, at or above the rank an order at an unknown status kept, that the order had: stale (a
 * replay cannot move the order back), but it asks for the poll whose answer may (decideTransition's exception).
 * `decided` names a row of the decision (the order as locked), `observed` one of the input.
 */
function asksForReturn(decided: string, observed: string): RawBuilder<unknown> {
  const [d, i] = [sql.raw(decided), sql.raw(observed)]
  return sql`(${d}.outcome = 'stale' and ${i}.source = 'webhook' and not ${d}.order_terminal and ${i}.rank >= ${d}.order_rank
    and ${atUnknownStatus(sql`${d}.from_status`)})`
}
const ASKS_FOR_RETURN = asksForReturn('e', 'e')

// a poll's or an API call's answer the order moved past while it was on its way, that the rank order cannot place
// (the decision's answered_before_move): stale, and the poll now that asks the platform again
const ASKS_AGAIN = sql`(e.outcome = 'stale' and e.answered_before_move)`

function observationStatement(
  /** The observations as JSON, or where they go (INPUT_PLACE). */
  input: unknown,
  kind: TargetKind,
  withDelivery: boolean,
  /** Inside an outer transaction, with events some handler takes: the statement sends the NOTIFY itself. */
  notifies: boolean,
  { staleAfterS }: ObservationSettings,
): RawBuilder<StatementRow> {
  const releasesLease = kind === 'lease'
  // the order moved (an applied observation) since the request this answers was sent; a webhook's never did
  const movedSinceAsked = sql`(i.asked_version is not null and o.version <> i.asked_version)`

  // decision: the same table as decideTransition(), on the row as locked (the lateral subquery locks
  // one order per input row, in input order, and reads its visited statuses as the last commit left
  // them); trade_mismatch guards an order linked to another trade, and one the record's external
  // reference does not name
  const decision = sql`
    decision as (
      select i.n, o.id, o.trade_status as from_status, o.version, o.external_reference as order_reference,
        o.is_terminal as order_terminal, o.status_rank as order_rank, o.status_changed_at as order_changed_at,
        -- the event's place in the reaction streams: this transaction's id, or the order's previous event's
        -- place when that is larger, so one order's events never go backwards (migrations/0009), and never below
        -- a stream's place: on a server whose counter is behind the stored places (a restore), an id of its own
        -- was below them all, and no handler ever read the event; at the largest place it waits, withheld, for
        -- 'reactions rebase'. (Once per statement: the streams are one row a handler.)
        greatest(pg_current_xact_id(), o.last_event_position,
          (select s.position from reaction_streams s order by s.position desc limit 1)) as stream_position,
        coalesce(o.trade_id, i.trade_id) as event_trade_id,
        -- an answer to a request sent before the order's last move, of an unknown status or from one: what the rank
        -- order cannot place (the outcome below is stale, and ASKS_AGAIN polls now)
        (${movedSinceAsked} and (i.rank is null or ${atUnknownStatus(sql`o.trade_status`)})) as answered_before_move,
        case
          -- an order linked under the other PARTNER_ENV (a sandbox trade, the service gone live, or back): its trade is
          -- another platform's, which this observation is not a record of, whatever its trade id says. Left as it is, as for a record of another trade: a status of the
          -- other platform must not move it (a sandbox webhook let in by a sandbox secret kept in WEBHOOK_SECRETS),
          -- and it stays that environment's to poll when the service switches back. A poll never gets here: the
          -- claim does not take such an order (poll-schedule.repository.ts). Null: linked before migrations/0018,
          -- taken as the service's own
          when o.partner_env is not null and o.partner_env <> i.partner_env then 'trade_mismatch'
          when o.trade_id is not null and o.trade_id <> i.trade_id then 'trade_mismatch'
          -- a poll's or an API call's answer whose record is another order's (a webhook is matched by it)
          when i.external_reference <> o.external_reference then 'trade_mismatch'
          -- the trade is already another order's: linking it here too would break orders_trade_id_key. A scalar
          -- subquery (trade_id is unique), not EXISTS: the planner may run an EXISTS as one hash of every order's
          -- trade id, built by each statement (PGlite's chose that at 20,000 orders: 6 ms a statement); this one
          -- is always a lookup in orders_trade_id_key, and only for an order's first trade event
          when o.trade_id is null and (select x.id from orders x where x.trade_id = i.trade_id) is not null then 'trade_mismatch'
          when o.trade_status = i.status then 'duplicate_effect'
          when o.is_terminal then 'stale'
          -- a poll's known status back from an unknown one, even a status the order had (decideTransition)
          when i.source = 'poll' and i.rank >= o.status_rank and ${atUnknownStatus(sql`o.trade_status`)}
            then case when ${movedSinceAsked} then 'stale' else 'applied' end
          when i.status = any(o.visited_statuses) then 'stale'
          when i.rank is null then case when i.source = 'webhook' then 'unknown_status' when ${movedSinceAsked} then 'stale' else 'applied' end
          when o.trade_status is null then 'applied'
          when i.rank <= o.status_rank then 'stale'
          else 'applied'
        end as outcome
      from input i
      cross join lateral (
        select o.id, o.trade_id, o.trade_status, o.is_terminal, o.status_rank, o.visited_statuses, o.version,
          o.external_reference, o.last_event_position, o.status_changed_at, o.partner_env
        from orders o
        where ${TARGET_CONDITIONS[kind]}
          ${
            // a delivery already stored changes nothing: do not even wait for the order's lock
            withDelivery
              ? sql`and not exists (select 1 from webhook_deliveries w
                  where w.delivery_id = i.delivery_id and w.body_sha256 = i.body_sha256)`
              : sql``
          }
        for update
      ) o
    )`

  // a webhook's effects happen only if its delivery row was new
  const deliveryInsert = withDelivery
    ? sql`,
    delivery as (
      insert into webhook_deliveries
        (delivery_id, body_sha256, received_at, event_type, trade_id, trade_reference, external_reference,
         observed_status, outcome, order_id, raw_body, applied_at, order_version)
      select i.delivery_id, i.body_sha256, i.observed_at, i.event_type, i.trade_id, i.trade_reference, i.external_reference,
        i.status,
        coalesce(d.outcome, case when i.not_ours then 'dismissed' else 'unmatched' end), d.id, i.raw_body,
        case when d.outcome = 'applied' then i.observed_at end,
        d.version + case when d.outcome = 'applied' then 1 else 0 end
      from input i left join decision d on d.n = i.n
      -- a body a stored delivery that changed nothing has already (replayed under a fresh delivery id, which is not
      -- signed): it changes nothing that one did not, and is not stored again (migrations/0017). Parked and
      -- dismissed rows are among them: a replay is not parked again. (A scalar subquery, not EXISTS, as above: one
      -- probe of webhook_deliveries_unapplied_body_idx, and none for a delivery that moves its order.) One that asks
      -- for a poll now (an unknown status, a hold lifted) is told apart only from a copy stored since its order last
      -- changed: the platform sends a status's body byte for byte again when the trade comes back to it, and a
      -- hold's lifting (funded, on_hold, funded) was answered as a replay of the first funded's copy, nothing asked
      -- the poll, and the order stayed on_hold for STALE_AFTER_S. "Since" is the order's version stored with the copy
      -- (migrations/0019), not its receipt time: that compared one replica's clock with another's, and a copy stored
      -- by a replica 120 s ahead read as newer than the hold. A copy stored before that migration has only its time
      where d.outcome is not distinct from 'applied'
        or (select 1 from webhook_deliveries p where p.body_sha256 = i.body_sha256 and p.outcome <> 'applied'
          and case when d.outcome = 'unknown_status' or ${asksForReturn('d', 'i')} then
              case when p.order_id = d.id and p.order_version is not null then p.order_version >= d.version
                else p.received_at >= coalesce(d.order_changed_at, '-infinity') end
            else true end
          limit 1) is null
      on conflict (delivery_id, body_sha256) do nothing
      returning delivery_id, body_sha256, outcome
    )`
    : sql``
  const effective = withDelivery
    ? sql`select d.*, i.status, i.rank, i.terminal, i.poll_after_s, i.source, i.trade_id, i.trade_reference, i.history_delivery_id, i.observed_at,
          i.handlers, i.partner_env
        from decision d join input i on i.n = d.n
        join delivery x on x.delivery_id = i.delivery_id and x.body_sha256 = i.body_sha256`
    : sql`select d.*, i.status, i.rank, i.terminal, i.poll_after_s, i.source, i.trade_id, i.trade_reference, i.history_delivery_id, i.observed_at,
          i.handlers, i.partner_env
        from decision d join input i on i.n = d.n`

  return sql<StatementRow>`${sql.raw(PREPARED)}
    with input as (
      -- never dated after the database's own time: a replica whose clock is ahead (a day, found from outside) dated the
      -- order's move, its delivery and its next poll by it, and the order was not polled again until that day came
      select *, least(i.stated_at, statement_timestamp()) as observed_at from json_to_recordset(${input}::json) as i(
        n int, target text, lease text, trade_id text, trade_reference text, external_reference text, status text,
        rank int, terminal boolean, poll_after_s int, source text, history_delivery_id text, stated_at timestamptz, asked_version int,
        delivery_id text, event_type text, raw_body text, body_sha256 text, not_ours boolean, handlers text, partner_env text)
    ),
    ${decision}${deliveryInsert},
    effective as (${effective}),
    moved as (
      update orders o set
        trade_status = case when e.outcome = 'applied' then e.status else o.trade_status end,
        status_rank = case when e.outcome = 'applied' and e.rank is not null then e.rank else o.status_rank end,
        is_terminal = case when e.outcome = 'applied' then e.terminal else o.is_terminal end,
        visited_statuses = case when e.outcome = 'applied' then array_append(o.visited_statuses, e.status)
          else o.visited_statuses end,
        status_source = case when e.outcome = 'applied' then e.source else o.status_source end,
        status_changed_at = case when e.outcome = 'applied' then e.observed_at else o.status_changed_at end,
        trade_id = coalesce(o.trade_id, e.trade_id),
        trade_reference = coalesce(o.trade_reference, e.trade_reference),
        -- the environment, written once: with the first trade linked, or, for an order linked before migrations/0018,
        -- by the first observation of its trade that this environment's platform answered or signed (so an upgrade
        -- run under sandbox records its open orders as they are polled, before it goes live). Not a column of any
        -- index, so a later update stays as cheap as before (one more value in the row the update writes anyway)
        partner_env = coalesce(o.partner_env, e.partner_env),
        trade_create_state = 'created',
        -- a trade linked to an order whose create went unanswered resolves it
        attention = case when o.attention = 'trade_create_unknown' and coalesce(o.trade_id, e.trade_id) is not null
          then null else o.attention end,
        next_poll_at = case
          when (e.outcome = 'applied' and e.terminal) or (e.outcome <> 'applied' and o.is_terminal) then null
          -- an order flagged for an operator stays off the schedule whatever comes (a webhook put one flagged
          -- trade_not_found back on it, flag and all, and it was polled every STALE_AFTER_S): the operator's requeue
          -- puts it back; an unresolved create is the exception, resolved above by the trade this links
          when o.attention is not null and o.attention <> 'trade_create_unknown' then o.next_poll_at
          -- a webhook's unknown status: poll the trade now (least() skips a null next_poll_at); and a webhook's known
          -- status a poll would return the order to from an unknown one (a hold lifted): poll now, the poll decides
          when e.outcome = 'unknown_status' or ${ASKS_FOR_RETURN} or ${ASKS_AGAIN} then least(o.next_poll_at, e.observed_at)
          when e.outcome = 'applied' or ${releasesLease}::boolean
            then ${
              releasesLease
                ? // a poll's claim set next_poll_at to the lease's end: if it differs now, an API call or a
                  // webhook rescheduled the order while the poll ran, and the earlier time stands; none at all
                  // means a trade command flagged the order meanwhile, and it stays off the schedule until an
                  // operator requeues it (least() alone skipped the null and put it back)
                  // (a poll that found the status unchanged: STALE_AFTER_S on, whatever the status)
                  sql`case
                      when o.next_poll_at is not distinct from o.poll_lease_expires_at
                        then e.observed_at + make_interval(secs => case when e.outcome = 'applied' then e.poll_after_s else ${staleAfterS}::int end)
                      when o.next_poll_at is null then null
                      else least(e.observed_at + make_interval(secs => case when e.outcome = 'applied' then e.poll_after_s else ${staleAfterS}::int end), o.next_poll_at) end`
                : sql`e.observed_at + make_interval(secs => e.poll_after_s)`
            }
          -- another webhook or API answer of the status the order has: the webhook expected after a call, which
          -- puts the next poll STALE_AFTER_S after the move; never later. Replays of the current status under fresh
          -- delivery ids each put it STALE_AFTER_S on, and so kept the order from the poll that heals a lost webhook
          -- A poll already due (an unknown status asked for one now) and a flagged order's none stay as they are
          when e.outcome = 'duplicate_effect' then case
            when o.next_poll_at is null or o.next_poll_at <= e.observed_at then o.next_poll_at
            else greatest(o.next_poll_at, o.status_changed_at + make_interval(secs => e.poll_after_s)) end
          else o.next_poll_at
        end,
        ${
          releasesLease
            ? // a poll's answer: the order is reconciled, no longer due from its poll's due time (migrations/0020)
              sql`poll_lease_token = null, poll_lease_expires_at = null, last_polled_at = e.observed_at, poll_attempts = 0,
                poll_due_since = null, poll_retry_at = null,`
            : sql``
        }
        version = o.version + case when e.outcome = 'applied' then 1 else 0 end,
        last_event_position = case when e.outcome = 'applied' then e.stream_position else o.last_event_position end,
        updated_at = e.observed_at
      from effective e
      -- a poll's answer releases its claim, but a record of another trade or order leaves the row as it is:
      -- the poller flags that order for an operator under the claim's lease (poll-order.ts)
      where o.id = e.id and (e.outcome in ('applied', 'duplicate_effect', 'unknown_status') or ${ASKS_FOR_RETURN} or ${ASKS_AGAIN}
        or (${releasesLease}::boolean and e.outcome <> 'trade_mismatch'))
    ),
    history as (
      -- the sequence is the order's version after the move (the update above adds exactly 1); one
      -- statement never names an order twice, so the locked row's version + 1 is that version
      insert into order_status_history
        (order_id, from_status, to_status, source, delivery_id, recorded_at, sequence, trade_id, external_reference,
         stream_position)
      select e.id, e.from_status, e.status, e.source, e.history_delivery_id, e.observed_at, e.version + 1,
        e.event_trade_id, e.order_reference, e.stream_position
      from effective e
      where e.outcome = 'applied'
      ${notifies ? sql`returning order_id` : sql``}
    )${
      notifies
        ? sql`,
    -- the events some handler takes: the dispatchers read them from the history (their streams), and
    -- are only told that there are some
    jobs as (
      select 1 from history h join effective e on e.id = h.order_id where e.handlers is not null
    ),
    -- delivered on commit, once per transaction however many rows; a select CTE runs only when used
    notified as (
      select pg_notify(${reactionChannelSql}, '') from (select 1 from jobs limit 1) j
    )`
        : sql``
    }
    select i.n,
      ${
        withDelivery
          ? sql`exists (select 1 from delivery x where x.delivery_id = i.delivery_id and x.body_sha256 = i.body_sha256)`
          : sql`true`
      } as inserted,
      ${
        // the statement's snapshot: rows committed before it began (its own insert is not among them)
        withDelivery
          ? sql`exists (select 1 from webhook_deliveries w where w.delivery_id = i.delivery_id and w.body_sha256 <> i.body_sha256)`
          : sql`false`
      } as reused,
      ${
        // not stored, and not as this id: a body stored before under another id, with no effect (above)
        withDelivery
          ? sql`not exists (select 1 from delivery x where x.delivery_id = i.delivery_id and x.body_sha256 = i.body_sha256)
              and not exists (select 1 from webhook_deliveries w where w.delivery_id = i.delivery_id and w.body_sha256 = i.body_sha256)`
          : sql`false`
      } as replayed,
      d.outcome, d.id as order_id, d.from_status
      ${notifies ? sql`, (select count(*) from notified) as notified` : sql``}
    from input i left join decision d on d.n = i.n
    order by i.n`
}
