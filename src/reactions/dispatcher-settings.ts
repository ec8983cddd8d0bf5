// What the dispatcher (dispatcher.ts) and its stream workers (stream-worker.ts) are set with, and what one
// attempt of a handler can end as.
import type { BackoffSettings } from '../reconcile/backoff-delay.js'

export interface DispatcherSettings {
  /** REACTION_CONCURRENCY: calls of each handler running at once in this process (each handler has its own slots). */
  concurrency: number
  /** REACTION_MAX_ATTEMPTS: calls of one (event, handler) before it is failed. */
  maxAttempts: number
  /** How long a claim belongs to this process; the handler is aborted a little before it ends. */
  leaseMs: number
  backoff: BackoffSettings
  /** The longest the loop sleeps without looking. */
  safetyIntervalMs: number
  /** How long stop() lets running handlers finish before aborting them. */
  shutdownTimeoutMs: number
  /** How long a stream's events wait behind an open transaction before it is said (REACTION_HELD_BACK_WARN_S; HELD_BACK_WARN_MS when absent). */
  heldBackWarnMs?: number
}

/**
 * How long a stream's committed events may wait behind an open transaction before the dispatcher says so, naming
 * the oldest open transaction on the server (and again as often while they still wait): REACTION_HELD_BACK_WARN_S's
 * default. Any transaction of the server holds them back, in any database: one of another application's held every
 * stream for minutes, with nothing but the growing age of the oldest pending event to show it.
 */
export const HELD_BACK_WARN_MS = 60_000

/**
 * REACTION_MAX_ATTEMPTS's default: calls of one (event, handler) before its job is failed. With the default backoff
 * (5 s doubling to an hour, equal jitter) the 49 waits between 50 calls add up to 20.2 to 40.4 hours, so a receiver or broker away for a
 * night comes back to its events waiting, not failed: the first successful call pulls the waiting retries forward.
 * The default was 10, whose retries spread over 21 to 43 minutes: an outside review's receiver, down 25 minutes,
 * came back to five events failed and the 15 later events of their orders held behind them until an operator retried.
 */
export const DEFAULT_MAX_ATTEMPTS = 50

export const DEFAULT_DISPATCHER_SETTINGS: Omit<DispatcherSettings, 'concurrency' | 'maxAttempts'> = {
  leaseMs: 5 * 60_000,
  backoff: { baseS: 5, capS: 3_600 },
  safetyIntervalMs: 30_000,
  shutdownTimeoutMs: 10_000,
}

/**
 * How long a handler aborted at the end of the shutdown's grace (`shutdownTimeoutMs`) is given to end on its signal (a
 * rejection, its `finally`) before it is taken for one that ignores the abort: said in a warning, its job given back all
 * the same. A second, or a fifth of the grace where that is shorter: the dispatcher's grace is half the service's stop
 * bound (SHUTDOWN_TIMEOUT_MS), and a stream's unwind and then the job loop's fit in what is left of it.
 */
export const abortUnwindMs = (shutdownTimeoutMs: number): number => Math.min(1_000, shutdownTimeoutMs / 5)

/**
 * How long before its lease ends a handler still running is aborted (past the lease, another replica may claim
 * its job again): a call given longer than the lease less this never gets its answer.
 */
export const leaseMarginMs = (leaseMs: number): number => Math.min(5_000, leaseMs / 10)

/** skipped: not called, since the handler no longer takes the job's event type. */
export type AttemptResult = 'done' | 'retry' | 'failed' | 'released' | 'lease_lost' | 'skipped'
