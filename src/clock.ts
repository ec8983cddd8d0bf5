// Time comes from here, so tests of backoff, leases and timestamp windows advance a fake clock instead
// of sleeping.
import { setTimeout as delay } from 'node:timers/promises'

export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number
  /** Resolves after `ms` of this clock's time; rejects with the signal's reason when aborted. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>
}

export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: async (ms, signal) => {
    await delay(ms, undefined, signal ? { signal } : undefined)
  },
}
