// One handler's stream (reaction-stream.repository.ts), read and run by the dispatcher of the replica that
// holds its lease: the path of every event's first attempt.
//
// A batch: read up to `batchSize` events after the stream's place, keep those of the handler's types, run
// them (one order's events one after another, in sequence order; different orders at once, at most
// REACTION_CONCURRENCY), and write back in one statement what became of each event and the new place. An event
// whose handler returned gets no job row: the batch's row in reaction_stream_batches lists them (migrations/0011).
// Every other event gets a job row:
// - pending, after a backoff (or the wait its error asked for: plan-retry.ts): it threw and has attempts left (the job loop of dispatcher.ts runs it again);
// - failed: it threw on its last attempt (REACTION_MAX_ATTEMPTS of 1), or with a permanent error (plan-retry.ts);
// - pending, due now, attempts 0: not started, or behind an earlier event of its order that has not
//   succeeded (in this batch, or an unfinished job); the job loop runs it once nothing holds it back.
// The batch does not wait for a slow handler: when none of its handlers has returned for HANDOFF_MS, or it has
// waited BATCH_MAX_MS, or the service stops, it is written back as it stands (and the next batch sized by what
// its slots got through: nextBatchLimit). A handler still running is written as a running job under the stream's
// lease token (what a claim writes), and writes its own outcome to that row when it returns, as a claimed job
// does, tried again while the database does not answer (write-outcome.ts); the stream reads on. So one stuck call
// holds back its own order, not the stream.
// A handler registered with a timeoutMs is aborted at it, and the attempt is a failure, retried (call-timeouts.ts).
// A handler still running shortly before its lease ends is aborted (it counts as a throw). At shutdown the
// running handlers get the shutdown timeout, then are aborted and their jobs given back (pending, due now), a
// handler that ignores its abort included: it is not waited for (settleOne).
// A batch whose every event was done leaves no job row, only the record of its events and the new place: that
// write-back may wait (WRITE_BACK_MS) and go with a later batch's, the next read starting from the place held in
// memory (readReactionStream's `after`). So the stream reads again without a commit in between, and a
// transition waits less for its handler. Events done but not written back yet run again if the process dies
// (at least once, as a batch cut short by a crash does today), or if another replica takes the stream meanwhile.
// A batch whose handlers still run reads on from its last event (read-ahead, in `batch`), and runs what it reads
// in the same batch: under load a transition waits for the slots, not for the batch's slowest handler.
import { setMaxListeners } from 'node:events'
import { anySignal } from 'any-signal'
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import { abortUnwindMs, type AttemptResult, type DispatcherSettings, leaseMarginMs } from './dispatcher-settings.js'
import type { CallTimeouts } from './call-timeouts.js'
import type { Slots } from './handler-slots.js'
import { planRetry, triesAgain } from './plan-retry.js'
import type { ReactionHandler } from './reaction-event.js'
import type { RecoveryWatch } from './recovery-watch.js'
import type { RetryLine } from './retry-lines.js'
import { completeJob, failJob, ownOutcomes, releaseJobs, retryJobLater } from './reaction-job.repository.js'
import { writeOutcome } from './write-outcome.js'
import { isSchemaMissing } from '../db/database-errors.js'
import {
  createMissingReactionStream,
  readReactionStream,
  releaseReactionStream,
  type StreamEvent,
  streamStandsAt,
  type StreamOutcome,
  type StreamPlace,
  writeReactionStream,
} from './reaction-stream.repository.js'

/**
 * The longest lease on a handler's stream (REACTION_LEASE_S when that is shorter). A reader renews it on every read and
 * write-back, at least every BATCH_MAX_MS while it has events; a replica killed while holding it holds back every
 * replica's new transitions of the handler until it ends: for REACTION_LEASE_S, 300 s by default, when the stream's
 * lease was the jobs'. A handler still running keeps its job's lease (REACTION_LEASE_S) whatever becomes of the
 * stream's.
 */
export const STREAM_LEASE_MAX_MS = 30_000

/** How long a batch waits with none of its handlers returning before it hands the ones still running to the job loop. */
export const HANDOFF_MS = 250
/** The longest a batch waits for its handlers, however many keep returning (less with a lease under 20 s). */
export const BATCH_MAX_MS = 5_000
/** The longest the record of batches whose every event was done waits to be written back with a later one's. */
export const WRITE_BACK_MS = 100
// The stream reads again GATHER_MS after its last read, and GATHER_PER_EVENT_MS longer for each event that read
// brought, up to GATHER_MAX_MS (not sooner, however many commits wake it): after a batch that was not full, and
// within a batch whose handlers still run (read-ahead, below). With a no-op handler at about 2,000 events/s,
// reading on every wake made batches of a few events, each a read and a write-back commit. Under a heavy load
// the wait grows, and so do the batches. The longest wait bounds what a transition waits for its handler under
// load: at 60 ms, a no-op handler's commit-to-handler p99 was 70-80 ms during a full-speed ingest of 7,500
// transitions a second, and 35-45 ms at 20 ms (226 events a batch instead of 338; README.md, Benchmarks).
// Halved to 10 ms once a batch whose every event was done stopped committing its own write-back (WRITE_BACK_MS):
// a read without a commit costs less than the commit it no longer waits for (bench/noop-latency-ab.ts).
const GATHER_MS = 5
const GATHER_PER_EVENT_MS = 1 / 8
const GATHER_MAX_MS = 10
/** How long the stream waits after a read of `read` events before it reads again. */
export const gatherMs = (read: number) => Math.min(GATHER_MAX_MS, GATHER_MS + read * GATHER_PER_EVENT_MS)
// The share of the batch's longest wait a batch is sized to fill at the last batch's pace (nextBatchLimit)
const PACE_SHARE = 3 / 4

/**
 * How many events the next batch reads (`full`: its last read gave as many as asked). Events a batch's slots never reached go to the job loop, which claims
 * each and writes its outcome with statements of its own: with 8 slots, a receiver answering in 5 ms and a
 * batch that waited 250 ms in all, about 8,500 of 20,000 events went that way (bench/forward-drain.ts). So
 * after a batch written back (its longest wait over, or none of its handlers returning for HANDOFF_MS) with
 * events its slots never reached, the next reads what its slots finished at this batch's pace in PACE_SHARE
 * of the longest wait. After a full batch that finished, the next reads more, up to that pace and twice as
 * many at most. Not after one written back only because an order waited behind its own slow call: more slots
 * would not have helped it.
 */
export function nextBatchLimit(
  limit: number,
  batch: { read: number; full: boolean; mine: number; finished: number; elapsedMs: number; allFinished: boolean; unreached: boolean },
  bounds: { min: number; max: number; waitMs: number },
): number {
  const { read, full, mine, finished, elapsedMs, allFinished, unreached } = batch
  if (!(allFinished ? full : unreached)) return limit
  // events read (of any type) per event of the handler's types, at the pace its slots finished them
  const paced = mine === 0 ? Infinity : (finished * (read / mine) * bounds.waitMs * PACE_SHARE) / Math.max(1, elapsedMs)
  // a batch that finished never shrinks the next: its pace counts the end, where the last orders' events run
  // one after another on a few slots (at 100 ms an answer, shrinking on it spiralled down to 45 events a batch)
  const next = allFinished ? Math.max(limit, Math.min(2 * limit, paced)) : paced
  return Math.max(bounds.min, Math.min(bounds.max, Math.floor(next)))
}

export interface StreamWorkerDeps {
  db: Kysely<Database>
  name: string
  handler: ReactionHandler | undefined
  /**
   * How long one call of the handler may take (DispatcherDeps.timeoutOf): an event whose lane waited (for an earlier
   * call or a slot) starts only while that much of the batch's lease is left; otherwise it is left pending, due now,
   * for the job loop's fresh lease.
   */
  timeoutMs?: number | undefined
  /** The deadlines of the handler's calls (its timeoutMs), shared with the job loop; absent: none but the lease. */
  timeouts?: CallTimeouts | undefined
  /** Whether this handler takes events of `type`. */
  takes: (type: string) => boolean
  /** The types it takes, as its stream row holds them: the stream is read only while the row's are these. */
  types?: string | undefined
  clock: Clock
  logger: Logger
  settings: DispatcherSettings
  leaseToken: string
  random: () => number
  /** Counts `count` attempts of `handler` that ended so (1 when not given). */
  report: (handler: string, result: AttemptResult, count?: number) => void
  /** A call threw: counted by its error's code. */
  reportFailure?: ((handler: string, failure: unknown) => void) | undefined
  /** Told how each call ended: after an outage, the handler's first success pulls its waiting retries forward. */
  recovery?: RecoveryWatch | undefined
  onFirstStart?: ((handler: string, latencyS: number) => void) | undefined
  /** Job rows were written that the job loop may run. */
  jobsWritten: () => void
  /** The process's handler slots (REACTION_CONCURRENCY), shared with the job loop. */
  slots: Slots
  describeFailure: (error: unknown) => string
  /** Writes "reaction handler failed; retrying later", limited per handler and error code (retry-lines.ts). */
  retryingLater: (line: RetryLine) => void
  /**
   * The time to write a batch's outcome and the stream's renewed lease by (ClockGuard.timeToWrite: the database's once
   * this clock is off it); absent: the clock's now.
   */
  timeToWrite?: (() => Promise<Date>) | undefined
}

export interface BatchResult {
  /** The stream gave as many events as asked: there may be more right away. */
  full: boolean
  /** Events read (of any type). */
  read: number
  /** When `read` > 0 and not `full`: how long the stream waits before its next read (gatherMs after the last one). */
  readAgainInMs: number
  /** Events are committed after the place but not readable yet (an older transaction is still open). */
  withheld: boolean
  /** Another replica holds the stream until then. */
  heldUntil?: Date | undefined
  /** A replica that started later takes other types for the handler (these, the row's): it reads the stream. */
  otherTypes?: string | undefined
}

// what ends a batch's own timers and its wait for a slot (a reason given, so no DOMException is made each time)
const BATCH_WRITTEN_BACK = new Error('the batch is written back')

// a first attempt that succeeded: recorded by its history id in the batch's row (nothing of it is kept)
const DONE = { state: 'done' } as const

/** A first attempt's outcome; undefined: stopped by the shutdown (its job is given back). */
type Finished = typeof DONE | StreamOutcome | undefined

// a handed-off call still running when the shutdown's grace ended, its abort ignored: not waited for
const NOT_RETURNED = Symbol('not returned')
/** The warning for a call still running abortUnwindMs after its abort at shutdown (the job loop's too). */
export const HANDLER_IGNORED_ABORT =
  'reaction handler did not return after its abort at shutdown: its job is given back and runs again; make the handler end on its signal'

export function createStreamWorker(deps: StreamWorkerDeps) {
  const { db, name, clock, logger, settings, leaseToken, types } = deps
  // (a handler may have run across a step of this clock: what its batch writes is written by the database's time then)
  const timeToWrite = deps.timeToWrite ?? (() => Promise.resolve(new Date(clock.now())))
  // large enough that a batch's own cost (two statements, a commit) is small beside its events' under a heavy
  // load (gatherMs); a batch reads its events' rows at once, about 0.5 kB each
  const batchSize = Math.max(512, 8 * settings.concurrency)
  const bounds = { min: settings.concurrency, max: batchSize, waitMs: Math.min(BATCH_MAX_MS, settings.leaseMs / 4) }
  // what the next batch reads (nextBatchLimit): batchSize until a batch's slots fall behind
  let limit = batchSize
  const leaseMargin = leaseMarginMs(settings.leaseMs)
  const streamLeaseMs = Math.min(settings.leaseMs, STREAM_LEASE_MAX_MS)
  let running = 0
  // whether the last read found this process holding the stream's lease
  let leased = false
  // handed-off handlers still running (each holds its slot until it returns)
  const handedOff = new Set<Promise<void>>()
  // batches whose every event was done, not written back yet: the place after them, their events' history ids,
  // and when the first of them was ready to be written
  let unwritten: { place: StreamPlace; done: string[]; since: number } | undefined
  // their last write-back failed: it may have landed, its answer lost (the connection cut after its COMMIT)
  let unwrittenMayHaveLanded = false
  // the most events whose record is held: a batch that would hold more writes back (one row's list stays bounded)
  const maxUnwritten = 4 * batchSize
  // the horizon of the last read that found the stream's row: where a row made late starts (createMissingReactionStream)
  let lastHorizon: string | undefined

  /**
   * Writes back, under the lease (renewed): the job rows of `outcomes`, the record of the `done` events and the new
   * place. The running rows' ids by event id; undefined when another replica holds the stream (nothing written).
   */
  const writeBack = async (place: StreamPlace, outcomesAt: (now: Date) => readonly StreamOutcome[], done: readonly string[]) => {
    const now = await timeToWrite()
    const outcomes = outcomesAt(now)
    return writeReactionStream(db, { handler: name, leaseToken, place, outcomes, done, now, leaseEnd: new Date(now.getTime() + streamLeaseMs), types })
  }
  /** Another replica took the stream: `events` of this process's batches run again there. */
  const warnTakenOver = (events: number) =>
    logger.warn({ handler: name, events }, 'reaction stream lease was taken over: the batch runs again elsewhere')

  /** Writes back the batches held in memory (nothing to run, no job rows: their record and the new place). */
  const writeUnwritten = async () => {
    const pending = unwritten
    if (!pending) return
    unwritten = undefined
    let written: Map<string, string> | undefined
    try {
      written = await writeBack(pending.place, () => [], pending.done)
    } catch (error) {
      // (the database away: held again, the next read goes on from their place and a later write-back takes them; they
      // ran again when the lease was lost meanwhile)
      unwritten ??= pending
      unwrittenMayHaveLanded = true
      throw error
    }
    unwrittenMayHaveLanded = false
    if (!written) {
      leased = false
      warnTakenOver(pending.done.length)
    }
  }

  /** Runs one event's first attempt, in a slot the caller took (given back when the handler returns). */
  const attempt = async (entry: StreamEvent, signal: AbortSignal, stopSignal: AbortSignal): Promise<Finished> => {
    const { event } = entry
    let log: Logger | undefined
    const jobLog = () => (log ??= logger.child({ handler: name, eventId: event.eventId, attempt: 1 }))
    try {
      deps.onFirstStart?.(name, Math.max(0, (clock.now() - entry.recordedAt.getTime()) / 1000))
    } catch (error) {
      jobLog().warn({ err: error }, 'onFirstStart hook threw')
    }
    let failure: unknown
    running += 1
    // its own signal, aborted at its timeoutMs, when the handler has one (call-timeouts.ts)
    const timed = deps.timeouts?.start(signal)
    try {
      if (!deps.handler) throw new Error(`no reaction handler named ${name} is registered`)
      await deps.handler(event, {
        signal: timed ? timed.signal : signal,
        attempt: 1,
        get logger() {
          return jobLog()
        },
      })
    } catch (error) {
      failure = error ?? new Error('the handler threw without a reason')
    } finally {
      timed?.end()
      running -= 1
      deps.slots.give()
    }
    // past its deadline, the call is a timeout whatever it did then (a late return is not taken)
    if (timed?.timedOut) failure = timed.failure(failure)
    if (failure === undefined) {
      deps.recovery?.succeeded(name)
      return DONE
    }
    // (a call stopped at its lease's end got no answer from the handler's system: no sign of an outage)
    if (!signal.aborted) deps.recovery?.failed(name, event, failure)
    if (!timed?.timedOut && stopSignal.aborted && signal.aborted) return undefined
    const base = { event, createdAt: entry.recordedAt, lastError: null, runAt: await timeToWrite() }
    const message = deps.describeFailure(failure)
    deps.reportFailure?.(name, failure)
    if (deps.handler && triesAgain(failure, 1, settings.maxAttempts)) {
      const { delayS, error } = planRetry(failure, message, 1, settings.backoff, deps.random)
      deps.retryingLater({ log: jobLog(), handler: name, failure, error, retryInS: Math.round(delayS) })
      return { ...base, state: 'pending', attempts: 1, lastError: error, runAt: new Date(base.runAt.getTime() + delayS * 1000) }
    }
    jobLog().error({ error: message, attempts: 1 }, 'reaction handler failed for the last time: the job is failed until retried or skipped')
    return { ...base, state: 'failed', attempts: 1, lastError: message }
  }

  /** What an attempt's outcome counts as in the metrics. */
  const resultOf = (finished: Finished): AttemptResult =>
    finished === undefined ? 'released' : finished.state === 'pending' ? 'retry' : finished.state === 'failed' ? 'failed' : 'done'

  /**
   * A handed-off handler returned: its outcome goes to its job row, as a claimed job's does, tried again while the
   * database does not answer until `signal` aborts (the job's lease about to end, or the shutdown's grace over:
   * write-outcome.ts).
   */
  const writeHandedOff = async (id: string, eventId: string, finished: Finished, signal: AbortSignal) => {
    const written = await writeOutcome(
      async () => {
        const now = await timeToWrite()
        const lease = { id, leaseToken, now }
        // (given back by an earlier try whose answer was lost: its own outcome, not a lease lost)
        if (finished === undefined) return (await releaseJobs(db, { ids: [id], leaseToken, now })) > 0 || (await ownOutcomes(db, [{ id, leaseToken }])).has(id)
        if (finished.state === 'done') return completeJob(db, lease)
        if (finished.state === 'pending') return retryJobLater(db, { ...lease, runAt: finished.runAt, error: finished.lastError ?? '' })
        return failJob(db, { ...lease, error: finished.lastError ?? '' })
      },
      { clock, signal, log: () => logger.child({ jobId: id, handler: name, eventId, attempt: 1 }), retryable: (error) => !isSchemaMissing(error) },
    )
    deps.report(name, written ? resultOf(finished) : 'lease_lost')
  }

  /** Reads, runs and writes back one batch. */
  const batch = async (stopSignal: AbortSignal): Promise<BatchResult> => {
    const started = clock.now()
    // the batch's handlers have the jobs' lease: a handler still running at the write-back gets a job row leased to then
    const leaseEnd = new Date(started + settings.leaseMs)
    const asked = limit
    const after = unwritten
    const readStream = () =>
      readReactionStream(db, {
        handler: name,
        leaseToken,
        now: new Date(started),
        leaseEnd: new Date(started + streamLeaseMs),
        limit: asked,
        after: after?.place,
        types,
      })
    let read = await readStream()
    if (read.missing) {
      // no row, though the service made it at its start: the database was replaced and migrated from outside, or
      // restored without it. Made now as the start makes it (it was made only at the start, and no handler got a
      // transition until the replicas were restarted), from this replica's last sight of it; then read
      const made = await createMissingReactionStream(db, { handler: name, now: new Date(started), types, from: lastHorizon })
      if (made.created) {
        logger.warn(
          { handler: name, position: made.position },
          "reaction stream made: the database had no row for this handler's stream (replaced and migrated, or restored without it); it takes the transitions committed from this replica's last read of it on",
        )
      }
      read = await readStream()
    }
    if (read.horizon !== undefined) lastHorizon = read.horizon
    leased = read.leased
    if (unwrittenMayHaveLanded && unwritten && read.fromAfter) {
      // the held batches' write-back failed, and the stream's row stands at their place under this token: it landed,
      // its answer lost. Held on, they were recorded a second time with this batch's write-back
      unwrittenMayHaveLanded = false
      if (await streamStandsAt(db, { handler: name, leaseToken, place: unwritten.place })) unwritten = undefined
    }
    if (after && !read.fromAfter) {
      // another replica took the stream since: it reads those events again from the place last written
      unwritten = undefined
      warnTakenOver(after.done.length)
    }
    if (!read.leased || read.events.length === 0) {
      // nothing more to read now: what is held in memory is written back
      await writeUnwritten()
      return { full: false, read: 0, readAgainInMs: 0, withheld: read.withheld, heldUntil: read.heldUntil, otherTypes: read.otherTypes?.theirs }
    }

    // the abort of the handlers, and the batch's timers
    const abort = new AbortController()
    // every handler of the batch gets this signal, up to REACTION_CONCURRENCY at once, and may listen to it
    setMaxListeners(0, abort.signal)
    const timers = new AbortController()
    clock.sleep(Math.max(0, leaseEnd.getTime() - leaseMargin - clock.now()), timers.signal).then(
      () => abort.abort(new Error('the lease is about to end')),
      () => {},
    )
    // resolves abortUnwindMs after the shutdown's grace for the batch's handlers ends: they are aborted then, and a
    // handed-off call that has not ended on its abort by this is not waited for (its job is given back before the
    // process exits, below). Resolved in the abort's own turn, every call was taken for one that ignored it: a
    // handler that rejected at once on its signal was told to end on its signal
    let endGrace = () => {}
    const graceEnded = new Promise<typeof NOT_RETURNED>((resolve) => {
      endGrace = () => resolve(NOT_RETURNED)
    })
    const onStop = () => {
      clock
        .sleep(settings.shutdownTimeoutMs, timers.signal)
        .then(() => {
          abort.abort(new Error('the service is shutting down'))
          return clock.sleep(abortUnwindMs(settings.shutdownTimeoutMs), timers.signal)
        })
        .then(endGrace, () => {})
    }
    if (stopSignal.aborted) onStop()
    else stopSignal.addEventListener('abort', onStop, { once: true })

    const results = new Map<string, Finished>()
    // the attempt of each event whose handler is running
    const inFlight = new Map<string, Promise<Finished>>()
    let writingBack = false
    // a lane waiting for a slot stops waiting when the batch is written back (as does the read-ahead's wait); up to
    // REACTION_CONCURRENCY lanes wait on it at once while retries hold the slots
    const handoff = new AbortController()
    setMaxListeners(0, handoff.signal)

    // the handler's events, in stream order, and one chain of them per order (= sequence order within an order)
    const mine: StreamEvent[] = []
    const chains = new Map<number, StreamEvent[]>()
    // the chains no lane has taken yet, and those queued or running (a later read's events of their order join them)
    const queue: StreamEvent[][] = []
    const open = new Set<StreamEvent[]>()
    /** Takes a read's events of the handler's types: each joins its order's chain. */
    const take = (events: readonly StreamEvent[]) => {
      for (const entry of events) {
        if (!deps.takes(entry.event.type)) continue
        mine.push(entry)
        const chain = chains.get(entry.event.orderId)
        if (!chain) {
          const started = [entry]
          chains.set(entry.event.orderId, started)
          open.add(started)
          queue.push(started)
          continue
        }
        // a chain that ended with every event done runs on; one that ended on a failure holds the rest back
        const runsOn = !open.has(chain) && chain.every((earlier) => results.get(earlier.event.eventId)?.state === 'done')
        chain.push(entry)
        if (runsOn) {
          open.add(chain)
          queue.push(chain)
        }
      }
    }
    take(read.events)

    // the first call of each lane the batch starts with, given a slot at once, runs on the lease the batch just took
    // (so a batch makes progress); any later one only while its handler's whole timeout fits before the lease's end, or
    // it could be cut off there, counted as a failed attempt, and run again (found from outside: a receiver
    // answering in 14 s, FORWARD_TIMEOUT_MS=30000, REACTION_LEASE_S=40). The event left unstarted is written back
    // pending, due now, and the job loop runs it on a fresh lease.
    const fitsInLease = () => leaseEnd.getTime() - leaseMargin - clock.now() >= (deps.timeoutMs ?? 0)
    const runChain = async (chain: StreamEvent[], lane: { first: boolean }) => {
      try {
        if (chain[0]!.held) return
        for (const entry of chain) {
          // (done before a later read's events queued the chain again)
          if (results.has(entry.event.eventId)) continue
          if (writingBack || stopSignal.aborted) return
          const atOnce = deps.slots.tryTake()
          if (!atOnce && !(await deps.slots.whenFree(handoff.signal))) return
          if (writingBack || stopSignal.aborted || (!(lane.first && atOnce) && !fitsInLease())) {
            deps.slots.give()
            return
          }
          lane.first = false
          const call = attempt(entry, abort.signal, stopSignal)
          inFlight.set(entry.event.eventId, call)
          const finished = await call
          if (writingBack) return
          inFlight.delete(entry.event.eventId)
          results.set(entry.event.eventId, finished)
          if (finished?.state !== 'done') return
        }
      } finally {
        // (at once, in the same turn as the chain's last step: a read that comes after sees it ended)
        open.delete(chain)
      }
    }
    // up to REACTION_CONCURRENCY lanes, each taking the next chain from the queue until none is left
    const lanes = new Set<Promise<void>>()
    let lanesRunning = 0
    // the read-ahead's wait for the queue to run short
    let queueShort: (() => void) | undefined
    const shortQueue = Math.floor(settings.concurrency / 2)
    const lane = async (initial: boolean) => {
      const state = { first: initial }
      try {
        for (let chain = queue.shift(); chain && !writingBack; chain = queue.shift()) {
          if (queue.length <= shortQueue) queueShort?.()
          await runChain(chain, state)
        }
      } finally {
        lanesRunning -= 1
      }
    }
    /** `initial`: the lanes the batch starts with, whose first call always runs. */
    const addLanes = (initial = false) => {
      for (let count = Math.min(settings.concurrency - lanesRunning, queue.length); count > 0; count--) {
        lanesRunning += 1
        const running: Promise<void> = lane(initial).finally(() => lanes.delete(running))
        lanes.add(running)
      }
    }
    /** Resolves once a lane leaves no more than `shortQueue` chains in the queue; rejects when the batch is written back. */
    const whenQueueShort = () =>
      new Promise<void>((resolve, reject) => {
        const gaveUp = () => reject(handoff.signal.reason)
        queueShort = () => {
          queueShort = undefined
          handoff.signal.removeEventListener('abort', gaveUp)
          resolve()
        }
        if (handoff.signal.aborted) gaveUp()
        else handoff.signal.addEventListener('abort', gaveUp, { once: true })
      })
    const lanesEnded = async () => {
      while (lanes.size > 0) await Promise.all([...lanes])
    }
    addLanes(true)

    // Read-ahead: while the batch's handlers run (a slow handler's, the forwarder's requests), the stream reads
    // on from the last event read, gatherMs after that read and once the queue is short (so the read's own time
    // overlaps the last chains'), and the events join the batch: they wait for the queue, not for the batch's
    // last handler, its write-back and the next read. Until WRITE_BACK_MS after the batch's first read (the
    // batch's record is written back once it ends), while the reads are not full (a backlog is read in full
    // batches) and at most `maxUnwritten` events in all.
    let place: StreamEvent = read.events.at(-1)!
    let last = { count: read.events.length, at: clock.now(), full: read.events.length === asked, withheld: read.withheld }
    let readTotal = read.events.length
    // a read-ahead found the stream under another lease token: nothing of the batch is written back
    let lost = false
    /** Resolves true once `wait` ends, false if every lane ended first (the batch is over) or it was given up. */
    const unlessEnded = (wait: Promise<unknown>) =>
      Promise.race([
        wait.then(
          () => true,
          () => false,
        ),
        lanesEnded().then(() => false),
      ])
    const readAhead = async () => {
      for (;;) {
        const gathered = clock.sleep(Math.max(0, gatherMs(last.count) - (clock.now() - last.at)), handoff.signal)
        if (!(await unlessEnded(gathered))) return
        if (queue.length > shortQueue && !(await unlessEnded(whenQueueShort()))) return
        const now = clock.now()
        if (writingBack || stopSignal.aborted || lanesRunning === 0 || last.full || now - started >= WRITE_BACK_MS || readTotal + asked > maxUnwritten) return
        let more: Awaited<ReturnType<typeof readReactionStream>>
        try {
          const at = await timeToWrite()
          more = await readReactionStream(db, { handler: name, leaseToken, now: at, leaseEnd: new Date(at.getTime() + streamLeaseMs), limit: asked, after: place, types })
        } catch {
          // the database away: the batch reads no further, and its write-back (tried again while the lease lasts)
          // says so. Thrown from here, it ended the batch with nothing of it written, and its events ran again.
          // A schema not whole (a table or a column missing) ends the read-ahead too, and is not handed to the schema
          // watch from here: the batch's handlers have run, and its write-back records them if the tables it writes
          // are whole (else it meets the error itself, is not tried again, and the dispatcher holds: schema-watch.ts);
          // the stream's next read meets what this read met. Handed over at once, the events already handled would
          // have been left unwritten, and run again once the schema is whole
          return
        }
        // (the batch is being written back: the next batch reads these events again)
        if (writingBack) return
        if (!more.leased || !more.fromAfter) {
          lost = true
          leased = more.leased
          return
        }
        last = { count: more.events.length, at: clock.now(), full: more.events.length === asked, withheld: more.withheld }
        if (more.events.length === 0) continue
        readTotal += more.events.length
        place = more.events.at(-1)!
        take(more.events)
        addLanes()
      }
    }
    const readingAhead = readAhead()
    const all = readingAhead.then(lanesEnded)
    const handoffOrStop = anySignal([handoff.signal, stopSignal])
    const runFrom = clock.now()
    // written back when every handler returned, or none did for HANDOFF_MS, or after the longest wait
    const stalledOrCut = async () => {
      for (let returned = -1; returned < results.size; ) {
        returned = results.size
        const left = bounds.waitMs - (clock.now() - runFrom)
        if (left <= 0) return
        await clock.sleep(Math.min(HANDOFF_MS, left), handoffOrStop)
      }
    }
    const allFinished = await Promise.race([
      all.then(() => true),
      stalledOrCut().then(
        () => false,
        () => false,
      ),
    ])
    handoff.abort(BATCH_WRITTEN_BACK)
    handoffOrStop.clear()
    writingBack = true
    // (a read-ahead under way ends without taking its events: the next batch reads them again)
    await readingAhead
    if (!stopSignal.aborted) {
      // an order's first event not done yet that no slot reached (not behind its own failure or slow call)
      const unreached = [...chains.values()].some((chain) => {
        if (chain[0]!.held) return false
        const next = chain.find((entry) => results.get(entry.event.eventId)?.state !== 'done')
        return next !== undefined && !results.has(next.event.eventId) && !inFlight.has(next.event.eventId)
      })
      const finished = results.size
      limit = nextBatchLimit(asked, { read: readTotal, full: last.full, mine: mine.length, finished, elapsedMs: clock.now() - runFrom, allFinished, unreached }, bounds)
    }

    // every event of the handler not done gets its job row: its outcome; running (handed off); or pending, due now
    const now = clock.now()
    // (writtenAt: the time of the write-back's try that lands)
    const rowOf = (entry: StreamEvent, finished: StreamOutcome | undefined, writtenAt: Date): StreamOutcome => {
      const { eventId } = entry.event
      if (finished) return finished
      const base = { event: entry.event, createdAt: entry.recordedAt, lastError: null }
      if (inFlight.has(eventId)) return { ...base, state: 'running', attempts: 1, runAt: leaseEnd, leaseExpiresAt: leaseEnd, leaseToken }
      return { ...base, state: 'pending', attempts: 0, runAt: writtenAt }
    }
    // the batches held in memory go with this one's write-back
    const done: string[] = unwritten?.done ?? []
    const outcomes: [StreamEvent, StreamOutcome | undefined][] = []
    for (const entry of mine) {
      const { eventId } = entry.event
      const finished = results.get(eventId)
      if (finished?.state === 'done') done.push(entry.historyId)
      else outcomes.push([entry, finished])
    }
    const outcomesAt = (writtenAt: Date) => outcomes.map(([entry, finished]) => rowOf(entry, finished, writtenAt))
    // (a handler stopped by the shutdown before it returned made no attempt: pending, due now, as above)
    // counted by result: one metrics update per result a batch, not one per event
    const counts = new Map<AttemptResult, number>()
    for (const finished of results.values()) {
      const result = resultOf(finished)
      counts.set(result, (counts.get(result) ?? 0) + 1)
    }
    for (const [result, count] of counts) deps.report(name, result, count)
    const since = unwritten?.since ?? started
    const result = {
      full: last.full,
      read: readTotal,
      readAgainInMs: Math.max(0, gatherMs(last.count) - (clock.now() - last.at)),
      withheld: last.withheld,
    }
    if (!lost && outcomes.length === 0 && inFlight.size === 0 && !stopSignal.aborted && now - since < WRITE_BACK_MS && done.length <= maxUnwritten) {
      // every event done: the write-back may wait for a later batch's (the next read starts from this place)
      unwritten = { place, done, since }
      timers.abort(BATCH_WRITTEN_BACK)
      stopSignal.removeEventListener('abort', onStop)
      return result
    }
    unwritten = undefined
    let ids: Map<string, string> | undefined
    try {
      // (lost: another replica took the stream meanwhile, and runs these events again)
      // The database away (a failover, a cut connection): tried again with backoff while the batch's lease lasts
      // (REACTION_LEASE_S from its read, less the margin at which its handlers are aborted) or until the shutdown's grace
      // ends (write-outcome.ts). Every try is fenced by the stream's lease token: once another replica took the stream
      // (or an operator gave its lease back), it writes nothing and those events run there again. Before, the one
      // write failed, nothing of the batch was written, and its events ran again once the database was back: a
      // forwarder sent the same webhook-id twice after a blip of a few seconds
      ids = lost
        ? undefined
        : await writeOutcome(() => writeBack(place, outcomesAt, done), {
            clock,
            signal: abort.signal,
            log: () => logger.child({ handler: name }),
            retryable: (error) => !isSchemaMissing(error),
            what: 'a reaction stream batch',
          })
    } finally {
      // handlers still running own their rows from here (or, the write lost, run out with the lease)
      // Each call's outcome is written as it returns, not in turn: one call that never returns held back the rows of
      // the calls after it, which stayed running until their lease ran out and were then run again. A call still
      // running when the shutdown's grace ends (its handler ignores its abort) is not waited for: its job is given
      // back (pending, due now) before the process exits, where the stop waited for it past its bound and left the
      // job running under its lease, REACTION_LEASE_S (300 s), for any replica. The call may have had its effect:
      // the job runs again, with the same event id (at least once).
      const settleOne = async (eventId: string, call: Promise<Finished>) => {
        const outcome = await Promise.race([call, graceEnded])
        const finished = outcome === NOT_RETURNED ? undefined : outcome
        if (outcome === NOT_RETURNED) {
          logger.warn({ handler: name, eventId }, HANDLER_IGNORED_ABORT)
        }
        const id = ids?.get(eventId)
        try {
          if (id) await writeHandedOff(id, eventId, finished, abort.signal)
        } catch (error) {
          logger.warn({ err: error, handler: name, eventId }, 'could not record a reaction job outcome; it runs again after its lease')
        }
        return finished === undefined
      }
      const settle = async () => {
        try {
          const stopped = (await Promise.all([...inFlight].map(([eventId, call]) => settleOne(eventId, call)))).filter(Boolean).length
          if (stopped > 0) logger.warn({ handler: name, jobs: stopped }, 'reaction handlers stopped before finishing; their jobs run again')
        } finally {
          timers.abort(BATCH_WRITTEN_BACK)
          stopSignal.removeEventListener('abort', onStop)
        }
      }
      if (inFlight.size === 0) {
        timers.abort(BATCH_WRITTEN_BACK)
        stopSignal.removeEventListener('abort', onStop)
      } else {
        const done: Promise<void> = settle().finally(() => {
          handedOff.delete(done)
          deps.jobsWritten()
        })
        handedOff.add(done)
      }
    }
    if (!ids) {
      leased = false
      warnTakenOver(outcomes.length + done.length)
    } else if (outcomes.length > 0) {
      deps.jobsWritten()
    }
    return result
  }

  return {
    /** The handler whose stream this is. */
    name,
    batch,
    /** How many events the next batch reads. */
    get limit() {
      return limit
    },
    /** Whether this process held the stream's lease at its last read (and did not lose it writing back). */
    get leased() {
      return leased
    },
    /** Handlers of this stream running now. */
    get running() {
      return running
    },
    /**
     * Waits for the handed-off handlers to end and write their outcome (stop: they are aborted after the shutdown timeout,
     * and one that ignores its abort has its job given back then, not waited for).
     */
    settled: () => Promise.all([...handedOff]).then(() => {}),
    /** Writes back what is held in memory, and gives the lease back (shutdown). */
    release: async () => {
      await writeUnwritten().catch((error: unknown) =>
        logger.warn({ err: error, handler: name }, 'could not write back the last reaction stream batches; their events run again'),
      )
      leased = false
      await releaseReactionStream(db, name, leaseToken)
    },
  }
}

export type StreamWorker = ReturnType<typeof createStreamWorker>
