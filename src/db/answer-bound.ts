// A shorter wait for the database, asked for around some work rather than for a whole pool: the operator console's
// pages (console.routes.ts). Postgres's pool waits up to its statement timeout and a grace for an answer
// (DATABASE_STATEMENT_TIMEOUT_MS + STATEMENT_ANSWER_GRACE_MS, 15 s by default), which the webhook ingest and the
// poller keep: a hung database (the connection taken, nothing answered) kept a console page that got a connection
// the pool held from before the hang waiting those 15 s, where one that opened a new connection was answered 503
// after the 5-s connect timeout.
//
// `withinAnswerBound(ms, …)` sets one deadline, `ms` from its start, for everything the work waits on the database
// for: a connection from the pool and each statement's answer (the pool's own waits when shorter). At the deadline
// the caller gets AnswerBoundError, and a connection whose statement is left unanswered is closed when given back, as
// any connection whose answer did not come (open-database.ts). One deadline for the whole work, not one per wait: a
// page whose statements run at once on a pool of one had the first waiting for its answer and the rest for the one
// connection, each wait its own 5 s, and which ended first (the console's bound or the pool's wait for a connection)
// was a matter of timers, and so was what the log line said. Where the pool's own wait is as long as what is left of
// the deadline (the console's 5 s, the pool's connect timeout), the deadline's words are said whichever timer Node
// runs first: a loop that wakes late runs timers of one length together, not in the order they fell due
// (open-database.ts, connectWithinBound).
import { performance } from 'node:perf_hooks'
import { ScopedStore } from '../scoped-store.js'

interface Deadline {
  /** The bound asked for, in ms: what the error says. */
  boundMs: number
  /** performance.now() at which the waits end. */
  endsAt: number
}

// Turned off once no work runs under a deadline and the last deadline is a second past (scoped-store.ts): by then
// every wait of that work has ended, at the latest at its deadline, and what it did next has run. (Work that went on
// to send a statement later still, after waiting on something other than the database, would send it with the pool's
// own waits, not refused as past its deadline: no console page waits on anything else.)
const bound = new ScopedStore<Deadline>()
const OFF_AFTER_DEADLINE_MS = 1000

/** Runs `work` with everything it waits on Postgres for ended `ms` from now at most (the pool's waits when shorter). */
export function withinAnswerBound<T>(ms: number, work: () => T): T {
  const endsAt = performance.now() + ms
  return bound.run({ boundMs: ms, endsAt }, work, { notBefore: endsAt + OFF_AFTER_DEADLINE_MS })
}

/**
 * The deadline asked for around the wait beginning now, if any: the bound asked for and the whole ms left of it (0
 * once past). Rounded down, so that a wait timed with it never ends after the deadline.
 */
export function answerBoundNow(): { boundMs: number; leftMs: number } | undefined {
  const deadline = bound.getStore()
  if (!deadline) return undefined
  return { boundMs: deadline.boundMs, leftMs: Math.max(0, Math.floor(deadline.endsAt - performance.now())) }
}

/** What was waited for when the deadline came: a statement's answer, or a connection from the pool. */
export type AnswerBoundWait = 'answer' | 'connection'

/**
 * The deadline asked for around the work (withinAnswerBound) came before the database's answer or a connection. Its
 * message begins with pg's own words for the wait it ended (an unanswered statement: unavailable, its outcome
 * unknown; a connection not had: unavailable, nothing sent), so that it reads as one everywhere (database-errors.ts);
 * `cause` is pg's error, if any.
 */
export class AnswerBoundError extends Error {
  constructor(
    readonly boundMs: number,
    readonly waitedFor: AnswerBoundWait = 'answer',
    cause?: Error,
  ) {
    super(
      waitedFor === 'answer'
        ? `Query read timeout: no answer within the ${boundMs} ms asked for`
        : `timeout exceeded when trying to connect: no connection within the ${boundMs} ms asked for`,
      cause ? { cause } : undefined,
    )
    this.name = 'AnswerBoundError'
  }
}
