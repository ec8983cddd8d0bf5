// A shorter wait for the database's answer, asked for around some work rather than for a whole pool: the operator
// console's pages (console.routes.ts). Postgres's pool waits up to its statement timeout and a grace for an answer
// (DATABASE_STATEMENT_TIMEOUT_MS + STATEMENT_ANSWER_GRACE_MS, 15 s by default), which the webhook ingest and the
// poller keep: a hung database (the connection taken, nothing answered) kept a console page that got a connection
// the pool held from before the hang waiting those 15 s, where one that opened a new connection was answered 503
// after the 5-s connect timeout. The statements sent within `withinAnswerBound(ms, …)` are waited for `ms` at most
// (the pool's own wait when shorter); then the caller gets AnswerBoundError and the connection, its statement
// unanswered, is closed when given back, as any connection whose answer did not come (open-database.ts).
import { AsyncLocalStorage } from 'node:async_hooks'

const bound = new AsyncLocalStorage<number>()

/** Runs `work` with every statement it sends on Postgres waited for `ms` at most (the pool's wait when shorter). */
export function withinAnswerBound<T>(ms: number, work: () => T): T {
  return bound.run(ms, work)
}

/** The bound asked for around the statement being sent now, if any. */
export function answerBoundNow(): number | undefined {
  return bound.getStore()
}

/**
 * A statement not answered within the bound asked for around it (withinAnswerBound). Its message begins with pg's
 * own words for an unanswered statement, so that it reads as one everywhere (database-errors.ts: unavailable, its
 * outcome unknown); `cause` is pg's error.
 */
export class AnswerBoundError extends Error {
  constructor(
    readonly boundMs: number,
    cause: Error,
  ) {
    super(`Query read timeout: no answer within the ${boundMs} ms asked for`, { cause })
    this.name = 'AnswerBoundError'
  }
}
