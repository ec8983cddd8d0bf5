// Time comes from here, so tests of backoff, leases and timestamp windows advance a fake clock instead
// of sleeping.
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number
  /** Resolves after `ms` of this clock's time; rejects with the signal's reason when aborted. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>
}

export const systemClock: Clock = {
  now: () => Date.now(),
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
