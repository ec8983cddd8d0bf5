// When a failed poll is tried again: exponential in the order's consecutive failed attempts, capped, with
// equal jitter (half the delay fixed, half random) so orders that failed together (the platform was down)
// do not all come due in the same second. Pure: imports nothing of ours.

export interface BackoffSettings {
  /** The delay after the first failure, in seconds. */
  baseS: number
  /** No delay exceeds this, in seconds. */
  capS: number
}

export const DEFAULT_BACKOFF: BackoffSettings = { baseS: 30, capS: 3_600 }

/**
 * Seconds to wait after the `attempt`-th consecutive failure (1 for the first): between half and all of
 * min(cap, base * 2^(attempt-1)). `random` is a source in [0, 1).
 */
export function backoffDelayS(attempt: number, settings: BackoffSettings, random: () => number): number {
  const exponent = Math.max(0, Math.floor(attempt) - 1)
  // 2^exponent overflows to Infinity long after it passed any cap, and min() handles that
  const ceiling = Math.min(settings.capS, settings.baseS * 2 ** exponent)
  const half = ceiling / 2
  return half + half * Math.min(Math.max(random(), 0), 1)
}
