// Deadlines that all come `timeoutMs` after they were set, on one timer: the forwarder's attempts (forwarder.ts), and
// the calls of a handler registered with a timeoutMs (call-timeouts.ts). With one timeout for all, the one set
// first is the first to expire, so the timer only ever waits for the oldest: a call costs a Set entry, not a timer
// and an AbortController of its own (the forwarder's per-attempt timer and controller cost 23 µs of CPU per event:
// bench/results/forward-drain.md). The timer stops when no deadline is left and starts again with the next. Timed on
// the clock's monotonic time, so a wall clock stepped back does not stretch them, and on the injected clock, so a
// test can expire one without waiting.
import { type Clock, monotonicNow } from '../clock.js'

export interface Deadline {
  readonly at: number
  readonly expire: () => void
}

export interface Deadlines {
  /** Sets a deadline `timeoutMs` from now: `expire` is called then, unless it was deleted first. */
  add(expire: () => void): Deadline
  /** The work ended first: its deadline is dropped (the timer stops when it was the last). */
  delete(deadline: Deadline): void
}

// the reason the timer's sleep is stopped with (an abort without one builds a DOMException each time)
const NONE_LEFT = new Error('no deadline is waiting')

export function createDeadlines(clock: Clock, timeoutMs: number): Deadlines {
  // in the order they were set (a Set keeps insertion order), so in the order they expire
  const waiting = new Set<Deadline>()
  let idle: AbortController | undefined

  const watch = async (stop: AbortSignal) => {
    for (let oldest = first(waiting); oldest; oldest = first(waiting)) {
      const wait = oldest.at - monotonicNow(clock)
      if (wait > 0) {
        if (!(await clock.sleep(wait, stop).then(() => true, () => false))) return
        continue
      }
      waiting.delete(oldest)
      oldest.expire()
    }
    if (idle?.signal === stop) idle = undefined
  }

  return {
    add(expire) {
      const deadline = { at: monotonicNow(clock) + timeoutMs, expire }
      waiting.add(deadline)
      if (!idle) {
        idle = new AbortController()
        void watch(idle.signal)
      }
      return deadline
    },
    delete(deadline) {
      if (!waiting.delete(deadline) || waiting.size > 0) return
      idle?.abort(NONE_LEFT)
      idle = undefined
    },
  }
}

const first = <T>(set: Set<T>): T | undefined => set.values().next().value
