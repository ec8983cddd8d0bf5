// Time comes from here, so tests of backoff, leases and timestamp windows advance a fake clock instead
// of sleeping.
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number
  /**
   * Milliseconds from an arbitrary origin, on a clock that is never set or stepped (the wall clock may be: NTP, an
   * operator, a VM resumed): what a deadline is timed by, so a wall clock stepped back does not stretch it. A clock
   * without it (a test's, whose now() moves only when told) times deadlines by now().
   */
  monotonicNow?(): number
  /** Resolves after `ms` of this clock's time; rejects with the signal's reason when aborted. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>
}

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonicNow: () => performance.now(),
  // by hand rather than timers/promises' setTimeout, which makes an AbortError (and its stack) on every
  // abort: the reaction streams end two sleeps per batch that way
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason)
        return
      }
      const onAbort = () => {
        clearTimeout(timer)
        reject(signal!.reason)
      }
      const timer = setTimeout(() => {
        signal?.removeEventListener('abort', onAbort)
        resolve()
      }, ms)
      signal?.addEventListener('abort', onAbort, { once: true })
    }),
}

/** The longest wait a Node timer keeps (2³¹−1 ms, about 24.8 days): a longer one fires after 1 ms instead. */
export const MAX_TIMER_MS = 2 ** 31 - 1

/** `clock`'s monotonic time, or its now() for a clock that has none: what deadlines are timed by. */
export function monotonicNow(clock: Clock): number {
  return clock.monotonicNow ? clock.monotonicNow() : clock.now()
}
