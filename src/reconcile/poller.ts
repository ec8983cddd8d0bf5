// The poller as the service runs it: a loop of reconciliation cycles (reconcile-cycle.ts) on an injected
// clock. After a cycle it sleeps POLL_INTERVAL_S give or take a quarter, at random (replicas started together
// by a deploy would otherwise poll in step, and the first claim of each tick would take every due order),
// or starts the next one at once when the batch was full
// (more is due than one batch holds), or, after the platform refused our credentials, asked us to slow down
// (429, Retry-After) or failed poll after poll (5xx, no answer), sleeps longer each time in a row (doubling up to the
// backoff cap) so a misconfigured or throttled replica, or a platform in an outage, is not hammered.
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Config, PartnerEnv } from '../config.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import type { ObservationSettings } from '../orders/apply-observation.js'
import { createWaitMs } from '../trades/open-trade-for-order.js'
import { STATEMENT_ANSWER_GRACE_MS } from '../db/statement-timeout.js'
import { longestGetMs, longestGetWithRetryAfterMs } from '../partner-api/partner-api-transport.js'
import { DEFAULT_BACKOFF } from './backoff-delay.js'
import { longestPollMs } from './poll-lease.js'
import { POLL_JITTER } from './poll-jitter.js'
import type { PollResult, TradeFetcher } from './poll-order.js'
import { countDueOrders, type DueOrderStats } from '../orders/poll-schedule.repository.js'
import { CycleFailedError, type CycleSettings, type RunSummary, runReconcileCycle } from './reconcile-cycle.js'
import { finishRun } from './reconcile-run.repository.js'
import { type ClockGuard, clockOffMessage } from '../db/clock-guard.js'
import { createSchemaWatch } from '../db/schema-watch.js'
import { limitLines } from '../limit-lines.js'

export type { PollResult, PollResultKind, TradeFetcher } from './poll-order.js'
export { POLL_RESULTS } from './poll-order.js'
export type { DueOrderStats } from '../orders/poll-schedule.repository.js'
export type { RunSummary, StoppedReason } from './reconcile-cycle.js'
export { CycleFailedError, DATABASE_LOST_REASON } from './reconcile-cycle.js'


/** Runs left unfinished by a lost database that one poller remembers, to record their end when it is back. */
const MAX_UNFINISHED_RUNS = 100

/**
 * The longest wait between cycles while the platform fails as a whole (or POLL_INTERVAL_S where that is longer):
 * a cycle that finds it failing costs it a few calls, so five minutes protects it as well as an hour did, and its
 * return is noticed within five minutes, not an hour. It is below the stalled-poller alert's bound (10 minutes at
 * least), which a backoff of up to an hour passed 15 to 20 minutes into every outage.
 */
export const PLATFORM_FAILING_CAP_S = 300

/** The statements a cycle may wait on after its last poll's answer: its write-back, a flag or NOTIFY, the claims given back, the run's end. */
const STATEMENTS_AFTER_LAST_POLL = 4

/**
 * The longest a cycle can run, from its start to its run's end recorded: no poll starts past the lease, the last one
 * may take the longest GET there is (its Retry-After waits included), and each statement after it is bounded by
 * DATABASE_STATEMENT_TIMEOUT_MS. A run with no end past this is not under way (reportedRun, reconcile-run.repository.ts),
 * and the stalled-poller alert allows it (poller_longest_cycle_seconds).
 */
export function longestCycleMs({
  poll,
  partner,
  databaseStatementTimeoutMs,
}: {
  poll: Pick<Config['poll'], 'leaseS'>
  partner: Pick<Config['partner'], 'timeoutMs'>
  databaseStatementTimeoutMs: number
}): number {
  return (
    poll.leaseS * 1000 +
    longestGetWithRetryAfterMs(partner.timeoutMs) +
    STATEMENTS_AFTER_LAST_POLL * (databaseStatementTimeoutMs + STATEMENT_ANSWER_GRACE_MS)
  )
}

/** The cycle's settings (CycleSettings: POLL_CONCURRENCY, POLL_BATCH_SIZE, POLL_LEASE_S, ...) and how long to sleep between cycles. */
export interface PollerSettings extends CycleSettings {
  /** POLL_INTERVAL_S: the mean sleep between cycles that did not fill their batch (±25%, see POLL_JITTER). */
  intervalS: number
}

/** The poller's settings from the POLL_* variables (POLL_LEASE_S among them), with the observation settings bound once. */
export function pollerSettings(
  poll: Config['poll'],
  observation: ObservationSettings,
  partner: Pick<Config['partner'], 'timeoutMs'>,
  databaseStatementTimeoutMs: number,
): PollerSettings {
  return {
    intervalS: poll.intervalS,
    concurrency: poll.concurrency,
    batchSize: poll.batchSize,
    observation,
    leaseS: poll.leaseS,
    unresolvedCreateAfterS: poll.expectedWebhookS,
    createWholeTimeMs: createWaitMs(partner.timeoutMs),
    getCall: { timeoutMs: partner.timeoutMs, longestMs: longestGetMs(partner.timeoutMs) },
    longestPollMs: longestPollMs(partner.timeoutMs, databaseStatementTimeoutMs),
  }
}

export interface PollerDeps {
  db: Kysely<Database>
  fetcher: TradeFetcher
  clock: Clock
  logger: Logger
  settings: PollerSettings
  /** Names this process in reconcile_runs (e.g. host:pid). */
  replica: string
  /** Jitter source in [0, 1): the sleep between cycles, and each order's error backoff. */
  random?: () => number
  /** Called once per poll with its result: the metrics hook (count by `result.result`). */
  onPollResult?: (result: PollResult) => void
  /** Called after every cycle that finished (empty ones too): the metrics hook that shows the loop is alive. */
  onCycle?: (summary: RunSummary) => void
  /**
   * Asked before each cycle: while this machine's clock is far from the database's no cycle runs (no claim, no run
   * recorded) and runOnce rejects with ClockOffError (db/clock-guard.ts); and before each poll of a cycle, whose refusal
   * stops it (`clock_offset`, reconcile-cycle.ts). The service passes one.
   */
  clockGuard?: ClockGuard | undefined
}

/** runOnce's refusal while this machine's clock is far from the database's (db/clock-guard.ts). */
export class ClockOffError extends Error {
  readonly code = 'clock_offset'
  constructor(readonly offsetMs: number) {
    super(clockOffMessage(offsetMs))
    this.name = 'ClockOffError'
  }
}

export interface Poller {
  /** Starts the loop; a second call while running does nothing. */
  start(): void
  /** Aborts the sleep and the cycle in flight (its unfinished claims are given back) and waits for it. */
  stop(): Promise<void>
  /** Runs one cycle now (recorded in reconcile_runs even when nothing was due) and answers its summary. */
  runOnce(): Promise<RunSummary>
  readonly running: boolean
}

export function createPoller(deps: PollerDeps): Poller {
  const { clock, logger, settings } = deps
  const random = deps.random ?? Math.random
  const backoff = settings.backoff ?? DEFAULT_BACKOFF
  // once a statement met the schema not whole (a table or a column missing), no order is claimed until it is whole
  // again: each claimed order was polled at the platform, its answer not written (db/schema-watch.ts)
  const schema = createSchemaWatch(deps.db)
  const schemaNotWhole = limitLines((fields: { err?: unknown }) =>
    logger.warn(fields, "poller waits: the database's schema is not whole (a table, a column or a migration of this build missing): no order is claimed until it is"),
  )
  const cycleDeps = { ...deps, settings: { ...settings, backoff }, schema }
  // runs whose cycle lost the database after writing them: without this they would show as running for good,
  // as a dead replica's do, though this replica lived on
  const unfinishedRuns: CycleFailedError[] = []
  const finishUnfinishedRuns = async () => {
    while (unfinishedRuns.length > 0) {
      const failed = unfinishedRuns[0]!
      try {
        await finishRun(deps.db, failed.runId, failed.run)
      } catch {
        // still away: the next cycle tries again
        return
      }
      unfinishedRuns.shift()
      logger.info({ runId: failed.runId, replica: deps.replica }, 'recorded the end of a reconcile run that lost the database')
    }
  }
  const runCycle = async (options: { signal: AbortSignal; recordEmpty?: boolean }) => {
    if (deps.clockGuard && !(await deps.clockGuard.allows('poller'))) throw new ClockOffError(deps.clockGuard.offsetMs ?? 0)
    await finishUnfinishedRuns()
    let summary: RunSummary
    try {
      summary = await runReconcileCycle(cycleDeps, options)
    } catch (error) {
      if (error instanceof CycleFailedError) {
        if (unfinishedRuns.length >= MAX_UNFINISHED_RUNS) unfinishedRuns.shift()
        unfinishedRuns.push(error)
        throw error.cause
      }
      throw error
    }
    try {
      deps.onCycle?.(summary)
    } catch (error) {
      logger.warn({ err: error }, 'onCycle hook threw')
    }
    return summary
  }
  let controller: AbortController | undefined
  let loop: Promise<void> | undefined
  const onceRuns = new Set<Promise<RunSummary>>()
  // one controller per start..stop: stop() aborts the loop and any runOnce() in flight alike
  const stopSignal = () => {
    controller ??= new AbortController()
    return controller.signal
  }

  // doubling with each refused cycle in a row, up to the backoff's cap
  const longerEachTime = (inARow: number, capS = backoff.capS) => Math.min(capS, settings.intervalS * 2 ** inARow) * 1000
  const atTheInterval = () => Math.round(settings.intervalS * 1000 * (1 - POLL_JITTER + 2 * POLL_JITTER * random()))

  const sleepAfter = (summary: RunSummary, inARow: { unauthorized: number; throttled: number; failing: number }): number => {
    if (inARow.unauthorized > 0) return longerEachTime(inARow.unauthorized)
    // the platform failing as a whole: its outage is not met with the next batch at once, nor at the interval, but
    // looked at again at least every PLATFORM_FAILING_CAP_S, so its return is noticed within minutes
    if (inARow.failing > 0) return longerEachTime(inARow.failing, Math.max(PLATFORM_FAILING_CAP_S, settings.intervalS))
    if (summary.stoppedReason === null && summary.claimed >= settings.batchSize) return 0
    // the platform asked us to wait: no cycle before then, and longer each time it asks again in a row. At the
    // interval alone, each cycle claimed the next due orders and drew a 429 for them: with POLL_INTERVAL_S=1, two
    // replicas and 60 orders due, 9 requests a second to a platform answering 429 throughout (15 with Retry-After: 0)
    if (summary.throttledUntil) return Math.max(longerEachTime(inARow.throttled), summary.throttledUntil.getTime() - clock.now())
    return atTheInterval()
  }

  const runLoop = async (signal: AbortSignal) => {
    const inARow = { unauthorized: 0, throttled: 0, failing: 0 }
    while (!signal.aborted) {
      let summary: RunSummary | undefined
      try {
        if (!(await schema.whole())) {
          schemaNotWhole({})
          await clock.sleep(settings.intervalS * 1000, signal).catch(() => {})
          continue
        }
        summary = await runCycle({ signal })
        inARow.unauthorized = summary.stoppedReason === 'unauthorized' ? inARow.unauthorized + 1 : 0
        inARow.throttled = summary.throttledUntil ? inARow.throttled + 1 : 0
        inARow.failing = summary.stoppedReason === 'platform_failing' ? inARow.failing + 1 : 0
      } catch (error) {
        // this machine's clock far from the database's: the guard said so once; looked at again after the interval
        // the database is down or refused: nothing is lost, claims not written back come due after the lease
        if (schema.met(error)) schemaNotWhole({ err: error })
        else if (!(error instanceof ClockOffError)) logger.warn({ err: error }, 'reconcile cycle failed; trying again after the poll interval')
      }
      if (signal.aborted) break
      // a cycle that failed on the database tries again after the interval, as its line says; the counters stay, so
      // a platform still failing (or refusing us) then goes on backing off where it was. It slept the platform's
      // backoff instead (an hour at most), and a database back within a minute was not looked at for 11 (a review)
      const delayMs = summary ? sleepAfter(summary, inARow) : atTheInterval()
      try {
        if (delayMs > 0) await clock.sleep(delayMs, signal)
        // a full batch: let the event loop breathe before the next claim
        else await new Promise((resolve) => setImmediate(resolve))
      } catch {
        // aborted: the while condition ends the loop
      }
    }
  }

  return {
    get running() {
      return loop !== undefined
    },
    start() {
      if (loop) return
      logger.info(
        {
          replica: deps.replica,
          intervalS: settings.intervalS,
          concurrency: settings.concurrency,
          batchSize: settings.batchSize,
          leaseS: settings.leaseS,
        },
        'poller started',
      )
      loop = runLoop(stopSignal())
    },
    async stop() {
      controller?.abort(new Error('poller stopping'))
      await Promise.allSettled([loop, ...onceRuns])
      // a line held back for the end of its second is written before "stopped" (limit-lines.ts)
      schemaNotWhole.flush()
      if (loop) logger.info({ replica: deps.replica }, 'poller stopped')
      loop = undefined
      controller = undefined
    },
    runOnce() {
      const run = runCycle({ signal: stopSignal(), recordEmpty: true })
      onceRuns.add(run)
      void run.finally(() => onceRuns.delete(run)).catch(() => {})
      return run
    },
  }
}

/** Orders due now and the age of the oldest: the poller gauges (one query on the due index), of PARTNER_ENV's orders. */
export function dueOrderStats(db: Kysely<Database>, clock: Clock, partnerEnv?: PartnerEnv): Promise<DueOrderStats> {
  return countDueOrders(db, new Date(clock.now()), partnerEnv)
}
