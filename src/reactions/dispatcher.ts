// The dispatcher, on every replica of `serve`: one loop per handler's stream (stream-worker.ts: every
// event's first attempt, on the replica that holds the stream's lease), and the job loop below, which runs
// the jobs the streams wrote for later (reaction-job.repository.ts: retries, events held back behind an
// earlier one, handlers handed off). REACTION_CONCURRENCY bounds the calls of each handler, both paths together
// (createSlots, one set of slots per handler): a handler whose system hangs holds its own slots, never another's.
//
// The job loop claims due jobs, runs each handler with an AbortSignal (at most REACTION_CONCURRENCY of each at once),
// and writes the outcome back under the claim's lease token: done; or, after a throw,
// pending again after an exponential backoff with jitter, or the wait its error asked for (plan-retry.ts); or, once the
// job has used REACTION_MAX_ATTEMPTS or its error is permanent (a receiver's 410 Gone: plan-retry.ts), failed (the
// dead letter), which holds back that order's later events for that handler until an operator retries or skips it.
// An outcome whose write fails (the database away a moment) is written again, with backoff, while the lease lasts
// (write-outcome.ts): a job whose handler returned in a blip is recorded once the database is back, not left running
// for the rest of its lease and then called again.
// A job whose handler no longer takes its event's type (FORWARD_EVENTS or AMQP_EVENTS narrowed since it was
// written) is skipped without a call: the setting already said so, and the order's later events go on.
//
// When it looks: at once when a stream wrote jobs to run, on a NOTIFY (another replica's commit, an
// operator's retry or skip; passed in as `listen`), when one of its own handlers finished (a slot is free, and that order's next event may now
// be claimable), when a stream's handler gives back a slot after the loop found none free, at the earliest
// future run_at (a backoff ending, a lease running out), and at least
// every `safetyIntervalMs` (a notification lost with a connection, another replica's completion).
// And when a handler succeeds again after an outage, its retries waiting out a backoff are made due at once and
// the loop looks for them (recovery-watch.ts).
//
// A handler registered with a timeoutMs is aborted at it (call-timeouts.ts): a failed attempt, retried as any.
// A handler is aborted shortly before its lease ends: past it, another replica may claim the job again.
// Stop: no more claims; running handlers get up to `shutdownTimeoutMs` to finish, then are aborted and
// their leases given back (pending, due now, the interrupted attempt not counted), without waiting for a handler
// that ignores its abort. A job whose handler returned but whose outcome's write still fails then is not given back
// (that would call it again): its write is tried once more, and if the database is still away its lease runs out.
import { randomUUID } from 'node:crypto'
import { setMaxListeners } from 'node:events'
import { setTimeout as setTimeoutPromise } from 'node:timers/promises'
import { anySignal } from 'any-signal'
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { Unlisten } from '../db/open-database.js'
import { reactionChannel } from '../db/reaction-channel.js'
import type { Logger } from '../logger.js'
import {
  type ClaimedJob,
  claimReactionJobsAndNext,
  completeJobs,
  failJob,
  nextRunAt,
  releaseJobs,
  retryJobLater,
  skipJobNotTaken,
} from './reaction-job.repository.js'
import type { ReactionHandler } from './reaction-event.js'
import { ensureReactionStreams, oldestOpenTransaction, type OpenTransaction, streamPositionsAhead } from './reaction-stream.repository.js'
import { abortUnwindMs, type AttemptResult, type DispatcherSettings, HELD_BACK_WARN_MS, leaseMarginMs } from './dispatcher-settings.js'
import { withoutPassword } from '../without-password.js'
import { createSlots, type Slots } from './handler-slots.js'
import { type CallTimeouts, createCallTimeouts } from './call-timeouts.js'
import { planRetry, triesAgain } from './plan-retry.js'
import { failureCode } from './failure-code.js'
import { createRecoveryWatch } from './recovery-watch.js'
import { createRetryLines } from './retry-lines.js'
import { createStreamWorker, HANDLER_IGNORED_ABORT, type StreamWorker } from './stream-worker.js'
import { writeOutcome } from './write-outcome.js'
import { CLOCK_RECHECK_MS, type ClockGuard } from '../db/clock-guard.js'
import { loggableError } from '../db/database-errors.js'
import { createSchemaWatch } from '../db/schema-watch.js'
import { limitLines } from '../limit-lines.js'

// Under load one claim takes up to this many times REACTION_CONCURRENCY jobs (less those it holds): the
// jobs beyond the free slots wait here, in claim order, and start as handlers return. Fewer, bigger claims
// and completion writes per event (measured with a no-op handler at concurrency 8: the claims of 8 were
// about a third of the statements per event). A job still waiting when its lease is about to end, or at
// shutdown, is given back unstarted (its attempt taken back).
const CLAIM_AHEAD = 4

export interface DispatcherDeps {
  db: Kysely<Database>
  /** The registry's lookup by name (a job whose handler is no longer registered fails at once, not retried). */
  handler: (name: string) => ReactionHandler | undefined
  /**
   * The registry's timeoutOf: how long one call of the handler may take. A call is aborted then, and counts as a
   * failed attempt (call-timeouts.ts). A job or stream event that waited for a slot starts only while that much of its
   * lease is left; otherwise it is given back, unstarted, for a fresh lease. Absent, or undefined for a handler: no
   * limit but the lease, and started while any of the lease is left.
   */
  timeoutOf?: ((name: string) => number | undefined) | undefined
  clock: Clock
  logger: Logger
  settings: DispatcherSettings
  /**
   * The handlers whose streams this dispatcher reads (stream-worker.ts): their names and which types each
   * takes (the registry), which the job loop also asks before it runs a job; `typesSetting` names the setting
   * behind a handler's types (configured-reactions.ts). The claim takes only these handlers' jobs, so a replica
   * without a handler (a rolling deploy that turns one on, `AMQP_URL` set on some replicas) leaves its jobs to one
   * that has it rather than failing them. Absent: only the job rows are run, every one of them, and one whose
   * handler is not registered fails at once (tests of the job loop alone).
   */
  streams?:
    | {
        readonly names: readonly string[]
        handlersFor(type: string): readonly string[]
        typesSetting?(name: string): string | undefined
        /**
         * The types each handler takes here, written to its stream row at the start: a replica reads a stream only
         * while its types are the row's, those of the replica that started last (reaction-stream.repository.ts).
         */
        typesOf?(name: string): string | undefined
      }
    | undefined
  /** Subscribes to the jobs channel (DatabaseHandle.listen); absent: timers only. */
  listen?: (channel: string, onNotify: () => void) => Promise<Unlisten>
  /** Jitter source in [0, 1). */
  random?: () => number
  /** Metrics hooks. `count` attempts of `handler` ended with `result` (a stream's batch reports its attempts together). */
  onAttempt?: (handler: string, result: AttemptResult, count?: number) => void
  /** A first attempt started: seconds since the transition committed. */
  onFirstStart?: (handler: string, latencyS: number) => void
  /** A call of `handler` threw (or could not be made): the error's code, see failureCode. */
  onFailure?: (handler: string, code: string) => void
  /** `jobs` retries of `handler` were made due at once, as it succeeded again after an outage (recovery-watch.ts). */
  onPulledForward?: (handler: string, jobs: number) => void
  /** The stored positions' look (POSITIONS_CHECK_MS): how many ids the largest is ahead of the server's counter, 0 when none. */
  onPositionsAhead?: (aheadBy: number) => void
  /**
   * Asked before each claim and each stream read: while this machine's clock is far from the database's the job loop
   * claims nothing and the streams take no lease (one held is given back), looking again every CLOCK_RECHECK_MS
   * (db/clock-guard.ts); the outcome of a handler that was running meanwhile is written by the database's time
   * (timeToWrite). The service passes one.
   */
  clockGuard?: ClockGuard | undefined
}

export interface Dispatcher {
  start(): Promise<void>
  stop(): Promise<void>
  /** Look for due jobs and new events now (what a NOTIFY does). */
  wake(): void
  /** Read the streams now: a commit of this process brought events (no job became due by it). */
  wakeStreams(): void
  /**
   * Whether this process holds the lease of every handler's stream (as of each stream's last read): then
   * no other replica reads new events, and none needs waking for them.
   */
  holdsEveryStream(): boolean
  /** Handlers running right now. */
  readonly running: number
  /** While a stop runs: the step it waits for (a stop past the service's bound names it). */
  waitingOn(): string | undefined
}

const MAX_ERROR_LENGTH = 2_000

interface Claim {
  /** Aborted when the claim's lease is about to end (and, for the jobs still running, at shutdown). */
  abort: AbortController
  /** A job of this claim has ended (handled and written back, or given up). */
  jobEnded(): void
}

// reasons for aborts that end a wait (an abort without one builds a DOMException and its stack each time)
const ALL_JOBS_ENDED = new Error('every job of the claim ended')
const WOKEN = new Error('woken')

/** A loop's sleep that a wake ends early; a wake that comes while the loop is busy is kept for its next sleep. */
function createWaker(clock: Clock) {
  let woken = false
  let interrupt: (() => void) | undefined
  return {
    wake() {
      woken = true
      interrupt?.()
    },
    /** Called as the loop starts a round: what wakes it from here on ends its next sleep. */
    reset() {
      woken = false
    },
    /** `wallClock`: on the machine's timer, not the injected clock (a look for transactions to end, not a schedule). */
    async sleep(ms: number, signal: AbortSignal, wallClock = false) {
      if (woken || ms <= 0 || signal.aborted) return
      const controller = new AbortController()
      interrupt = () => controller.abort(WOKEN)
      // (anySignal, not AbortSignal.any: see eslint.config.js)
      const both = anySignal([signal, controller.signal])
      try {
        await (wallClock ? setTimeoutPromise(ms, undefined, { signal: both }) : clock.sleep(ms, both))
      } catch {
        // woken or stopping: the loop decides
      } finally {
        interrupt = undefined
        both.clear()
      }
    },
  }
}

// a stream with events committed but not readable yet (an older transaction still open) looks again after
// this, doubling up to a second; a busy stream is woken sooner by the commits themselves
const WITHHELD_FIRST_MS = 10
/**
 * How often the dispatcher looks whether the stored positions are of this server's transaction counter
 * (streamPositionsAhead: two index lookups), from its start on, and says so (error) each time they are not.
 */
export const POSITIONS_CHECK_MS = 60_000
/** While they are ahead, how often the positions are looked at again: the metric (and its alert) reads 0 soon after a rebase. */
export const POSITIONS_RECHECK_AHEAD_MS = 5_000

const POSITIONS_AHEAD_MESSAGE =
  "reaction stream positions are ahead of this database server's transaction counter: they are another server's " +
  'transaction ids (the database was restored or replicated onto this server, e.g. by pg_dump and pg_restore), and no ' +
  'handler gets new transitions until they are moved: run `partner-escrow reactions rebase`'
const HELD_BACK_MESSAGE =
  'reaction stream held back: its committed events wait until every transaction older than them has ended (oldestTransaction: the one with the oldest id on the server)'
const RESTRICTED_NOTE =
  "; pg_stat_activity hides other roles' sessions' state and age from the service's role: grant it pg_read_all_stats to see them"

/** The oldest open transaction as logged: a credential in an application name (a URL's password) masked. */
function describeTransaction(transaction: OpenTransaction) {
  if (transaction.kind === 'prepared') {
    return { ...transaction, openForS: Math.round(transaction.openForS), end: 'COMMIT PREPARED or ROLLBACK PREPARED, with its gid, in its database' }
  }
  const { restricted, ...shown } = transaction
  return {
    ...shown,
    application: shown.application === null ? null : withoutPassword(shown.application),
    openForS: shown.openForS === null ? null : Math.round(shown.openForS),
    ...(restricted ? { restricted: true } : {}),
  }
}

export function createDispatcher(deps: DispatcherDeps): Dispatcher {
  const { db, clock, logger, settings } = deps
  const random = deps.random ?? Math.random
  // what the outcome of work under way is written by: the database's time once this clock is off it (clock-guard.ts)
  const timeToWrite = async () => new Date(deps.clockGuard ? await deps.clockGuard.timeToWrite() : clock.now())
  // `returned`: the handler has returned, and only its outcome's write is left (tried again while the database is away)
  const running = new Map<string, { job: ClaimedJob; abort: AbortController; done: Promise<void>; returned: boolean }>()
  let stopping: AbortController | undefined
  let loop: Promise<void> | undefined
  let unlisten: Unlisten | undefined
  // the job loop's, and one per stream
  const jobWaker = createWaker(clock)
  // what stop() waits for now
  let stopStep: string | undefined
  let streams: { worker: StreamWorker; waker: ReturnType<typeof createWaker>; loop: Promise<void> }[] = []
  // the stored positions' look, from the start on (positionsLoop)
  let positionsCheck: Promise<void> | undefined
  // once a statement met the schema not whole (a table or a column missing: a restore under way, or of an older dump),
  // no stream is read and no job claimed until it is whole again: a batch whose write-back failed so was read and
  // run again at every retry (a forward sent again each time), and the job loop ran every due job, recording none
  const schema = createSchemaWatch(db)
  // the one line of it a second at most, whichever loop meets it (limit-lines.ts)
  const schemaNotWhole = limitLines((fields: { err?: unknown; handler?: string }) =>
    logger.warn(
      fields,
      "reaction dispatcher waits: the database's schema is not whole (a table, a column or a migration of this build missing): " +
        'no stream is read and no job claimed until it is',
    ),
  )

  const wakeStreams = () => {
    for (const stream of streams) stream.waker.wake()
  }
  const wake = () => {
    jobWaker.wake()
    wakeStreams()
  }

  // the job loop's last look left a handler out (its slots all taken), or claimed nothing for want of a slot
  let claimSkipped = false
  // a slot a handler gave back may start a claimed job waiting for one, and wakes a job loop that found that
  // handler's slots taken and so did not claim its jobs (else they would wait for its safety interval)
  const onSlotFree = () => {
    if (!stopping || stopping.signal.aborted) return
    if (waiting.length > 0) startWaiting(stopping.signal)
    if (claimSkipped) {
      claimSkipped = false
      jobWaker.wake()
    }
  }
  // each handler's calls running now, its stream's and its claimed jobs' (a finished handler's job may still
  // wait for its write-back, in `running`): at most REACTION_CONCURRENCY per handler. Per handler, not for the
  // process: with one set for all, a receiver that never answered held every slot (32 forwards waiting out
  // FORWARD_TIMEOUT_MS), and a healthy RabbitMQ got 32 messages every 10 s instead of thousands a second
  const pools = new Map<string, Slots>()
  const slotsOf = (handler: string): Slots => {
    let pool = pools.get(handler)
    if (!pool) {
      pool = createSlots(settings.concurrency, onSlotFree)
      pools.set(handler, pool)
    }
    return pool
  }
  // each handler's call deadlines (its timeoutMs), shared by its stream and the job loop: none for a handler without
  // one, nor for one that times its calls out itself no later (ownTimeoutMs: the forwarder, the RabbitMQ publisher,
  // whose own errors, forward_timeout and amqp_timeout, say more than a second deadline racing theirs would)
  const timeouts = new Map<string, CallTimeouts | undefined>()
  const timeoutsOf = (name: string): CallTimeouts | undefined => {
    if (timeouts.has(name)) return timeouts.get(name)
    const timeoutMs = deps.timeoutOf?.(name)
    const own = deps.handler(name)?.ownTimeoutMs
    const made = timeoutMs === undefined || (own !== undefined && own <= timeoutMs) ? undefined : createCallTimeouts(clock, name, timeoutMs)
    timeouts.set(name, made)
    return made
  }
  // claimed jobs waiting for a free slot (at most (CLAIM_AHEAD - 1) × concurrency, see above)
  const waiting: { job: ClaimedJob; claim: Claim }[] = []
  // the last claim took all it could: more jobs may be due than it took
  let lastClaimFull = false

  // Successes are written back in groups: each one joins the next write, which starts once the current
  // one is answered (at once when none runs), so one UPDATE marks every job that finished meanwhile done.
  let toComplete: { id: string; leaseToken: string; written: (done: boolean) => void; failed: (error: unknown) => void }[] = []
  let completing = false
  const flushCompletions = async () => {
    completing = true
    try {
      while (toComplete.length > 0) {
        const group = toComplete
        toComplete = []
        try {
          const written = await completeJobs(db, group, await timeToWrite())
          for (const job of group) job.written(written.has(job.id))
        } catch (error) {
          for (const job of group) job.failed(error)
        }
        // the orders' next events may be claimable now
        wake()
      }
    } finally {
      completing = false
    }
  }
  const complete = (lease: { id: string; leaseToken: string }) =>
    new Promise<boolean>((written, failed) => {
      toComplete.push({ ...lease, written, failed })
      // setImmediate: the handlers finishing in this turn of the event loop join the same write
      if (!completing) {
        completing = true
        setImmediate(() => void flushCompletions())
      }
    })

  // the registry's answer: the stream reads only the types its handler takes, and the job loop skips a job of
  // another type (one written before the handler's types were narrowed)
  const takes = (handler: string, type: string) => deps.streams?.handlersFor(type).includes(handler) ?? true
  // the handlers whose streams a replica started later reads, taking other types than this one's: their job rows
  // were written by that replica's reads, so this one runs them whatever its own types say (it skips none)
  const leftToOthers = new Set<string>()

  const report = (handler: string, result: AttemptResult, count = 1) => {
    try {
      deps.onAttempt?.(handler, result, count)
    } catch (error) {
      logger.warn({ err: error }, 'onAttempt hook threw')
    }
  }

  // a handler that succeeds again after an outage: its retries waiting out a backoff are due now, and this loop
  // looks for them at once (the other replicas' on the NOTIFY)
  const recovery = createRecoveryWatch({
    db,
    clock,
    logger,
    pulledForward: (handler, jobs) => {
      jobWaker.wake()
      try {
        deps.onPulledForward?.(handler, jobs)
      } catch (error) {
        logger.warn({ err: error }, 'onPulledForward hook threw')
      }
    },
  })

  // "retrying later", limited per handler and error code: the streams' first attempts and the job loop's retries together
  const retryingLater = createRetryLines()

  const reportFailure = (handler: string, failure: unknown) => {
    try {
      deps.onFailure?.(handler, failureCode(failure))
    } catch (error) {
      logger.warn({ err: error }, 'onFailure hook threw')
    }
  }

  const runJob = async (job: ClaimedJob, stopSignal: AbortSignal, claim: Claim, returned: () => void) => {
    const { event } = job
    const { abort } = claim
    // the job's logger is made when something logs (most jobs log nothing)
    let jobLog: Logger | undefined
    const log = () =>
      (jobLog ??= logger.child({ jobId: job.id, handler: job.handler, eventId: event.eventId, attempt: job.attempt }))
    const lease = { id: job.id, leaseToken: job.leaseToken }
    let handlerRunning = true
    // the handler's slot is free as soon as it returns: the next claim need not wait for the write-back.
    // That is worth a look only when the last claim took every free slot (more may be due); after one that
    // did not, what becomes due wakes the loop itself (a commit, a completion's write, a timer)
    const handlerDone = () => {
      if (!handlerRunning) return
      handlerRunning = false
      returned()
      slotsOf(job.handler).give()
      startWaiting(stopSignal)
      if (lastClaimFull) wake()
    }
    try {
      const handler = deps.handler(job.handler)
      // (a handler not registered at all is a removed one: it fails below at once, whatever attempts are left, since
      // no later attempt in this process could call it; an operator retries it once the handler is back)
      if (handler && !takes(job.handler, event.type) && !leftToOthers.has(job.handler)) {
        handlerDone()
        await skipNotTaken(job, abort.signal, log)
        return
      }
      if (job.attempt === 1) {
        try {
          deps.onFirstStart?.(job.handler, Math.max(0, (clock.now() - job.createdAt.getTime()) / 1000))
        } catch (error) {
          log().warn({ err: error }, 'onFirstStart hook threw')
        }
      }
      let failure: unknown
      let uncalled = false
      let timedOut = false
      if (!handler) {
        failure = new Error(`no reaction handler named ${job.handler} is registered`)
      } else if (job.attempt > settings.maxAttempts) {
        uncalled = true
        // the last allowed attempt's process died or overran its lease: do not call it again. Or every attempt
        // finished, and REACTION_MAX_ATTEMPTS was lowered below them since (said so: it read as a dead replica's)
        failure = new Error(
          job.reclaimed && job.attempt - 1 <= settings.maxAttempts
            ? `attempt ${job.attempt - 1} of ${settings.maxAttempts} did not finish within its lease`
            : `not called again: it has had ${job.attempt - 1} attempts, more than REACTION_MAX_ATTEMPTS (now ${settings.maxAttempts})`,
        )
      } else {
        // its own signal, aborted at its timeoutMs, when the handler has one (call-timeouts.ts)
        const timed = timeoutsOf(job.handler)?.start(abort.signal)
        try {
          await handler(event, {
            signal: timed ? timed.signal : abort.signal,
            attempt: job.attempt,
            get logger() {
              return log()
            },
          })
        } catch (error) {
          failure = error ?? new Error('the handler threw without a reason')
        } finally {
          timed?.end()
        }
        // past its deadline, the call is a timeout whatever it did then (a late return is not taken)
        if (timed?.timedOut) {
          failure = timed.failure(failure)
          timedOut = true
        }
        // (a call stopped at its lease's end or at shutdown got no answer from the handler's system: no sign of an outage)
        if (failure !== undefined && !abort.signal.aborted) recovery.failed(job.handler, event, failure)
      }
      handlerDone()
      // the outcome's write is tried again while the database does not answer, until the lease is about to end
      // (the claim's abort) or the shutdown's grace is over (write-outcome.ts)
      // (not a schema not whole: the loops hold at once, as before, until it is whole again)
      const record = <T>(write: () => Promise<T>) => writeOutcome(write, { clock, signal: abort.signal, log, retryable: (error) => !schema.met(error) })
      if (failure === undefined) {
        recovery.succeeded(job.handler)
        const written = await record(() => complete(lease))
        report(job.handler, written ? 'done' : 'lease_lost')
        if (!written) log().warn('reaction handled, but its lease had been taken over: the job ran again elsewhere')
        return
      }
      const now = await timeToWrite()
      if (!timedOut && stopSignal.aborted && abort.signal.aborted) {
        // stopped by shutdown, not failed: stop() gives the lease back
        report(job.handler, 'released')
        return
      }
      const message = describeFailure(failure)
      reportFailure(job.handler, failure)
      const attemptsLeft = handler !== undefined && triesAgain(failure, job.attempt, settings.maxAttempts)
      if (attemptsLeft) {
        const { delayS, error } = planRetry(failure, message, job.attempt, settings.backoff, random)
        const runAt = new Date(now.getTime() + delayS * 1000)
        const written = await record(() => retryJobLater(db, { ...lease, now, runAt, error }))
        // the loop's next look: the retry's run_at
        wake()
        report(job.handler, written ? 'retry' : 'lease_lost')
        retryingLater({ log: log(), handler: job.handler, failure, error, retryInS: Math.round(delayS) })
      } else {
        const written = await record(() => failJob(db, { ...lease, now, error: message, uncalled }))
        report(job.handler, written ? 'failed' : 'lease_lost')
        log().error(
          { error: message, attempts: uncalled ? job.attempt - 1 : job.attempt },
          'reaction handler failed for the last time: the job is failed until retried or skipped',
        )
      }
    } catch (error) {
      // the write-back failed until the lease was about to end or the service stopped (the database down all that
      // time): the lease runs out and the job is claimed again
      if (schema.met(error)) schemaNotWhole({ err: loggableError(error), handler: job.handler })
      else log().warn({ err: error }, 'could not record a reaction job outcome; it runs again after its lease')
    } finally {
      handlerDone()
      claim.jobEnded()
    }
  }

  // the handler is not called: the job is skipped under its lease, with the reason where its last error is kept
  const skipNotTaken = async (job: ClaimedJob, signal: AbortSignal, log: () => Logger) => {
    const type = job.event.type
    const setting = deps.streams?.typesSetting?.(job.handler) ?? 'its registration'
    const reason = `handler ${job.handler} no longer takes ${type} (${setting}); skipped without running`
    const written = await writeOutcome(
      async () => skipJobNotTaken(db, { id: job.id, leaseToken: job.leaseToken, now: await timeToWrite(), reason }),
      { clock, signal, log, retryable: (error) => !schema.met(error) },
    )
    report(job.handler, written ? 'skipped' : 'lease_lost')
    if (!written) {
      log().warn({ type }, 'reaction job not taken by its handler any more, but its lease had been taken over: the job ran again elsewhere')
      return
    }
    // the attempts the job shows (the claim's taken back): the job logger's `attempt` is the claim's, one more, and
    // said "attempt":4 of a job showing 3
    logger.child({ jobId: job.id, handler: job.handler, eventId: job.event.eventId, attempts: job.attempt - 1 }).warn({ type }, reason)
    // the order's next event for this handler may be claimable now
    wake()
  }

  // One lease timer per claim (its jobs share the lease's end), not one per job: a handler still running
  // a little before the lease ends is aborted, since past it another replica may claim the job again.
  // The jobs of a claim also share one AbortController: what aborts one of them (the lease's end, the
  // shutdown) aborts every one still running.
  const leaseWatch = (jobs: readonly ClaimedJob[]): Claim => {
    const [first] = jobs
    let left = jobs.length
    const timer = new AbortController()
    const abort = new AbortController()
    // every job of the claim gets this signal, up to REACTION_CONCURRENCY handlers at once, and may listen to it
    setMaxListeners(0, abort.signal)
    if (first) {
      clock.sleep(Math.max(0, first.leaseExpiresAt.getTime() - leaseMargin - clock.now()), timer.signal).then(
        () => abort.abort(new Error('the job lease is about to end')),
        () => {},
      )
    }
    return {
      abort,
      jobEnded: () => {
        left -= 1
        if (left === 0) timer.abort(ALL_JOBS_ENDED)
      },
    }
  }

  const leaseMargin = leaseMarginMs(settings.leaseMs)

  // a free slot of its handler takes the next waiting job of that handler; one with less of its lease left than
  // its handler's own timeout is given back unstarted (due now, for a fresh lease): started, a slow call was cut off
  // at the lease's end, counted as a failed attempt, and sent again (found from outside: a receiver answering in
  // 14 s under FORWARD_TIMEOUT_MS=30000 and REACTION_LEASE_S=40 took two events twice)
  const leftToStart = (handler: string) => Math.max(1, deps.timeoutOf?.(handler) ?? 0)
  const startWaiting = (stopSignal: AbortSignal) => {
    for (let i = 0; i < waiting.length && !stopSignal.aborted; ) {
      const { job, claim } = waiting[i]!
      if (slotsOf(job.handler).free === 0) {
        i += 1
        continue
      }
      waiting.splice(i, 1)
      if (job.leaseExpiresAt.getTime() - leaseMargin - clock.now() >= leftToStart(job.handler)) {
        startJob(job, stopSignal, claim)
      } else {
        giveBack([{ job, claim }])
      }
    }
  }

  // claimed jobs never started: pending again and due now, their attempt taken back
  const giveBack = (jobs: readonly { job: ClaimedJob; claim: Claim }[]) => {
    const byToken = new Map<string, string[]>()
    for (const { job } of jobs) byToken.set(job.leaseToken, [...(byToken.get(job.leaseToken) ?? []), job.id])
    const released = timeToWrite().then((now) =>
      Promise.all(
        [...byToken].map(([leaseToken, ids]) =>
          releaseJobs(db, { ids, leaseToken, now }).catch((error: unknown) =>
            logger.warn({ err: error }, 'could not give back reaction leases; they run out on their own'),
          ),
        ),
      ),
    )
    for (const { claim } of jobs) claim.jobEnded()
    // due again now: the loop looks (after a stop it is gone, and this does nothing)
    return released.then(wake)
  }

  // (a job that ended wakes the loop through what it wrote: the completion's group write, a retry)
  const startJob = (job: ClaimedJob, stopSignal: AbortSignal, claim: Claim) => {
    const entry = { job, abort: claim.abort, done: Promise.resolve(), returned: false }
    slotsOf(job.handler).take()
    entry.done = runJob(job, stopSignal, claim, () => {
      entry.returned = true
    }).finally(() => {
      running.delete(job.id)
    })
    running.set(job.id, entry)
  }

  // when the positions' error was last said (the machine's clock, as the look's timer), at most once a POSITIONS_CHECK_MS
  let positionsSaidAt: number | undefined
  /**
   * Looks whether the positions are another server's (streamPositionsAhead), sets the metric, and says so (error)
   * when they are and it was not said in the last POSITIONS_CHECK_MS; false when they are not, or it cannot tell.
   */
  const checkPositions = async (): Promise<boolean> => {
    try {
      const found = await streamPositionsAhead(db)
      try {
        deps.onPositionsAhead?.(found.aheadBy)
      } catch (error) {
        logger.warn({ err: error }, 'onPositionsAhead hook threw')
      }
      if (found.aheadBy === 0) return false
      const at = performance.now()
      if (positionsSaidAt === undefined || at - positionsSaidAt >= POSITIONS_CHECK_MS) {
        positionsSaidAt = at
        logger.error({ largestPosition: found.largest, nextTransactionId: found.next, aheadBy: found.aheadBy }, POSITIONS_AHEAD_MESSAGE)
      }
      return true
    } catch {
      // the database away: every loop says so in its own words
      return false
    }
  }
  const positionsLoop = async (signal: AbortSignal) => {
    // (on the machine's timer, as the look for a transaction to end: a look at the database, not a schedule)
    while (!signal.aborted) {
      const ahead = await checkPositions()
      await setTimeoutPromise(ahead ? POSITIONS_RECHECK_AHEAD_MS : POSITIONS_CHECK_MS, undefined, { signal }).catch(() => {})
    }
  }

  /** Says the stream is held back, naming what holds it; false when it said nothing (the positions are another server's). */
  const warnHeldBack = async (handler: string, heldForMs: number): Promise<boolean> => {
    // events withheld for good behind positions of another server's counter: that error is said instead (once a minute, above)
    if (await checkPositions()) return false
    const transaction = await oldestOpenTransaction(db).catch(() => undefined)
    const restricted = transaction?.kind === 'session' && transaction.restricted
    logger.warn(
      { handler, heldForS: Math.round(heldForMs / 1000), oldestTransaction: transaction && describeTransaction(transaction) },
      restricted ? HELD_BACK_MESSAGE + RESTRICTED_NOTE : HELD_BACK_MESSAGE,
    )
    return true
  }

  const streamLoop = async (worker: StreamWorker, waker: ReturnType<typeof createWaker>, signal: AbortSignal) => {
    let failures = 0
    let withheldMs = WITHHELD_FIRST_MS
    // since when the stream's next events have waited behind an open transaction, and when that was last said
    let heldBackSince: number | undefined
    let heldBackSaid = 0
    // the hold under way was said: its end is said too
    let heldBackWarned = false
    const warnMs = settings.heldBackWarnMs ?? HELD_BACK_WARN_MS
    while (!signal.aborted) {
      waker.reset()
      let delayMs = settings.safetyIntervalMs
      let wallClock = false
      try {
        if (deps.clockGuard && !(await deps.clockGuard.allows('reaction_streams'))) {
          // no lease taken or renewed by this clock; one held is given back (its handed-off calls finish first), so
          // another replica reads the stream at once rather than when the lease this clock wrote ends
          if (worker.leased) {
            await worker.settled()
            await worker.release()
          }
          await waker.sleep(CLOCK_RECHECK_MS, signal, true)
          continue
        }
        if (!(await schema.whole())) {
          failures += 1
          schemaNotWhole({ handler: worker.name })
          await waker.sleep(Math.min(settings.safetyIntervalMs, 500 * 2 ** Math.min(failures, 6)), signal)
          continue
        }
        const { full, read, readAgainInMs, withheld, heldUntil, otherTypes } = await worker.batch(signal)
        failures = 0
        if (otherTypes !== undefined && !leftToOthers.has(worker.name)) {
          leftToOthers.add(worker.name)
          logger.warn(
            { handler: worker.name, types: deps.streams?.typesOf?.(worker.name), theirs: otherTypes },
            `a replica started later takes other types for reaction handler ${worker.name} (${deps.streams?.typesSetting?.(worker.name) ?? 'its registration'}): this one leaves the handler's stream to the replicas that take those, and runs its job rows; set the same on every replica`,
          )
        } else if (otherTypes === undefined && leftToOthers.delete(worker.name)) {
          logger.info({ handler: worker.name, types: deps.streams?.typesOf?.(worker.name) }, `reaction handler ${worker.name}'s stream is read here again`)
        }
        const now = clock.now()
        const heldFrom = heldBackSince
        heldBackSince = withheld && read === 0 ? (heldBackSince ?? now) : undefined
        if (heldBackSince === undefined && heldFrom !== undefined && heldBackWarned) {
          heldBackWarned = false
          logger.info({ handler: worker.name, heldForS: Math.round((now - heldFrom) / 1000) }, 'reaction stream moving again')
        }
        if (heldBackSince !== undefined && now - heldBackSince >= warnMs && now - heldBackSaid >= warnMs) {
          heldBackSaid = now
          if (await warnHeldBack(worker.name, now - heldBackSince)) heldBackWarned = true
        }
        // another replica holds the stream: look again when its lease runs out (it may have died)
        if (heldUntil) delayMs = Math.min(delayMs, Math.max(1, heldUntil.getTime() - clock.now() + 1))
        if (full) continue
        if (read > 0) {
          // the next read gathers what commits meanwhile: fewer, larger batches while events keep coming
          await setTimeoutPromise(readAgainInMs, undefined, { signal }).catch(() => {})
          continue
        }
        if (withheld) {
          delayMs = withheldMs
          wallClock = true
          withheldMs = Math.min(1_000, withheldMs * 2)
        } else {
          withheldMs = WITHHELD_FIRST_MS
        }
      } catch (error) {
        failures += 1
        delayMs = Math.min(settings.safetyIntervalMs, 500 * 2 ** Math.min(failures, 6))
        if (schema.met(error)) schemaNotWhole({ err: loggableError(error), handler: worker.name })
        else logger.warn({ err: error, retryInMs: delayMs }, 'reaction dispatcher could not read a handler stream; trying again')
      }
      await waker.sleep(delayMs, signal, wallClock)
    }
  }

  const runLoop = async (signal: AbortSignal) => {
    let failures = 0
    while (!signal.aborted) {
      jobWaker.reset()
      let delayMs = settings.safetyIntervalMs
      try {
        // room for as many as a free slot each, and ahead of the slots while handlers run (see CLAIM_AHEAD), for
        // each handler: one whose slots are all taken, or that has that many waiting, is left out of the claim
        const waitingOf = new Map<string, number>()
        for (const { job } of waiting) waitingOf.set(job.handler, (waitingOf.get(job.handler) ?? 0) + 1)
        const skipHandlers: string[] = []
        let free = pools.size === 0 ? settings.concurrency * CLAIM_AHEAD : 0
        for (const [handler, pool] of pools) {
          const room = settings.concurrency * CLAIM_AHEAD - pool.busy - (waitingOf.get(handler) ?? 0)
          if (pool.free === 0 || room <= 0) skipHandlers.push(handler)
          else free = Math.max(free, room)
        }
        // (a handler without slots yet, e.g. a removed one whose jobs fail at once, is claimed with the others)
        claimSkipped = skipHandlers.length > 0
        if (free > 0 && deps.clockGuard && !(await deps.clockGuard.allows('reaction_jobs'))) {
          // no claim by this clock: looked at again on the machine's timer (the clock is the one not to trust)
          await jobWaker.sleep(CLOCK_RECHECK_MS, signal, true)
          continue
        }
        if (free > 0 && !(await schema.whole())) {
          failures += 1
          schemaNotWhole({})
          await jobWaker.sleep(Math.min(settings.safetyIntervalMs, 500 * 2 ** Math.min(failures, 6)), signal)
          continue
        }
        if (free > 0) {
          const now = new Date(clock.now())
          const { jobs, nextRunAt: nextAfterClaim } = await claimReactionJobsAndNext(db, {
            now,
            limit: free,
            leaseMs: settings.leaseMs,
            leaseToken: randomUUID(),
            skipHandlers,
            handlers: deps.streams?.names,
          })
          if (signal.aborted) {
            // claimed as stop began: not started, given back at once
            await releaseJobs(db, { ids: jobs.map((job) => job.id), leaseToken: jobs[0]?.leaseToken ?? '', now })
            break
          }
          lastClaimFull = jobs.length === free
          if (jobs.length > 0) {
            const claim = leaseWatch(jobs)
            for (const job of jobs) {
              if (slotsOf(job.handler).free > 0) startJob(job, signal, claim)
              else waiting.push({ job, claim })
            }
          }
          // every slot taken: the next handler to return wakes the loop. Fewer: the claim said when the
          // next job not claimed is due (a claim of none does not, so ask)
          if (lastClaimFull) continue
          const next = nextAfterClaim === undefined ? await nextRunAt(db, now) : nextAfterClaim
          if (next) delayMs = Math.min(delayMs, Math.max(1, next.getTime() - clock.now()))
        }
        failures = 0
      } catch (error) {
        failures += 1
        delayMs = Math.min(settings.safetyIntervalMs, 500 * 2 ** Math.min(failures, 6))
        if (schema.met(error)) schemaNotWhole({ err: loggableError(error) })
        else logger.warn({ err: error, retryInMs: delayMs }, 'reaction dispatcher could not claim jobs; trying again')
      }
      await jobWaker.sleep(delayMs, signal)
    }
  }

  return {
    get running() {
      return running.size + streams.reduce((sum, stream) => sum + stream.worker.running, 0)
    },
    wake,
    wakeStreams,
    waitingOn: () => stopStep,
    holdsEveryStream: () => streams.length > 0 && streams.every((stream) => stream.worker.leased),
    async start() {
      if (loop) return
      stopping = new AbortController()
      // each stream's sleep and batch and the job loop's sleep listen to it while they last (anySignal): with a
      // handful of handlers that is more than Node's default of 10 listeners, and none is kept
      setMaxListeners(0, stopping.signal)
      if (deps.listen) {
        try {
          unlisten = await deps.listen(await reactionChannel(db), wake)
        } catch (error) {
          logger.warn({ err: error }, 'cannot listen for reaction notifications; looking on timers only')
        }
      }
      const stopSignal = stopping.signal
      const names = deps.streams?.names ?? []
      const typesOf = deps.streams?.typesOf?.bind(deps.streams)
      const streamTypesOf = typesOf && ((name: string) => typesOf(name) ?? '')
      if (names.length > 0) {
        // a handler new in this deploy starts after the events already committed; retried until the database answers
        for (let failures = 0; ; failures += 1) {
          try {
            await ensureReactionStreams(db, names, new Date(clock.now()), streamTypesOf)
            break
          } catch (error) {
            if (stopSignal.aborted) return
            const delayMs = Math.min(settings.safetyIntervalMs, 500 * 2 ** Math.min(failures, 6))
            logger.warn({ err: error, retryInMs: delayMs }, 'could not create the reaction streams; trying again')
            await clock.sleep(delayMs, stopSignal).catch(() => {})
          }
        }
      }
      // said at the start, and each POSITIONS_CHECK_MS while it lasts
      if (names.length > 0) positionsCheck = positionsLoop(stopSignal)
      const leaseToken = randomUUID()
      streams = names.map((name) => {
        const waker = createWaker(clock)
        const worker = createStreamWorker({
          db,
          name,
          handler: deps.handler(name),
          timeoutMs: deps.timeoutOf?.(name),
          timeouts: timeoutsOf(name),
          takes: (type) => takes(name, type),
          types: typesOf?.(name),
          clock,
          logger,
          settings,
          leaseToken,
          random,
          report,
          reportFailure,
          recovery,
          onFirstStart: deps.onFirstStart,
          jobsWritten: () => jobWaker.wake(),
          timeToWrite,
          slots: slotsOf(name),
          describeFailure,
          retryingLater,
        })
        return { worker, waker, loop: streamLoop(worker, waker, stopSignal) }
      })
      logger.info(
        { concurrency: settings.concurrency, maxAttempts: settings.maxAttempts, leaseMs: settings.leaseMs, streams: names },
        'reaction dispatcher started',
      )
      loop = runLoop(stopSignal)
    },
    async stop() {
      if (!loop || !stopping) return
      stopping.abort(new Error('reaction dispatcher stopping'))
      // the handlers' grace runs from here, for the streams' calls and the job loop's alike: given each in turn, a
      // stop with both kinds still running took twice the shutdown timeout, past the service's bound
      const graceEnds = clock.now() + settings.shutdownTimeoutMs
      wake()
      stopStep = 'the handler streams'
      // each stream's batch gives its handlers the shutdown timeout, writes what finished, and its lease is given back
      await Promise.all(
        streams.map(async (stream) => {
          await stream.loop
          await stream.worker.settled()
          await stream.worker.release().catch((error: unknown) => logger.warn({ err: error }, 'could not give back a reaction stream lease; it runs out on its own'))
        }),
      )
      streams = []
      await positionsCheck
      positionsCheck = undefined
      stopStep = 'the claim loop'
      await loop
      stopStep = 'the notification listener'
      // within the grace: over a path gone silent the server never sees the session out, and the listener's own
      // second (not a share of the bound) took a stop past the dispatcher's share of it, or past the whole bound
      await unlisten?.(Math.max(0, graceEnds - clock.now())).catch((error: unknown) => logger.warn({ err: error }, 'stopping the notification listener failed'))
      unlisten = undefined
      // claimed but never started: given back at once, for other replicas to take
      stopStep = 'giving back claimed jobs'
      await giveBack(waiting.splice(0))
      // handlers in flight get the shutdown timeout to finish; then they are aborted and their leases returned
      const inFlight = [...running.values()]
      if (inFlight.length > 0) {
        stopStep = 'the handlers in flight'
        const grace = new AbortController()
        await Promise.race([
          Promise.allSettled(inFlight.map((entry) => entry.done)),
          clock.sleep(Math.max(0, graceEnds - clock.now()), grace.signal).catch(() => {}),
        ])
        grace.abort()
        const left = [...running.values()]
        for (const entry of left) entry.abort.abort(new Error('the service is shutting down'))
        // a handler that returned, its outcome's write still failing (the database away through the grace), is not
        // given back: it would be called again for an outcome this replica has. The abort makes its write's last try;
        // if that fails too, the job runs again once its lease runs out
        const unfinished = left.filter((entry) => !entry.returned)
        const byToken = new Map<string, string[]>()
        for (const { job } of unfinished) byToken.set(job.leaseToken, [...(byToken.get(job.leaseToken) ?? []), job.id])
        const now = await timeToWrite()
        for (const [leaseToken, ids] of byToken) {
          await releaseJobs(db, { ids, leaseToken, now }).catch((error: unknown) =>
            logger.warn({ err: error }, 'could not give back reaction leases; they run out on their own'),
          )
        }
        // let aborted handlers unwind (they write nothing: a stopped job's lease is already given back)
        const unwind = new AbortController()
        await Promise.race([
          Promise.allSettled(left.map((entry) => entry.done)),
          clock.sleep(abortUnwindMs(settings.shutdownTimeoutMs), unwind.signal).catch(() => {}),
        ])
        unwind.abort()
        // (a call's entry leaves `running` as it ends): what is still there ignored its abort, as a stream's call can
        for (const { job } of unfinished.filter((entry) => running.get(entry.job.id) === entry)) {
          logger.warn({ handler: job.handler, eventId: job.event.eventId }, HANDLER_IGNORED_ABORT)
        }
        if (unfinished.length > 0) logger.warn({ jobs: unfinished.length }, 'reaction handlers stopped before finishing; their jobs run again')
      }
      // a line held back for the end of its second is written now, before "stopped", and none after it
      retryingLater.flush()
      schemaNotWhole.flush()
      loop = undefined
      stopping = undefined
      stopStep = undefined
      logger.info('reaction dispatcher stopped')
    },
  }
}

/**
 * What a handler threw, as the job's last error and its log line, whatever it threw. Never throws itself: a value
 * String() cannot convert (Object.create(null)) threw out of the stream's attempt, no outcome was written, and the
 * handler's whole stream ran again and again, other orders' events that had succeeded too (42 calls of one), past
 * the attempt limit and with nothing for the operator to see.
 */
function describeFailure(error: unknown): string {
  let message: string
  try {
    message = thrownText(error)
  } catch {
    message = `a thrown ${Object.prototype.toString.call(error)} that cannot be written as text`
  }
  return message.length > MAX_ERROR_LENGTH ? `${message.slice(0, MAX_ERROR_LENGTH)}…` : message
}

/** An Error by its name and message; an object by its own toString, else its JSON (`{"code":…}`, where String() gave `[object Object]`). */
function thrownText(error: unknown): string {
  if (error instanceof Error) return `${String(error.name)}: ${String(error.message)}`
  if (typeof error === 'object' && error !== null) {
    const { toString } = error as { toString?: unknown }
    if (typeof toString === 'function' && toString !== Object.prototype.toString) return String(error)
    return JSON.stringify(error) ?? Object.prototype.toString.call(error)
  }
  return String(error)
}
