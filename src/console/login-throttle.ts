// How many wrong console tokens are checked before the console stops checking them for a while. One count for
// every client: the operator listener is for this machine or a private network, and a count per address is a map
// that whoever sends requests grows. This one holds WRONG_TOKENS_ALLOWED times at most, whoever sends them.
//
// At most WRONG_TOKENS_ALLOWED wrong tokens in any THROTTLE_WINDOW_MS: past them, every token (a right one too, or
// the answer would tell a guesser when it was right) is answered 429 unchecked until the oldest of them is a window
// old. A session already open is not a token tried and goes on working. Pure.

/**
 * Ten wrong tokens a minute: more than an operator mistypes in one, and a guesser's 14,400 tries a day are nothing
 * against a token of 24 characters or more (the local one is 64 hex digits).
 */
export const WRONG_TOKENS_ALLOWED = 10
export const THROTTLE_WINDOW_MS = 60_000

export interface LoginThrottle {
  /** How long, in ms, until a token is checked again; 0 when one is checked now. */
  waitMs(): number
  /** A token was checked and was wrong. */
  wrongToken(): void
}

export function createLoginThrottle({
  now,
  allowed = WRONG_TOKENS_ALLOWED,
  windowMs = THROTTLE_WINDOW_MS,
}: {
  now: () => number
  allowed?: number
  windowMs?: number
}): LoginThrottle {
  // when the last `allowed` wrong tokens came, oldest first
  const wrong: number[] = []
  return {
    waitMs() {
      if (wrong.length < allowed) return 0
      // at most a window: a clock set back does not pause the console for longer
      return Math.min(windowMs, Math.max(0, wrong[0]! + windowMs - now()))
    },
    wrongToken() {
      wrong.push(now())
      if (wrong.length > allowed) wrong.shift()
    },
  }
}
