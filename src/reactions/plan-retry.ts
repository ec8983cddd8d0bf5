// Whether and when a handler's failed attempt is tried again: not after its last attempt, nor when its error
// says no attempt can succeed (`permanent`: the forwarder's 410 Gone); else after the backoff
// (reconcile/backoff-delay.ts), or, when its
// error says how long the other side asked us to wait (`retryAfterMs`: the forwarder's ForwardError and the
// partner API client's PartnerApiError carry an answer's Retry-After so), no earlier than that, and never
// later than the backoff's cap. Used by the streams' first attempts and the job loop's retries alike. Pure.
//
// The cap: a Retry-After is the other side's word, and a wrong one (99999999999 seconds, a date in 9999)
// would put the job, and the order's later events behind it, off for centuries with nothing failed to show it.
import { backoffDelayS, type BackoffSettings } from '../reconcile/backoff-delay.js'

export interface RetryPlan {
  /** Seconds from now to the next attempt. */
  delayS: number
  /** The error to keep on the job: the attempt's, and when the wait asked for was cut to the cap, that. */
  error: string
}

/**
 * Whether the `attempt`-th failed attempt (1 for the first), which failed with `failure`, is tried again: attempts
 * are left, and its error is not `permanent`. Otherwise the job is failed, as after its last attempt.
 */
export function triesAgain(failure: unknown, attempt: number, maxAttempts: number): boolean {
  return attempt < maxAttempts && (failure as { permanent?: unknown } | null | undefined)?.permanent !== true
}

/** The retry of the `attempt`-th failed attempt (1 for the first), which failed with `failure`, described as `error`. */
export function planRetry(
  failure: unknown,
  error: string,
  attempt: number,
  backoff: BackoffSettings,
  random: () => number,
): RetryPlan {
  const delayS = backoffDelayS(attempt, backoff, random)
  const askedS = askedWaitS(failure)
  if (askedS === undefined || askedS <= delayS) return { delayS, error }
  if (askedS <= backoff.capS) return { delayS: askedS, error }
  return { delayS: backoff.capS, error: `${error} (retried after ${backoff.capS} s instead, the longest wait between attempts)` }
}

/** The wait an error asks for, in seconds; undefined when it asks for none. */
function askedWaitS(failure: unknown): number | undefined {
  const retryAfterMs = (failure as { retryAfterMs?: unknown } | null | undefined)?.retryAfterMs
  if (typeof retryAfterMs !== 'number' || !(retryAfterMs >= 0)) return undefined
  return retryAfterMs / 1000
}
