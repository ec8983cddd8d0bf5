// Prometheus metrics (prom-client), one registry per service instance so tests can build several.
// What the receiver and the poller record, and what is read from the database at scrape time.
// deploy/prometheus/alerts.yml and deploy/grafana/partner-escrow.json use these names (a test checks).
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client'
import { droppedLogLines } from '../logger.js'
import { type Clock, monotonicNow, systemClock } from '../clock.js'
import type { DatabaseState } from '../db/ping-database.js'
import { GUARDED_LOOPS } from '../db/clock-guard.js'
import { ATTENTION_FLAGS, DUE_COUNT_CAP } from '../orders/poll-schedule.repository.js'
import type { AttemptResult } from '../reactions/dispatcher-settings.js'
import { OUTAGE_MS } from '../reactions/recovery-watch.js'
import { POLL_RESULTS, type PollResult, type RunSummary } from '../reconcile/poller.js'
import { DELIVERY_OUTCOMES as STORED_OUTCOMES } from '../webhooks/delivery-outcome.js'
import { serviceVersion } from '../version.js'

/** Every label value of webhook_deliveries_total, created at 0 so a rate over a quiet service is 0, not absent. */
const DELIVERY_OUTCOMES = [
  ...STORED_OUTCOMES.filter((outcome) => outcome !== 'lease_lost'),
  'duplicate',
  'replayed',
  'id_reused',
  'rejected',
] as const

/** A scrape never waits longer than this on the database (Prometheus' own scrape timeout is 10 s). */
export const SCRAPE_READ_TIMEOUT_MS = 2_000

/**
 * The tables' sizes are read at most this often (by the replica's monotonic clock): an estimate, and a size that
 * moves by the day, need no reading at every scrape, where every replica's scrapes would stat every file of the
 * tables each 15 s.
 */
export const TABLE_SIZES_READ_MS = 60_000

export interface MetricsSources {
  /** Resolves when the database answers a trivial query (database_up), with whether it takes writes (database_read_only). */
  databaseUp?: () => Promise<DatabaseState>
  /** How far the database's clock is ahead of this replica's, in ms (databaseClockOffsetMs); Postgres only. */
  databaseClockOffset?: () => Promise<number>
  /** Orders whose poll came due and is not answered yet (held by a cycle and backing off included), and how long the oldest has waited. */
  dueOrders?: () => Promise<{ ordersDue: number; oldestDueAgeS: number }>
  /** Orders flagged for an operator (orders.attention), counted by flag; a flag no order has may be left out. */
  ordersNeedingAttention?: () => Promise<readonly { attention: string; orders: number }[]>
  /** Deliveries parked as unmatched (no order for their reference yet), and the age of the oldest. */
  parkedDeliveries?: () => Promise<{ parked: number; oldestParkedAgeS: number }>
  /** Whether the statistics watch found autovacuum off at its last look (StatisticsWatch.autovacuumOff); Postgres only. */
  autovacuumOff?: () => boolean | undefined
  /** Whether the listener hears notifications sent through the pool (DatabaseHandle.notificationsHeard); Postgres only. */
  notificationsHeard?: () => boolean | undefined
  /** Database connections: in use, idle, and callers waiting for one. */
  poolStats?: () => { total: number; idle: number; waiting: number }
  /** Reaction jobs still to run or failed, and the age of the oldest still to run. */
  reactionJobs?: () => Promise<{ pending: number; running: number; failed: number; oldestPendingAgeS: number }>
  /** When the oldest delivery row still stored was received; null when none is. */
  oldestDelivery?: () => Promise<Date | null>
  /** The service's tables: the planner's estimate of their rows (null: none yet) and their bytes (readTableSizes). */
  tableSizes?: () => Promise<readonly { table: string; rows: number | null; bytes: number }[]>
  /** The embedded database's data directory: its free space in bytes (undefined until read) and the minimum. */
  dataDirStorage?: { freeBytes: () => number | undefined; minFreeBytes: number }
  /** PRUNE_INTERVAL_S: how often this replica tries a pruning pass (the stalled-pruning alert counts in it). */
  pruneIntervalS?: number
  /** POLL_INTERVAL_S where this replica polls: the stalled-poller alert allows three of it, 10 minutes at least. */
  pollIntervalS?: number
  /**
   * The longest one poll cycle of this replica can last (longestCycleMs), in seconds, where it polls: the stalled-poller
   * alert allows it after the longest sleep, so a healthy replica whose cycles run long is not paged.
   */
  pollLongestCycleS?: number
}

/** How a console token came (console_auth_refused_total's via): typed on the login page, or in an Authorization header. */
export const CONSOLE_TOKEN_VIAS = ['login_page', 'authorization'] as const
/** Why it was refused (its reason): checked and wrong, or not checked at all while the console throttles (429). */
export const CONSOLE_REFUSALS = ['wrong_token', 'throttled'] as const

/** What retention prunes: the label values of retention_rows_pruned_total (src/retention/prune.ts). */
const PRUNED_KINDS = ['body', 'delivery', 'reaction_job', 'reconcile_run'] as const

export interface RetentionHooks {
  onPruned(kind: (typeof PRUNED_KINDS)[number], rows: number): void
  /** A pass that held the lock finished (whether or not it pruned anything). */
  onPass(finishedAt: Date): void
}

export interface ReactionHooks {
  onAttempt(handler: string, result: AttemptResult, count?: number): void
  onFirstStart(handler: string, latencyS: number): void
  onFailure(handler: string, code: string): void
  onPulledForward(handler: string, jobs: number): void
  /** The dispatcher's look at the stored stream positions: how many ids the largest is ahead of the server's counter. */
  onPositionsAhead(aheadBy: number): void
}

/** The results of reaction_attempts_total created at 0 for every handler (lease_lost, released and skipped stay rare). */
const ATTEMPT_RESULTS: readonly AttemptResult[] = ['done', 'retry', 'failed']

export interface PollerHooks {
  onPollResult(result: PollResult): void
  onCycle(summary: RunSummary): void
}

export interface Metrics {
  readonly registry: Registry
  /** When this replica's counters started counting (its start-up), by the wall clock: what "since start" means. */
  readonly startedAt: Date
  readonly deliveries: Counter<'outcome'>
  readonly signatureFailures: Counter<'signature'>
  /** Of the signatures matching no secret, those on a delivery id and body this replica had so refused before. */
  readonly signatureMismatchesResent: Counter
  readonly ingestSeconds: Histogram<'outcome'>
  readonly ingestBatchSize: Histogram
  readonly pollResults: Counter<'result'>
  /** Requests or connections the public listener refused to protect its memory, by reason. */
  readonly requestsRefused: Counter<'reason'>
  /** Operator console: tokens refused, by how they came and why (src/console/login-throttle.ts). */
  readonly consoleAuthRefused: Counter<'via' | 'reason'>
  /** Claims and stream reads not made while this replica's clock was far from the database's (db/clock-guard.ts). */
  readonly clockOffsetRefused: Counter<'loop'>
  /**
   * Body bytes reserved by requests being read or held now (MAX_INFLIGHT_BODY_BYTES is the cap): a plain
   * sum, read into the gauge when scraped (two gauge updates per request cost more than the scrape).
   */
  readonly inflightBodyBytes: { inc(bytes: number): void; dec(bytes: number): void }
  /**
   * For createPoller on a replica that runs it: counts polls and records when a cycle last finished.
   * Until this is called, poller_last_cycle_age_seconds and poller_last_cycle_timestamp_seconds have no sample (a
   * replica without a poller must not look like a stalled one); from the call on, they start at the call's time, so
   * a first cycle that never ends is noticed too.
   */
  pollerHooks(clock: Clock): PollerHooks
  /** For createDispatcher: attempts by handler and result, and the latency from a transition to its handler. */
  reactionHooks(handlers: readonly string[]): ReactionHooks
  /** For the pruner: rows pruned by kind, and when this replica last finished a pass. */
  readonly retentionHooks: RetentionHooks
  /** For the partner API client (its onClockOffset): the platform's clock against ours, by each answer's Date. */
  readonly partnerApiHooks: PartnerApiHooks
}

export interface PartnerApiHooks {
  onClockOffset(offsetS: number): void
}

export function createMetrics(
  sources: MetricsSources = {},
  {
    defaultMetrics = true,
    readTimeoutMs = SCRAPE_READ_TIMEOUT_MS,
    clock = systemClock,
  }: { defaultMetrics?: boolean; readTimeoutMs?: number; clock?: Clock } = {},
): Metrics {
  const registry = new Registry()
  if (defaultMetrics) collectDefaultMetrics({ register: registry })
  // an alert that counts from the start counts from here, on the monotonic clock: time() minus
  // process_start_time_seconds is off by as much as this machine's clock was at the start
  const startedAt = monotonicNow(clock)
  const startedAtWall = new Date(clock.now())
  new Gauge({
    name: 'partner_escrow_uptime_seconds',
    help: "Seconds since this process started serving metrics (at its start-up), on its monotonic clock, which setting the machine's clock does not move",
    registers: [registry],
    collect() {
      this.set(Math.round(monotonicNow(clock) - startedAt) / 1000)
    },
  })
  // which build answers: a dashboard or alert can tell replicas of two versions apart during a rollout
  new Gauge({
    name: 'partner_escrow_build_info',
    help: "Always 1; its version label is the running service's (package.json's version)",
    labelNames: ['version'] as const,
    registers: [registry],
  }).set({ version: serviceVersion() }, 1)

  const deliveries = new Counter({
    name: 'webhook_deliveries_total',
    help: `Webhook deliveries answered, by outcome (${DELIVERY_OUTCOMES.join(', ')})`,
    labelNames: ['outcome'] as const,
    registers: [registry],
  })
  for (const outcome of DELIVERY_OUTCOMES) deliveries.inc({ outcome }, 0)
  const signatureFailures = new Counter({
    name: 'webhook_signature_failures_total',
    help:
      'Webhook deliveries refused with 401, by signature: missing, malformed (not sha256= and 64 hex digits), or mismatch ' +
      '(well-formed, matching no secret: the platform signing with a secret not listed, or someone imitating it)',
    labelNames: ['signature'] as const,
    registers: [registry],
  })
  for (const signature of ['missing', 'malformed', 'mismatch']) signatureFailures.inc({ signature }, 0)
  // the platform retries a refused delivery (the same id and body, 6 attempts in all): what tells its deliveries
  // signed with a secret not listed from an outsider's wrong signatures while it sends nothing
  const signatureMismatchesResent = new Counter({
    name: 'webhook_signature_mismatches_resent_total',
    help:
      'Webhook deliveries refused for a signature matching no secret whose delivery id and body this replica had refused so ' +
      'before (of the last 10,000 so refused): a sender retrying one delivery, as the platform does',
    registers: [registry],
  })
  const ingestSeconds = new Histogram({
    name: 'webhook_ingest_duration_seconds',
    help: 'Time from the end of the request body to the answer, by outcome',
    labelNames: ['outcome'] as const,
    // 7.5 and 15 ms: a latency objective of 15 ms at the 99th percentile can be read off a bucket's edge
    buckets: [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  })
  const ingestBatchSize = new Histogram({
    name: 'webhook_ingest_batch_size',
    help: 'Trade-event deliveries written by one statement and one commit (group commit)',
    buckets: [1, 2, 5, 10, 20, 50, 100, 200, 500],
    registers: [registry],
  })
  const pollResults = new Counter({
    name: 'poller_polls_total',
    help: 'Trades polled by the reconciler, by result',
    labelNames: ['result'] as const,
    registers: [registry],
  })
  for (const result of POLL_RESULTS) pollResults.inc({ result }, 0)
  // the age, not the time: Prometheus' time() minus a time this replica wrote by its own clock is off by as much as
  // that clock is (a stuck poller on a clock 10 minutes ahead looks fresh for 10 minutes more). The time stays for
  // what already reads it
  let lastCycleS: number | undefined
  let lastCycle: MonotonicAge | undefined
  new OptionalGauge(() => lastCycle?.seconds(), {
    name: 'poller_last_cycle_age_seconds',
    help: "Seconds since this replica's poller last finished a cycle (empty cycles too), or since it started before its first, measured at scrape time on the monotonic clock; no sample where no poller runs",
    registers: [registry],
  })
  new OptionalGauge(() => lastCycleS, {
    name: 'poller_last_cycle_timestamp_seconds',
    help: "Unix time, by this replica's clock, at which its poller last finished a cycle (empty cycles too); no sample where no poller runs. The alerts read poller_last_cycle_age_seconds, which this machine's clock does not move",
    registers: [registry],
  })

  // the last reading wins: the platform's clock is one clock, and a replica's own clock is what drifts
  let clockOffsetS: number | undefined
  new OptionalGauge(() => clockOffsetS, {
    name: 'partner_api_clock_offset_seconds',
    help: "Seconds the platform's clock is ahead of this machine's (negative: behind), by the Date header of the last partner API answer this replica read, any status; whole seconds, so 0 or ±1 on two good clocks; no sample before the first answer",
    registers: [registry],
  })

  const requestsRefused = new Counter({
    name: 'http_requests_refused_total',
    help: 'Public listener: requests answered 503 past the in-flight body budget (body_budget), bodies still arriving after SLOW_BODY_MS cut to make room in it for a new request (slow_body), or requests answered 503 while the embedded database\'s data directory is almost full (storage_low); webhooks answered 503 because the service\'s tables, or a column of them, are missing: a database being restored or replaced, or restored from an older dump (schema_missing); requests whose client ended its side part-way through the body, answered 400 (body_incomplete); connections closed to make room past MAX_CONNECTIONS for a new one, having waited for a request or received one for SLOW_BODY_MS or more (slow_connection), and new connections dropped past it when none had (max_connections)',
    labelNames: ['reason'] as const,
    registers: [registry],
  })
  for (const reason of ['body_budget', 'slow_body', 'slow_connection', 'max_connections', 'storage_low', 'schema_missing', 'request_timeout', 'body_incomplete']) {
    requestsRefused.inc({ reason }, 0)
  }
  const clockOffsetRefused = new Counter({
    name: 'clock_offset_refused_total',
    help: "Claims (poller, reaction_jobs) and stream reads (reaction_streams) not made because this replica's clock was more than 30 s from the database's: no lease or due time is written by it until it is back within the bound",
    labelNames: ['loop'] as const,
    registers: [registry],
  })
  for (const loop of GUARDED_LOOPS) clockOffsetRefused.inc({ loop }, 0)
  // every label pair at 0: an alert on its rate starts from a series, not from none
  const consoleAuthRefused = new Counter({
    name: 'console_auth_refused_total',
    help: `Operator listener: console tokens refused, by how they came (${CONSOLE_TOKEN_VIAS.join(', ')}: Bearer or basic) and why (wrong_token: checked and wrong; throttled: answered 429 unchecked, after too many wrong ones in a minute)`,
    labelNames: ['via', 'reason'] as const,
    registers: [registry],
  })
  for (const via of CONSOLE_TOKEN_VIAS) for (const reason of CONSOLE_REFUSALS) consoleAuthRefused.inc({ via, reason }, 0)
  let inflightBytes = 0
  const inflightBodyBytes = {
    inc: (bytes: number) => {
      inflightBytes += bytes
    },
    dec: (bytes: number) => {
      inflightBytes -= bytes
    },
  }
  new Gauge({
    name: 'http_inflight_body_bytes',
    help: 'Public listener: request body bytes reserved by requests being read or answered now (at most MAX_INFLIGHT_BODY_BYTES)',
    registers: [registry],
    collect() {
      this.set(inflightBytes)
    },
  })

  const reactionAttempts = new Counter({
    name: 'reaction_attempts_total',
    help: 'Reaction handler calls by handler and result: done, retry (threw, runs again after a backoff), failed (threw on the last attempt), released (stopped by shutdown), lease_lost; skipped: a job not called, as its handler no longer takes its type',
    labelNames: ['handler', 'result'] as const,
    registers: [registry],
  })
  // beside the attempts by result: a retry says something failed, the code says what (amqp_unroutable: no
  // queue bound for the routing key, which only the partner's side can fix)
  const reactionFailures = new Counter({
    name: 'reaction_failures_total',
    help: "Reaction handler calls that threw, by handler and the error's code (amqp_unroutable, amqp_unreachable, forward_timeout ...; other for an error without a snake_case code)",
    labelNames: ['handler', 'code'] as const,
    registers: [registry],
  })
  // how often a handler's system came back after an outage with retries still backing off (recovery-watch.ts)
  const reactionPulledForward = new Counter({
    name: 'reaction_jobs_pulled_forward_total',
    help: `Reaction jobs waiting out a backoff that were made due at once, as their handler succeeded again after an outage of at least ${OUTAGE_MS / 1000} s (its system is back), by handler`,
    labelNames: ['handler'] as const,
    registers: [registry],
  })
  const reactionLatency = new Histogram({
    name: 'reaction_latency_seconds',
    // from recorded_at, not the commit: a replica does not learn when another one committed
    help: "Time from a transition's observation (its history row's recorded_at: the webhook's or poll answer's receipt, before its commit) to the first call of a handler for it, by handler",
    labelNames: ['handler'] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [registry],
  })

  // positions of another server's transaction counter (a restore onto another server): reactions stop without a failure
  let positionsAhead: number | undefined
  new OptionalGauge(() => positionsAhead, {
    name: 'reaction_stream_positions_ahead',
    help: "How many transaction ids the largest stored reaction stream position is ahead of the database server's counter, at the dispatcher's last look (at its start, then every minute, every 5 s while above 0): above 0, the positions are another server's (a restore or logical replica onto this one) and no handler gets new transitions until `reactions rebase` moves them; 0 when they are this server's; no sample before the first look",
    registers: [registry],
  })

  const rowsPruned = new Counter({
    name: 'retention_rows_pruned_total',
    help: 'Rows pruned by retention, by what: body (a raw body emptied), delivery (a delivery row deleted), reaction_job (a done job deleted, or a first attempt done, with its stream batch record), reconcile_run (a poll cycle\'s record deleted)',
    labelNames: ['what'] as const,
    registers: [registry],
  })
  for (const what of PRUNED_KINDS) rowsPruned.inc({ what }, 0)
  let lastPruneS: number | undefined
  const lastPass = ageSince(clock)
  new OptionalGauge(lastPass.seconds, {
    name: 'retention_last_pass_age_seconds',
    help: 'Seconds since this replica last finished a whole pruning pass (one replica at a time holds the lock; a pass cut short by a shutdown or a lost lock does not count), measured at scrape time on the monotonic clock; no sample before the first',
    registers: [registry],
  })
  new OptionalGauge(() => lastPruneS, {
    name: 'retention_last_pass_timestamp_seconds',
    help: "Unix time, by this replica's clock, at which it last finished a whole pruning pass; no sample before the first. The alerts read retention_last_pass_age_seconds, which this machine's clock does not move",
    registers: [registry],
  })
  // the settings an alert measures against (three of the interval), each where this replica has it
  const setting = (value: number | undefined, name: string, help: string) => {
    if (value !== undefined) new Gauge({ name, help, registers: [registry] }).set(value)
  }
  setting(sources.pruneIntervalS, 'retention_interval_seconds', 'PRUNE_INTERVAL_S: seconds between two pruning passes of this replica')
  setting(
    sources.pollIntervalS,
    'poller_interval_seconds',
    "POLL_INTERVAL_S: seconds between two of this replica's poll cycles (each sleep 0.75 to 1.25 times it); no sample where no poller runs",
  )
  setting(
    sources.pollLongestCycleS,
    'poller_longest_cycle_seconds',
    "The longest one of this replica's poll cycles can last: POLL_LEASE_S, the longest GET with its Retry-After waits, and four statement timeouts; no sample where no poller runs",
  )

  const { databaseUp, dueOrders, parkedDeliveries, reactionJobs, oldestDelivery, dataDirStorage } = sources
  let droppedReported = 0
  new Counter({
    name: 'log_lines_dropped_total',
    help: 'Log lines this process dropped because stdout held LOG_BUFFER_LIMIT already (its reader behind or stopped)',
    registers: [registry],
    collect() {
      const dropped = droppedLogLines()
      this.inc(dropped - droppedReported)
      droppedReported = dropped
    },
  })
  if (dataDirStorage) {
    new OptionalGauge(dataDirStorage.freeBytes, {
      name: 'data_dir_free_bytes',
      help: 'Free space of the file system the embedded database (PGlite) keeps its data on, read every second; no sample before the first reading',
      registers: [registry],
    })
    new Gauge({
      name: 'data_dir_min_free_bytes',
      help: 'DATA_DIR_MIN_FREE: under it deliveries are answered 503 (storage_low) and /readyz turns 503',
      registers: [registry],
    }).set(dataDirStorage.minFreeBytes)
  }
  if (oldestDelivery) {
    const read = tolerantRead(oldestDelivery, readTimeoutMs)
    new OptionalGauge(
      async () => {
        const oldest = await read()
        // none stored: no sample (an empty table is not an old row)
        return oldest ? oldest.getTime() / 1000 : undefined
      },
      {
        name: 'webhook_oldest_delivery_timestamp_seconds',
        help: 'Unix time at which the oldest delivery row still stored was received (parked ones included): time() minus it is the retention actually kept',
        registers: [registry],
      },
    )
  }
  if (sources.tableSizes) {
    // one read feeds both gauges, kept for TABLE_SIZES_READ_MS; a read that failed is tried again at the next scrape
    const sizes = atMostEvery(tolerantRead(sources.tableSizes, readTimeoutMs), TABLE_SIZES_READ_MS, clock)
    new OptionalLabelledGauge(
      async () => {
        const read = await sizes()
        return read && new Map(read.flatMap(({ table, rows }) => (rows === null ? [] : [[table, rows] as const])))
      },
      {
        name: 'database_table_rows',
        help: `The planner's estimate of each of the service's tables' rows (pg_class.reltuples, as of its last VACUUM or ANALYZE), read at most every ${TABLE_SIZES_READ_MS / 1000} s; no sample for a table not estimated yet. order_status_history and orders are never pruned`,
        labelNames: ['table'],
        registers: [registry],
      },
    )
    new OptionalLabelledGauge(
      async () => {
        const read = await sizes()
        return read && new Map(read.map(({ table, bytes }) => [table, bytes] as const))
      },
      {
        name: 'database_table_bytes',
        help: `Bytes each of the service's tables takes with its indexes and TOAST (pg_total_relation_size), read at most every ${TABLE_SIZES_READ_MS / 1000} s`,
        labelNames: ['table'],
        registers: [registry],
      },
    )
  }
  if (databaseUp) {
    // both gauges of one scrape are fed by one query
    const state = onePerScrape(tolerantRead(databaseUp, readTimeoutMs))
    new Gauge({
      name: 'database_up',
      help: `1 when the database answered a query at scrape time (within ${readTimeoutMs} ms), 0 when not`,
      registers: [registry],
      async collect() {
        this.set((await state()) ? 1 : 0)
      },
    })
    new OptionalGauge(async () => {
      const current = await state()
      return current && Number(current.readOnly)
    }, {
      name: 'database_read_only',
      help: '1 when the database takes no writes (a standby, a failover under way, default_transaction_read_only): webhooks are answered 503; no sample when it did not answer',
      registers: [registry],
    })
  }
  if (sources.databaseClockOffset) {
    const read = tolerantRead(sources.databaseClockOffset, readTimeoutMs)
    new OptionalGauge(async () => {
      const offsetMs = await read()
      return offsetMs === undefined ? undefined : Math.round(offsetMs) / 1000
    }, {
      name: 'database_clock_offset_seconds',
      help: "Seconds the database's clock is ahead of this replica's (negative: behind), read at scrape time (its clock_timestamp() against the middle of the query's round trip here); leases, retention and received times compare clocks of several machines; Postgres only; no sample when the database did not answer",
      registers: [registry],
    })
  }
  if (sources.autovacuumOff) {
    flagGauge(registry, sources.autovacuumOff, {
      name: 'database_autovacuum_off',
      help: "1 when the database's autovacuum (or track_counts) was off at the service's last look, every 10 s: the service analyzes its tables itself, but nothing VACUUMs them, so the space of pruned rows is not reused; Postgres only; no sample before the first look",
    })
  }
  if (sources.notificationsHeard) {
    flagGauge(registry, sources.notificationsHeard, {
      name: 'database_notifications_heard',
      help: "1 when this replica's listener heard the NOTIFY it sent itself through the pool on its last (re)connect, 0 when it did not within 10 s (a pooler in transaction mode: set DATABASE_LISTEN_URL); no sample before the first answer",
    })
  }
  if (dueOrders) {
    scrapeTimeGauges(registry, tolerantRead(dueOrders, readTimeoutMs), {
      ordersDue: {
        name: 'poller_orders_due',
        help: `Orders whose poll has come due and has not been answered: waiting for a claim, held by a cycle, or backing off after failed polls; counted up to ${DUE_COUNT_CAP}`,
      },
      oldestDueAgeS: {
        name: 'poller_oldest_due_age_seconds',
        help: 'How long the longest-waiting of them has been due, counted from when it came due whether a cycle holds it or it backs off after failed polls; 0 when none is',
      },
    })
  }
  const ordersNeedingAttention = sources.ordersNeedingAttention
  if (ordersNeedingAttention) {
    const read = tolerantRead(ordersNeedingAttention, readTimeoutMs)
    new OptionalLabelledGauge(
      async () => {
        const rows = await read()
        if (!rows) return undefined
        // every known flag has a sample, 0 when no order has it: the alert on it ends at 0, not on a missing series
        const byFlag = new Map<string, number>(ATTENTION_FLAGS.map((flag) => [flag, 0]))
        for (const row of rows) byFlag.set(row.attention, row.orders)
        return byFlag
      },
      {
        name: 'orders_needing_attention',
        help: `Orders flagged for an operator and polled no more until one requeues them (reconcile --requeue; trade_create_unknown: until a trade is linked or the create sent again), by flag (${ATTENTION_FLAGS.join(', ')})`,
        labelNames: ['flag'],
        registers: [registry],
      },
    )
  }
  if (parkedDeliveries) {
    scrapeTimeGauges(registry, tolerantRead(parkedDeliveries, readTimeoutMs), {
      parked: {
        name: 'webhook_parked_deliveries',
        help: 'Deliveries parked as unmatched: no order has their external reference yet',
      },
      oldestParkedAgeS: {
        name: 'webhook_oldest_parked_age_seconds',
        help: 'How long the oldest parked delivery has waited for its order; 0 when none is parked',
      },
    })
  }
  if (reactionJobs) {
    scrapeTimeGauges(registry, tolerantRead(reactionJobs, readTimeoutMs), {
      pending: { name: 'reaction_jobs_pending', help: 'Reaction jobs waiting to run (due, or after a backoff)' },
      running: { name: 'reaction_jobs_running', help: 'Reaction jobs claimed by a replica now' },
      failed: {
        name: 'reaction_jobs_failed',
        help: "Reaction jobs failed after their last attempt (dead letter): each holds back its order's later events for its handler",
      },
      oldestPendingAgeS: {
        name: 'reaction_oldest_pending_age_seconds',
        help: 'How long ago the oldest reaction job still to run was enqueued; 0 when none',
      },
    })
  }
  const poolStats = sources.poolStats
  if (poolStats) {
    new Gauge({
      name: 'database_pool_connections',
      help: 'Database connections by state (in_use, idle) and callers waiting for one',
      labelNames: ['state'] as const,
      registers: [registry],
      collect() {
        const stats = poolStats()
        this.set({ state: 'in_use' }, stats.total - stats.idle)
        this.set({ state: 'idle' }, stats.idle)
        this.set({ state: 'waiting' }, stats.waiting)
      },
    })
  }

  let hooks: PollerHooks | undefined
  return {
    registry,
    startedAt: startedAtWall,
    deliveries,
    signatureFailures,
    signatureMismatchesResent,
    ingestSeconds,
    ingestBatchSize,
    pollResults,
    requestsRefused,
    consoleAuthRefused,
    clockOffsetRefused,
    inflightBodyBytes,
    partnerApiHooks: {
      onClockOffset: (offsetS) => {
        clockOffsetS = offsetS
      },
    },
    retentionHooks: {
      onPruned: (what, rows) => rowsPruned.inc({ what }, rows),
      onPass: (finishedAt) => {
        lastPruneS = finishedAt.getTime() / 1000
        lastPass.mark()
      },
    },
    reactionHooks(handlers) {
      for (const handler of handlers) {
        for (const result of ATTEMPT_RESULTS) reactionAttempts.inc({ handler, result }, 0)
        reactionPulledForward.inc({ handler }, 0)
      }
      return {
        onAttempt: (handler, result, count = 1) => reactionAttempts.inc({ handler, result }, count),
        onFirstStart: (handler, latencyS) => reactionLatency.observe({ handler }, latencyS),
        onFailure: (handler, code) => reactionFailures.inc({ handler, code }),
        onPulledForward: (handler, jobs) => reactionPulledForward.inc({ handler }, jobs),
        onPositionsAhead: (aheadBy) => {
          positionsAhead = aheadBy
        },
      }
    },
    pollerHooks(clock) {
      hooks ??= (() => {
        const cycle = ageSince(clock)
        lastCycle = cycle
        lastCycleS = clock.now() / 1000
        cycle.mark()
        return {
          onPollResult: ({ result }) => pollResults.inc({ result }),
          onCycle: (summary) => {
            lastCycleS = summary.finishedAt.getTime() / 1000
            cycle.mark()
          },
        }
      })()
      return hooks
    },
  }
}

interface MonotonicAge {
  /** The moment counted from: now. */
  mark(): void
  /** Seconds from the last mark to now, to the millisecond; undefined before the first mark. */
  seconds(): number | undefined
}

/** An age on `clock`'s monotonic time: what a step of the wall clock (NTP, an operator, a VM resumed) does not move. */
function ageSince(clock: Clock): MonotonicAge {
  let markedAt: number | undefined
  return {
    mark: () => {
      markedAt = monotonicNow(clock)
    },
    seconds: () => (markedAt === undefined ? undefined : Math.round(monotonicNow(clock) - markedAt) / 1000),
  }
}

/**
 * A gauge whose value is read at scrape time and that has no sample while the value is unknown
 * (undefined), where prom-client would show 0: a made-up 0 would resolve an alert, an old value hold one.
 */
class OptionalGauge extends Gauge {
  readonly #read: () => Promise<number | undefined> | number | undefined

  constructor(
    read: () => Promise<number | undefined> | number | undefined,
    configuration: { name: string; help: string; registers: Registry[] },
  ) {
    super(configuration)
    this.#read = read
  }

  override async get(): ReturnType<Gauge['get']> {
    const current = await this.#read()
    if (current !== undefined) this.set(current)
    const metric = await super.get()
    return current === undefined ? { ...metric, values: [] } : metric
  }
}

/** A gauge of 1 or 0 for what `read` answers, and no sample while it answers undefined (not known yet). */
function flagGauge(registry: Registry, read: () => boolean | undefined, configuration: { name: string; help: string }): void {
  new OptionalGauge(() => {
    const flag = read()
    return flag === undefined ? undefined : Number(flag)
  }, { ...configuration, registers: [registry] })
}

/** OptionalGauge with one label: a sample for each value the read answers, none while the read failed. */
class OptionalLabelledGauge extends Gauge<string> {
  readonly #read: () => Promise<ReadonlyMap<string, number> | undefined>
  readonly #label: string

  constructor(
    read: () => Promise<ReadonlyMap<string, number> | undefined>,
    configuration: { name: string; help: string; labelNames: [string]; registers: Registry[] },
  ) {
    super(configuration)
    this.#read = read
    this.#label = configuration.labelNames[0]
  }

  override async get(): ReturnType<Gauge['get']> {
    const current = await this.#read()
    // a label value the read no longer answers keeps no old sample
    this.reset()
    for (const [value, count] of current ?? []) this.set({ [this.#label]: value }, count)
    return super.get()
  }
}

/**
 * Wraps a database read for a scrape: undefined instead of an error, and after `timeoutMs` at most, so
 * /metrics keeps answering (database_up 0) while the database is down or hangs. A read still running is
 * shared by the next scrape instead of starting another, so a hung database does not pile up queries.
 */
function tolerantRead<T>(read: () => Promise<T>, timeoutMs: number): () => Promise<T | undefined> {
  let inFlight: Promise<T> | undefined
  return async () => {
    inFlight ??= Promise.resolve().then(read).finally(() => {
      inFlight = undefined
    })
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<undefined>((resolve) => {
      timer = setTimeout(resolve, timeoutMs, undefined)
    })
    try {
      return await Promise.race([inFlight, timeout])
    } catch {
      return undefined
    } finally {
      clearTimeout(timer)
    }
  }
}

/**
 * `read`'s last answer for `intervalMs` after it came (by `clock`'s monotonic time), so what it reads is read at most
 * that often however often Prometheus scrapes; an undefined answer (a read that failed) is not kept.
 */
function atMostEvery<T>(read: () => Promise<T | undefined>, intervalMs: number, clock: Clock): () => Promise<T | undefined> {
  let kept: { value: T; at: number } | undefined
  let reading: Promise<T | undefined> | undefined
  return () => {
    if (kept && monotonicNow(clock) - kept.at < intervalMs) return Promise.resolve(kept.value)
    reading ??= read()
      .then((value) => {
        if (value !== undefined) kept = { value, at: monotonicNow(clock) }
        return value
      })
      .finally(() => {
        reading = undefined
      })
    return reading
  }
}

/** `read`, shared by every caller while one is under way: the gauges of one scrape, collected together, read once. */
function onePerScrape<T>(read: () => Promise<T>): () => Promise<T> {
  let scrape: Promise<T> | undefined
  return () => {
    scrape ??= read().finally(() => {
      scrape = undefined
    })
    return scrape
  }
}

/** Several gauges fed by one read per scrape; none has a sample when the read failed. */
function scrapeTimeGauges<Key extends string>(
  registry: Registry,
  read: () => Promise<Record<Key, number> | undefined>,
  gauges: Record<Key, { name: string; help: string }>,
): void {
  // the gauges of one scrape are collected together: one read feeds them all
  const shared = onePerScrape(read)
  for (const key of Object.keys(gauges) as Key[]) {
    new OptionalGauge(async () => (await shared())?.[key], { ...gauges[key], registers: [registry] })
  }
}
