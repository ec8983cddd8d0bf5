// Whether the database bounds the pool's statements as DATABASE_STATEMENT_TIMEOUT_MS asks. On a direct
// connection it does: each connection starts with statement_timeout. Behind a connection pooler that refuses
// that startup parameter (the pool then connects without it) or drops it (PgBouncer's
// ignore_startup_parameters), only the role's own setting bounds them, and a statement still running when its
// caller answered 503 may commit later. Said once, at start-up, with what to do.
import type { Logger } from '../logger.js'

/** DATABASE_STATEMENT_TIMEOUT_MS's default: with the grace below, a caller has its answer within 15 s. */
export const DEFAULT_STATEMENT_TIMEOUT_MS = 14_000
/**
 * How much longer than the statement timeout the client waits for an answer: the database's cancellation comes
 * first, and the client's own timeout is left for a connection that no longer answers at all.
 */
export const STATEMENT_ANSWER_GRACE_MS = 1_000

export async function checkStatementTimeout(database: { statementTimeoutInEffect?(): Promise<{ ms: number; wanted: number }> }, logger: Logger): Promise<void> {
  if (!database.statementTimeoutInEffect) return
  // a failed look says nothing of the setting, and start-up does not wait on it
  const timeout = await database.statementTimeoutInEffect().catch(() => undefined)
  if (!timeout) return
  const { ms, wanted } = timeout
  // a shorter timeout than asked for still ends every statement before the client stops waiting
  if (ms > 0 && ms < wanted + STATEMENT_ANSWER_GRACE_MS) return
  logger.warn(
    { statementTimeoutMs: ms, wantedMs: wanted },
    `the database does not cancel this service's statements after ${wanted} ms (a connection pooler that does not pass statement_timeout on?): ` +
      "a statement still running when its delivery was answered 503 can commit later, and holds its connection until it ends; " +
      `set it for the role: ALTER ROLE <the role of DATABASE_URL> SET statement_timeout = '${wanted}ms'`,
  )
}
