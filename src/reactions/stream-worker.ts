// One handler's stream (reaction-stream.repository.ts), read and run by the dispatcher of the replica that
// holds its lease: the path of every event's first attempt.
//
// A batch: read up to `batchSize` events after the stream's place, keep those of the handler's types, run
// them (one order's events one after another, in sequence order; different orders at once, at most
// REACTION_CONCURRENCY), and write back in one statement a job row per event and the new place:
// - done: the handler returned;
// - pending, after a backoff: it threw and has attempts left (the job loop of dispatcher.ts runs it again);
// - failed: it threw on its last attempt (REACTION_MAX_ATTEMPTS of 1);
// - pending, due now and attempts 0: an event behind an earlier one of its order that has not succeeded,
//   in this batch or as an unfinished job; the job loop runs it once that one is done or skipped.
// A handler still running shortly before the lease ends is aborted (it counts as a throw), so the write-back
// happens under the lease. At shutdown the handlers get the shutdown timeout, then are aborted; the place
// stops before the first event not finished, and those after it that did finish are written as done (a
// later read skips an event that already has a job row).
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import { backoffDelayS } from '../reconcile/backoff-delay.js'
import type { AttemptResult, DispatcherSettings } from './dispatcher.js'
import type { ReactionHandler } from './reaction-event.js'
import {
  ordersWithUnfinishedJobs,
  readReactionStream,
  releaseReactionStream,
  type StreamEvent,
  type StreamOutcome,
  type StreamPlace,
  writeReactionStream,
} from './reaction-stream.repository.js'

export interface StreamWorkerDeps {
  db: Kysely<Database>
  name: string
  handler: ReactionHandler | undefined
  /** Whether this handler takes events of `type`. */
  takes: (type: string) => boolean
  clock: Clock
  logger: Logger
  settings: DispatcherSettings
  leaseToken: string
  random: () => number
  report: (handler: string, result: AttemptResult) => void
  onFirstStart?: ((handler: string, latencyS: number) => void) | undefined
  /** Pending job rows were written: the job loop must look. */
  jobsWritten: () => void
  describeFailure: (error: unknown) => string
}

export interface BatchResult {
  /** The stream gave as many events as asked: there may be more right away. */
  full: boolean
  /** Another replica holds the stream. */
  elsewhere: boolean
  /** Events are committed after the place but not readable yet (an older transaction is still open). */
  withheld: boolean
}

type Finished = { outcome: StreamOutcome } | undefined

export function createStreamWorker(deps: StreamWorkerDeps) {
  const { db, name, clock, logger, settings, leaseToken } = deps
  const batchSize = Math.max(64, 8 * settings.concurrency)
  const leaseMargin = Math.min(5_000, settings.leaseMs / 10)
  let running = 0

  /** Runs one event's first attempt; undefined when it was stopped by the shutdown (nothing to write). */
  const attempt = async (entry: StreamEvent, signal: AbortSignal, stopSignal: AbortSignal): Promise<Finished> => {
    const { event } = entry
    const now = () => new Date(clock.now())
    let log: Logger | undefined
    const logger_ = () => (log ??= logger.child({ handler: name, eventId: event.eventId, attempt: 1 }))
    try {
      deps.onFirstStart?.(name, Math.max(0, (clock.now() - entry.recordedAt.getTime()) / 1000))
    } catch (error) {
      logger_().warn({ err: error }, 'onFirstStart hook threw')
    }
    let failure: unknown
    if (!deps.handler) {
      failure = new Error(`no reaction handler named ${name} is registered`)
    } else {
      running += 1
      try {
        await deps.handler(event, {
          signal,
          attempt: 1,
          get logger() {
            return logger_()
          },
        })
      } catch (error) {
        failure = error ?? new Error('the handler threw without a reason')
      } finally {
        running -= 1
      }
    }
    const base = { event, createdAt: entry.recordedAt, lastError: null, runAt: now() }
    if (failure === undefined) {
      deps.report(name, 'done')
      return { outcome: { ...base, state: 'done', attempts: 1 } }
    }
    if (stopSignal.aborted && signal.aborted) {
      deps.report(name, 'released')
      return undefined
    }
    const message = deps.describeFailure(failure)
    if (1 < settings.maxAttempts && deps.handler) {
      const delayS = backoffDelayS(1, settings.backoff, deps.random)
      deps.report(name, 'retry')
      logger_().warn({ error: message, retryInS: Math.round(delayS) }, 'reaction handler failed; retrying later')
      return { outcome: { ...base, state: 'pending', attempts: 1, lastError: message, runAt: new Date(clock.now() + delayS * 1000) } }
    }
    deps.report(name, 'failed')
    logger_().error({ error: message, attempts: 1 }, 'reaction handler failed for the last time: the job is failed until retried or skipped')
    return { outcome: { ...base, state: 'failed', attempts: 1, lastError: message } }
  }

  /** Reads, runs and writes back one batch. */
  const batch = async (stopSignal: AbortSignal): Promise<BatchResult> => {
    const started = clock.now()
    const leaseEnd = new Date(started + settings.leaseMs)
    const read = await readReactionStream(db, { handler: name, leaseToken, now: new Date(started), leaseEnd, limit: batchSize })
    if (!read.leased || !read.from) return { full: false, elsewhere: true, withheld: false }
    if (read.events.length === 0) return { full: false, elsewhere: false, withheld: read.withheld }

    const mine = read.events.filter((entry) => !entry.taken && deps.takes(entry.event.type))
    const blocked = await ordersWithUnfinishedJobs(db, name, [...new Set(mine.map((entry) => entry.event.orderId))])
    // one chain per order, in stream order (= sequence order within an order)
    const chains = new Map<number, StreamEvent[]>()
    for (const entry of mine) {
      const chain = chains.get(entry.event.orderId)
      if (chain) chain.push(entry)
      else chains.set(entry.event.orderId, [entry])
    }

    // aborted shortly before the lease ends, and at shutdown once the handlers had their time
    const abort = new AbortController()
    const timer = new AbortController()
    clock.sleep(Math.max(0, leaseEnd.getTime() - leaseMargin - clock.now()), timer.signal).then(
      () => abort.abort(new Error('the stream lease is about to end')),
      () => {},
    )
    const onStop = () => {
      clock.sleep(settings.shutdownTimeoutMs, timer.signal).then(
        () => abort.abort(new Error('the service is shutting down')),
        () => {},
      )
    }
    stopSignal.addEventListener('abort', onStop, { once: true })

    const results = new Map<string, Finished>()
    const waitBehind = (entry: StreamEvent): Finished => ({
      outcome: { event: entry.event, state: 'pending', attempts: 0, runAt: new Date(clock.now()), lastError: null, createdAt: entry.recordedAt },
    })
    const runChain = async (chain: StreamEvent[]) => {
      let held = blocked.has(chain[0]!.event.orderId)
      for (const entry of chain) {
        if (held) {
          results.set(entry.event.eventId, waitBehind(entry))
          continue
        }
        if (stopSignal.aborted) return
        const finished = await attempt(entry, abort.signal, stopSignal)
        results.set(entry.event.eventId, finished)
        if (finished === undefined) return
        if (finished.outcome.state !== 'done') held = true
      }
    }
    try {
      // at most REACTION_CONCURRENCY chains at once
      const queue = [...chains.values()]
      const lanes = Array.from({ length: Math.min(settings.concurrency, queue.length) }, async () => {
        for (let chain = queue.shift(); chain; chain = queue.shift()) await runChain(chain)
      })
      await Promise.all(lanes)
    } finally {
      timer.abort()
      stopSignal.removeEventListener('abort', onStop)
    }

    // the place: after the last event read, or (stopped) just before the first event of the handler not finished
    let place: StreamPlace = read.events.at(-1)!
    const firstUnfinished = mine.find((entry) => results.get(entry.event.eventId) === undefined)
    if (firstUnfinished) {
      const index = read.events.indexOf(firstUnfinished)
      place = index === 0 ? read.from : read.events[index - 1]!
    }
    const outcomes = [...results.values()].flatMap((finished) => (finished ? [finished.outcome] : []))
    const now = clock.now()
    const written = await writeReactionStream(db, {
      handler: name,
      leaseToken,
      place,
      outcomes,
      now: new Date(now),
      leaseEnd: new Date(now + settings.leaseMs),
    })
    if (!written) {
      logger.warn({ handler: name, events: outcomes.length }, 'reaction stream lease was taken over: the batch runs again elsewhere')
    } else if (outcomes.some((outcome) => outcome.state === 'pending')) {
      deps.jobsWritten()
    }
    return { full: read.events.length === batchSize && !firstUnfinished, elsewhere: !written, withheld: read.withheld }
  }

  return {
    batch,
    /** Handlers of this stream running now. */
    get running() {
      return running
    },
    /** Gives the lease back (shutdown). */
    release: () => releaseReactionStream(db, name, leaseToken),
  }
}

export type StreamWorker = ReturnType<typeof createStreamWorker>
