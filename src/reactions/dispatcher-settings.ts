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
  /** How long a stream's events wait behind an open transaction before it is said (dispatcher.ts, HELD_BACK_WARN_MS). */
  heldBackWarnMs?: number
}

export const DEFAULT_DISPATCHER_SETTINGS: Omit<DispatcherSettings, 'concurrency' | 'maxAttempts'> = {
  leaseMs: 5 * 60_000,
  backoff: { baseS: 5, capS: 3_600 },
  safetyIntervalMs: 30_000,
  shutdownTimeoutMs: 10_000,
}

/**
 * How long before its lease ends a handler still running is aborted (past the lease, another replica may claim
 * its job again): a call given longer than the lease less this never gets its answer.
 */
export const leaseMarginMs = (leaseMs: number): number => Math.min(5_000, leaseMs / 10)

/** skipped: not called, since the handler no longer takes the job's event type. */
export type AttemptResult = 'done' | 'retry' | 'failed' | 'released' | 'lease_lost' | 'skipped'
