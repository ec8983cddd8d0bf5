// One reconciliation cycle of one replica: claim up to batchSize due orders, poll them with bounded
// concurrency, write each result back under the claim's lease, record the run.
//
// Stops early, giving every claim it has not finished back (due again as before, attempt not counted),
// when the platform answers 401 (our credentials are wrong, or this machine's clock is, which the answer's
// Date shows: polling the rest would get 401 too and could get the key locked, so one clear error is logged
// instead) or when the caller's signal aborts (shutdown). A 401 that comes from a call in flight while the cycle
// stops for another reason (one of those below, or a shutdown) is counted and logged as any 401, and makes the
// cycle's reason `unauthorized`: it is the platform's word that our credentials are wrong.
// It also stops when the platform asks us to slow down (a 429, or a Retry-After, after the client's own
// retries): polling the rest would meet the same limit, so their claims are given back due no sooner than
// the Retry-After (at most the backoff's cap, 1 h: see throttledFor), and the poller's next cycle waits for it
// too (poller.ts).
// And it stops when the platform is failing as a whole: as many polls in a row as run at once (POLL_CONCURRENCY, 5 at
// least) each ended in an error of the platform's after the client's own retries (5xx, no answer, a timeout) with no
// answer between them. Polling the rest would send each of them its retries too: 3,000 orders due with the platform
// answering 503 drew about 29 requests a second at POLL_CONCURRENCY=8, and 105 at 32, for as long as it lasted. Their
// claims are given back untried (due again as before), and the poller's next cycle waits longer each time in a row.
// And it stops when the clock guard, asked before each poll starts, refuses: this machine's clock stepped away from the
// database's while the cycle ran (each poll's next due time and the run's end would be written by it). The polls in
// flight finish; no other starts, the claims not polled are given back (due again at once), and the run is recorded
// as stopped (`clock_offset`).
// No poll starts once the lease has less than the longest poll left (CycleSettings.longestPollMs): one started later
// could outlast the lease, another replica claim the order again, and its answer be thrown away (lease_lost). The
// claims not polled for that reason are given back untried (due again at once) for the next cycle.
import { randomUUID } from 'node:crypto'
import { setMaxListeners } from 'node:events'
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { ClockGuard } from '../db/clock-guard.js'
import type { Logger } from '../logger.js'
import type { ObservationSettings } from '../orders/apply-observation.js'
import { describeClockOffset } from '../partner-api/clock-offset.js'
import { describeDatabaseError, isSchemaMissing } from '../db/database-errors.js'
import type { SchemaWatch } from '../db/schema-watch.js'
import { isPlatformFailure, PartnerApiError, PartnerNotSentError } from '../partner-api/partner-api-error.js'
import { type BackoffSettings, DEFAULT_BACKOFF } from './backoff-delay.js'
import {
  POLL_RESULTS,
  type PollResult,
  type PollResultKind,
  pollOrder,
  throttledFor,
  type TradeFetcher,
} from './poll-order.js'
import { type ClaimedOrder, claimDueOrders, flagUnresolvedCreates, releaseClaims } from '../orders/poll-schedule.repository.js'
import { finishRun, type RunCounts, startRun } from './reconcile-run.repository.js'

export const UNAUTHORIZED_MESSAGE =
  'partner api rejected our credentials: check PARTNER_API_KEY_ID / PARTNER_API_SECRET / PARTNER_ENV'

/** The 401's line: the credentials, or the clocks when the platform's answer showed them far apart. */
export function unauthorizedMessage(clockOffsetS: number | null): string {
  if (clockOffsetS === null) return UNAUTHORIZED_MESSAGE
  return `partner api refused our requests (401): ${describeClockOffset(clockOffsetS)}`
}

export const THROTTLED_MESSAGE =
  'the platform asked us to slow down (429 or Retry-After): cycle stopped, the orders not polled are due again after its wait'

export const CLOCK_STEPPED_MESSAGE =
  "this machine's clock stepped away from the database's while a reconcile cycle ran: the polls in flight finished, no other started, the orders not polled were given back (due again now)"

export const PLATFORM_FAILING_MESSAGE =
  'the platform is failing (polls in a row ended in its errors after their retries): cycle stopped, the orders not polled are given back; the next cycle waits longer each time'

export const SCHEMA_NOT_WHOLE_MESSAGE =
  "a poll's write met the database's schema not whole (a table or a column missing: a restore under way, or of an older dump): " +
  'cycle stopped, the orders not polled are given back untried; none is claimed until the schema is whole'

/** The fewest polls in a row that must fail at the platform before a cycle stops (PLATFORM_FAILING_MESSAGE). */
export const PLATFORM_FAILING_MIN_IN_A_ROW = 5

export interface CycleSettings {
  /** POLL_BATCH_SIZE: orders claimed per cycle. */
  batchSize: number
  /** POLL_CONCURRENCY: GETs in flight at once. */
  concurrency: number
  /** STALE_AFTER_S and the reaction handlers, as a poll's answer is applied (observations.ts). */
  observation: ObservationSettings
  /** POLL_LEASE_S: how long a claim is this replica's alone (poll-lease.ts); a cycle should finish well inside it. */
  leaseS: number
  /** Error backoff per order; DEFAULT_BACKOFF (30 s doubling to 1 h) when absent. */
  backoff?: BackoffSettings
  /**
   * EXPECTED_WEBHOOK_S: an order whose trade create got no answer, with no trade linked this long after, is flagged
   * trade_create_unknown by each cycle. Absent: not looked for (a cycle run for a test of something else).
   */
  unresolvedCreateAfterS?: number
  /**
   * trades open's whole time for a create (PARTNER_API_TIMEOUT_MS and its margin), for a `pending` create marked before
   * trade_create_wait_ms held each command's own: one marked since is its command's call still in flight, and is not
   * flagged yet, however short EXPECTED_WEBHOOK_S is.
   */
  createWholeTimeMs?: number
  /** PARTNER_API_TIMEOUT_MS and the longest one GET can take with it (longestGetMs), named when a cycle outlived its lease. */
  getCall?: { timeoutMs: number; longestMs: number }
  /**
   * The longest one poll can last (longestPollMs in poll-lease.ts): no poll starts once the lease has less than this
   * left. Absent: 0, a poll starts anywhere inside the lease (a test of something else).
   */
  longestPollMs?: number
}

export interface CycleDeps {
  db: Kysely<Database>
  fetcher: TradeFetcher
  clock: Clock
  logger: Logger
  /** Names this process in reconcile_runs (e.g. host:pid). */
  replica: string
  settings: CycleSettings
  /** Jitter source in [0, 1); tests pass a fixed one. */
  random?: () => number
  /** Called once per poll with its result: the metrics hook. */
  onPollResult?: (result: PollResult) => void
  /** Asked before each poll starts (the poller's, db/clock-guard.ts): a refusal stops the cycle (`clock_offset`). */
  clockGuard?: ClockGuard | undefined
  /** Told of a poll's write that met the schema not whole (the poller's, db/schema-watch.ts): the cycle stops (`schema_missing`). */
  schema?: SchemaWatch | undefined
}

/**
 * unauthorized: the platform answered 401; throttled: it asked us to slow down; platform_failing: polls in a row failed
 * there; clock_offset: the clock guard refused a poll (this machine's clock moved far from the database's mid-cycle);
 * shutdown: the caller aborted the cycle; schema_missing: a poll's write met a table or a column of the service's missing
 * (a restore under way, or of an older build's dump): every other poll's would too, after its call to the platform.
 */
export type StoppedReason = 'unauthorized' | 'throttled' | 'platform_failing' | 'clock_offset' | 'shutdown' | 'schema_missing'

/**
 * The stopped_reason of a run whose cycle lost the database after the run was written: its end could not be
 * recorded then, and the poller records it once the database answers again (poller.ts).
 */
export const DATABASE_LOST_REASON = 'database'

/**
 * A cycle that failed on the database after its reconcile_runs row was written (giving its claims back, or
 * recording its end): `run` is what to write into that row once the database answers again, so the row does
 * not show as running, as a dead replica's does, for good. The message is the database error's.
 */
export class CycleFailedError extends Error {
  constructor(
    readonly runId: number,
    readonly run: RunCounts & { finishedAt: Date },
    cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause })
    this.name = 'CycleFailedError'
  }
}

export interface RunSummary {
  /** The reconcile_runs row; null when the cycle found nothing due and `recordEmpty` was off. */
  runId: number | null
  replica: string
  startedAt: Date
  finishedAt: Date
  /** Orders claimed; polled + released. */
  claimed: number
  /** Polls that came back with a result (any result). */
  polled: number
  /** Polls that moved the order (`applied`). */
  changed: number
  /** Polls that got no usable answer: error + not_found + trade_mismatch + unusable_trade_id + unauthorized. */
  errors: number
  /** Claims given back because the cycle stopped (untried, or refused with 401): due again as before. */
  released: number
  results: Record<PollResultKind, number>
  stoppedReason: StoppedReason | null
  /** Throttled: until when the platform asked us to wait (no later poll of this replica's comes sooner). */
  throttledUntil: Date | null
  /**
   * Unauthorized: seconds the platform's clock is ahead of ours (negative: behind) when its 401 showed them
   * further apart than CLOCK_OFFSET_THRESHOLD_S (the likely cause), else null.
   */
  clockOffsetS: number | null
  /** The first poll that failed (`error`): its order and why, for the operator who ran the cycle by hand; null if none did. */
  firstFailure: PollFailure | null
  /** The external references of the orders this cycle flagged trade_create_unknown (a create never answered, no webhook). */
  flaggedCreates: string[]
}

export interface PollFailure {
  externalReference: string
  reason: string
  /** No connection to the platform could be made (nor to its proxy): the call was never sent. */
  notSent: boolean
}

/**
 * Why a poll failed, in words for an operator: the platform's failure in its own words (the client shortens them and
 * never quotes a body), the database's by its classification, as its text may quote the order.
 */
export function pollFailureReason(error: unknown): string {
  if (error instanceof PartnerNotSentError) return `could not reach the platform at ${error.url}: ${error.reason}`
  if (isPlatformFailure(error)) return `the platform: ${error.message}`
  return describeDatabaseError(error).message
}

/** The most references a `trade_create_unknown` warning names; the rest are counted. */
const MAX_NAMED_REFERENCES = 20

// A create sent and never answered, whose webhook was lost too: no trade id, so nothing to poll, and nothing else
// looks at the order again. Flagged for an operator, once, with a warning.
// Judged by the database's clock, which the create's marks are stamped with, not this replica's.
async function flagUnresolved({ db, logger }: CycleDeps, afterS: number, createWholeTimeMs = 0): Promise<string[]> {
  const references = await flagUnresolvedCreates(db, { unresolvedAfterS: afterS, createWholeTimeMs })
  if (references.length === 0) return references
  logger.warn(
    { orders: references.length, externalReferences: references.slice(0, MAX_NAMED_REFERENCES) },
    'orders flagged trade_create_unknown: their trade create got no answer and no webhook has linked a trade; ' +
      'check the platform for a trade with their reference (its next webhook links it), or send the create again with `trades open REFERENCE --retry`',
  )
  return references
}

export async function runReconcileCycle(
  deps: CycleDeps,
  { signal, recordEmpty = false }: { signal?: AbortSignal; recordEmpty?: boolean } = {},
): Promise<RunSummary> {
  const { db, clock, logger, replica, settings } = deps
  const startedAt = new Date(clock.now())
  const leaseToken = randomUUID()
  const results = Object.fromEntries(POLL_RESULTS.map((kind) => [kind, 0])) as Record<PollResultKind, number>

  let flaggedCreates: string[] = []
  if (settings.unresolvedCreateAfterS !== undefined && !signal?.aborted) {
    // its failure is its own: the orders due are still polled (a value out of the column's range failed every cycle
    // here, before any order was claimed; a database that is away fails the claim below too)
    flaggedCreates = await flagUnresolved(deps, settings.unresolvedCreateAfterS, settings.createWholeTimeMs).catch((error: unknown) => {
      logger.warn({ err: error }, 'could not look for unresolved trade creates; the poll goes on')
      return []
    })
  }
  const claimed = signal?.aborted
    ? []
    : await claimDueOrders(db, {
        now: startedAt,
        limit: settings.batchSize,
        leaseS: settings.leaseS,
        leaseToken,
        partnerEnv: settings.observation.partnerEnv,
      })
  const runId = claimed.length > 0 || recordEmpty ? await startRun(db, { replica, startedAt }) : null

  const stop = new AbortController()
  // each partner API call of the cycle listens to it while it runs (anySignal), POLL_CONCURRENCY at once: more
  // than Node's default of 10 listeners is expected here, and each one is removed when its call ends
  setMaxListeners(0, stop.signal)
  let stoppedReason: StoppedReason | null = null
  const onAbort = () => {
    stoppedReason ??= 'shutdown'
    stop.abort(signal?.reason)
  }
  signal?.addEventListener('abort', onAbort, { once: true })
  if (signal?.aborted) onAbort()

  const unpolled: ClaimedOrder[] = []
  // (a cast, not a declared type: the workers set it, which narrowing after the declaration would not see)
  let throttledUntil = null as Date | null
  let clockOffsetS = null as number | null
  let firstError: unknown
  let firstFailure: PollFailure | null = null
  let next = 0
  // polls in a row that failed at the platform, none answered between them
  let failingInARow = 0
  const failingAfter = Math.max(PLATFORM_FAILING_MIN_IN_A_ROW, settings.concurrency)
  // the claims are this cycle's alone until the lease ends: past it another replica may have claimed them
  // (they were due again), so none is polled from then on; they are given back below, and any another replica
  // claimed since stays its own (the token no longer matches)
  const leaseEndsAt = startedAt.getTime() + settings.leaseS * 1000
  // ... and none starts once less than the longest poll is left of it: a poll started later could outlast it
  const lastPollStartAt = leaseEndsAt - (settings.longestPollMs ?? 0)
  let outlivedLease = false
  // stopped inside the lease, with less than the longest poll left of it
  let lastPollStartPassed = false
  // the clock guard refused a poll: no other starts, the ones in flight finish
  let clockRefused = false
  // the one poll that took longest: a whole lease's worth in one poll is a process paused (or a clock jump) more
  // likely than a platform that slow
  let longestPollMs = 0
  const pollDeps = {
    db,
    fetcher: deps.fetcher,
    clock,
    logger,
    observation: settings.observation,
    backoff: settings.backoff ?? DEFAULT_BACKOFF,
    random: deps.random ?? Math.random,
  }
  const worker = async () => {
    while (!stop.signal.aborted && !clockRefused && next < claimed.length) {
      // the clock may have stepped since the cycle began (a poll's next due time and the run's end are written by it):
      // asked first, as a step past the lease's end is the clock's fault, not the lease's
      if (deps.clockGuard && !(await deps.clockGuard.allows('poller'))) {
        clockRefused = true
        stoppedReason ??= 'clock_offset'
        return
      }
      // (another worker may have taken the last claim, or the cycle stopped, meanwhile)
      if (stop.signal.aborted || clockRefused || next >= claimed.length) return
      const now = clock.now()
      if (now >= leaseEndsAt) {
        outlivedLease = true
        return
      }
      if (now > lastPollStartAt) {
        lastPollStartPassed = true
        return
      }
      const order = claimed[next++]!
      const pollStartedAt = clock.now()
      const result = await pollOrder(pollDeps, order, leaseToken, stop.signal)
      longestPollMs = Math.max(longestPollMs, clock.now() - pollStartedAt)
      if (result === null) {
        unpolled.push(order)
        continue
      }
      results[result.result]++
      const failed = result.result === 'error' || result.result === 'write_failed'
      if (failed || result.result === 'throttled') firstError ??= result.error
      if (failed) {
        firstFailure ??= {
          externalReference: result.externalReference,
          reason: pollFailureReason(result.error),
          notSent: result.error instanceof PartnerNotSentError,
        }
      }
      const throttledMs = result.result === 'throttled' ? throttledFor(result.error, pollDeps.backoff.capS * 1000) : undefined
      if (throttledMs !== undefined) {
        // the order itself was rescheduled after the wait; the rest go back with it (below)
        const until = new Date(clock.now() + throttledMs)
        if (throttledUntil === null || until > throttledUntil) throttledUntil = until
        if (stoppedReason === null) {
          stoppedReason = 'throttled'
          stop.abort(new Error(THROTTLED_MESSAGE))
        }
      }
      if ((result.result === 'write_failed' || result.result === 'error') && (deps.schema?.met(result.error) ?? isSchemaMissing(result.error))) {
        // the next polls' writes would meet it too, each after its call to the platform
        if (stoppedReason === null) {
          stoppedReason = 'schema_missing'
          stop.abort(new Error(SCHEMA_NOT_WHOLE_MESSAGE))
        }
      }
      if (result.result === 'error' && isPlatformFailure(result.error)) failingInARow++
      else if (result.result !== 'error' && result.result !== 'write_failed') failingInARow = 0
      if (failingInARow >= failingAfter && stoppedReason === null) {
        stoppedReason = 'platform_failing'
        stop.abort(new Error(PLATFORM_FAILING_MESSAGE))
      }
      if (result.result === 'unauthorized') {
        // nothing was written for it: it goes back with the rest
        unpolled.push(order)
        // a 401 says why the cycle stopped whatever stopped it first (a platform failing, a throttle, a shutdown): a
        // 401 that came while it was stopping is the same word on our credentials as one before, and outranks them
        if (stoppedReason !== 'unauthorized') {
          stoppedReason = 'unauthorized'
          if (result.error instanceof PartnerApiError) clockOffsetS = result.error.clockOffsetS ?? null
          stop.abort(new Error(unauthorizedMessage(clockOffsetS)))
        }
      }
      try {
        deps.onPollResult?.(result)
      } catch (error) {
        logger.warn({ err: error }, 'onPollResult hook threw')
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: Math.min(settings.concurrency, claimed.length) }, worker))
  } finally {
    signal?.removeEventListener('abort', onAbort)
  }
  const untried = claimed.slice(next)
  unpolled.push(...untried)

  const polled = POLL_RESULTS.reduce((sum, kind) => sum + results[kind], 0)
  // the run's end in the database's time when this clock stepped away from it (the guard's offset), not 10 min ahead
  const offsetMs = stoppedReason === 'clock_offset' ? (deps.clockGuard?.offsetMs ?? 0) : 0
  const endedAt = () => new Date(clock.now() + offsetMs)
  const errors = results.error + results.write_failed + results.throttled + results.not_found + results.trade_mismatch + results.unusable_trade_id + results.unauthorized
  // the database went away after the run was written: what the row should say once it is back
  const failed = (error: unknown) =>
    runId === null
      ? error
      : new CycleFailedError(
          runId,
          {
            finishedAt: endedAt(),
            polled,
            changed: results.applied,
            errors,
            stoppedReason: stoppedReason ?? DATABASE_LOST_REASON,
            clockOffsetS,
          },
          error,
        )
  const notBefore = throttledUntil
  let released: number
  try {
    released = await releaseClaims(
      db,
      leaseToken,
      notBefore ? unpolled.map((order) => (order.dueAt < notBefore ? { ...order, dueAt: notBefore } : order)) : unpolled,
    )
  } catch (error) {
    throw failed(error)
  }
  const summary: RunSummary = {
    runId,
    replica,
    startedAt,
    finishedAt: endedAt(),
    claimed: claimed.length,
    polled,
    changed: results.applied,
    errors,
    released,
    results,
    stoppedReason,
    throttledUntil,
    clockOffsetS,
    firstFailure,
    flaggedCreates,
  }
  if (runId !== null) {
    try {
      await finishRun(db, runId, {
        finishedAt: summary.finishedAt,
        polled: summary.polled,
        changed: summary.changed,
        errors: summary.errors,
        stoppedReason,
        clockOffsetS,
      })
    } catch (error) {
      throw failed(error)
    }
  }
  logCycle(logger, summary, firstError, deps.clockGuard?.offsetMs)
  if (lastPollStartPassed && !outlivedLease) {
    // stopped before the lease's end, with less than the longest poll left of it: nothing another replica holds
    logger.warn(
      { runId, replica, leaseS: settings.leaseS, longestPollS: Math.round((settings.longestPollMs ?? 0) / 1000), claimed: claimed.length, polled, untried: untried.length },
      'reconcile cycle reached the end of its poll lease less the longest poll: the orders not yet polled were given back untried, due again now ' +
        '(a poll started later could outlast the lease; a smaller POLL_BATCH_SIZE or a larger POLL_CONCURRENCY keeps a cycle inside it)',
    )
  } else if (outlivedLease) {
    // a pause of the process (SIGSTOP, a VM paused, a clock jump) shows as one poll that lasted most of the lease: the
    // advice about a slow platform was wrong for it
    const paused = longestPollMs >= (settings.leaseS * 1000) / 2
    // ... unless one GET can take that long: each of its attempts waits PARTNER_API_TIMEOUT_MS
    const getCall = settings.getCall
    const why = paused && getCall !== undefined && longestPollMs <= getCall.longestMs
      ? `one poll took ${Math.round(longestPollMs / 1000)} s, which one GET can take with PARTNER_API_TIMEOUT_MS=${getCall.timeoutMs} ` +
        `(its attempts together up to ${Math.round(getCall.longestMs / 1000)} s): lower PARTNER_API_TIMEOUT_MS, so that they fit well inside the lease (${settings.leaseS} s)`
      : paused
      ? `one poll took ${Math.round(longestPollMs / 1000)} s, half the lease or more: this process was likely paused (a stopped process, ` +
        'a paused VM) or its clock jumped; if the platform is that slow, lower PARTNER_API_TIMEOUT_MS'
      : 'the platform answers slowly: a smaller POLL_BATCH_SIZE or a larger POLL_CONCURRENCY keeps a cycle inside the lease'
    logger.warn(
      { runId, replica, leaseS: settings.leaseS, claimed: claimed.length, polled, untried: untried.length, longestPollS: Math.round(longestPollMs / 1000) },
      `reconcile cycle outlived its poll lease: the orders not yet polled were given back untried, as another replica may hold them now (${why})`,
    )
  }
  return summary
}

function logCycle(logger: Logger, summary: RunSummary, firstError: unknown, clockOffsetMs: number | undefined): void {
  const fields = {
    runId: summary.runId,
    replica: summary.replica,
    claimed: summary.claimed,
    polled: summary.polled,
    changed: summary.changed,
    errors: summary.errors,
    released: summary.released,
    results: summary.results,
    stoppedReason: summary.stoppedReason,
  }
  if (summary.stoppedReason === 'unauthorized') {
    logger.error({ ...fields, clockOffsetS: summary.clockOffsetS }, unauthorizedMessage(summary.clockOffsetS))
  } else if (summary.stoppedReason === 'throttled') {
    logger.warn({ ...fields, throttledUntil: summary.throttledUntil, err: firstError }, THROTTLED_MESSAGE)
  } else if (summary.stoppedReason === 'clock_offset') {
    // the guard's own error line says how far and what to fix
    logger.warn({ ...fields, offsetS: clockOffsetMs === undefined ? null : Math.round(clockOffsetMs / 1000) }, CLOCK_STEPPED_MESSAGE)
  } else if (summary.stoppedReason === 'platform_failing') {
    logger.warn({ ...fields, err: firstError }, PLATFORM_FAILING_MESSAGE)
  } else if (summary.stoppedReason === 'schema_missing') {
    logger.warn({ ...fields, err: firstError }, SCHEMA_NOT_WHOLE_MESSAGE)
  } else if (summary.results.error > 0) {
    // one line per cycle, not one per order: a platform outage must not flood the log
    logger.warn({ ...fields, err: firstError }, 'reconcile cycle done with errors: those orders back off')
  } else if (summary.claimed > 0) {
    logger.info(fields, 'reconcile cycle done')
  }
}
