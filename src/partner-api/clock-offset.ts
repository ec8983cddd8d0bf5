// The platform's clock, as its answers tell it (the HTTP Date header), against this machine's. Pure.
//
// Requests are signed with this machine's time (X-Partner-Timestamp) and the platform refuses one outside
// its window (spec section 5: "must be recent", the length not shown; the sandbox's is 300 s). A machine
// whose clock drifted (a VM, a host without NTP) is refused with 401 on every call although its credentials
// are right; the Date of those answers is how it can tell.
import { parseHttpDate } from '../http/http-date.js'

/**
 * An offset beyond this is named in a 401's message. Date has whole seconds and is stamped before the answer
 * travels, so a reading on two good clocks is off by a second or two (more on a slow answer); 60 s is far
 * above that, below the 5-minute windows platforms commonly use (the sandbox's too), and a minute's drift is
 * worth fixing whatever the platform's window is.
 */
export const CLOCK_OFFSET_THRESHOLD_S = 60

/**
 * The largest offset read, either way: about 68 years, what reconcile_runs.clock_offset_s (an integer) holds. A Date
 * further off is no drift of either clock (one that far off fails the platform's TLS certificate before any 401)
 * but the platform's own error, and is not read: a Date of 1901 or 9999 made the run record's write fail, the
 * poller's 401 backoff skipped, and the platform called four times as often.
 */
export const MAX_CLOCK_OFFSET_S = 2_147_483_647

/**
 * Whole seconds the platform's clock is ahead of this machine's (negative: behind), from an answer's Date
 * header and this machine's time when the answer came; undefined when there is no Date, it is unreadable, or it
 * is more than MAX_CLOCK_OFFSET_S off.
 */
export function measureClockOffset(dateHeader: string | null, nowMs: number): number | undefined {
  if (dateHeader === null) return undefined
  // strictly an HTTP-date: Date.parse reads a garbled "1" as a day in 2001, a clock 25 years behind
  const dateMs = parseHttpDate(dateHeader)
  if (dateMs === undefined) return undefined
  // Date is cut to the whole second: the platform's time lay anywhere in that second, half of it on average
  const offsetS = Math.round((dateMs + 500 - nowMs) / 1000)
  return Math.abs(offsetS) <= MAX_CLOCK_OFFSET_S ? offsetS : undefined
}

/** True when the offset is large enough to explain a refused timestamp. */
export function isClockOffsetTooLarge(offsetS: number | undefined): offsetS is number {
  return offsetS !== undefined && Math.abs(offsetS) > CLOCK_OFFSET_THRESHOLD_S
}

/** What a 401 says about the clocks: the one place this text is built. */
export function describeClockOffset(offsetS: number): string {
  const direction = offsetS > 0 ? 'ahead of' : 'behind'
  return (
    `the platform's clock is ${Math.abs(offsetS)} s ${direction} this machine's (its Date header): requests ` +
    `are signed with this machine's time, so check its clock (NTP)`
  )
}
