// An event loop that wakes late, as on a loaded machine, made on purpose for the tests of which of two waits ends
// another. Node keeps its timers in one list per length, runs the lists in the order of the time their first timer
// falls due, and runs every timer of a list that is due when it gets to it. A loop that wakes late, past several
// timers, runs them in that order, not in the order they fell due: a 5,000-ms timer set after a 4,999-ms one runs
// first when an earlier 5,000-ms timer heads its list. A CI machine at a load of 20 did that by chance; this does it
// on every run, at any speed (a slower machine only wakes later still).
import { performance } from 'node:perf_hooks'

// how long before the waits begin the list's first timer is set, and how long past their end the loop stays held:
// the waits must all have begun within OVER_MS of the promise's resolving
const LEAD_MS = 50
const OVER_MS = 500

/**
 * Resolves once a timer of `lengthMs` is set and the event loop is made to wake late past waits of that length begun
 * from now: held busy from before that timer falls due until OVER_MS after `lengthMs` from now. When it wakes, that
 * timer's list, and in it every wait of `lengthMs` begun since, runs before the timers of shorter waits begun with
 * them.
 */
export async function wakeLatePast(lengthMs: number): Promise<void> {
  let begun = performance.now() + LEAD_MS
  // the head of the list of `lengthMs`, and the loop held from before it falls due
  setTimeout(() => {}, lengthMs)
  setTimeout(() => {
    while (performance.now() < begun + lengthMs + OVER_MS) {
      // busy: no timer runs, as on a machine whose cores are taken
    }
  }, lengthMs - 2 * LEAD_MS)
  await new Promise((resolve) => setTimeout(resolve, LEAD_MS))
  begun = performance.now()
}
