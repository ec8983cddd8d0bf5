// A reaction job's outcome (done, pending again after a backoff, failed), written under the job's lease, and tried
// again while the database does not answer. A handler that returned while the connection was cut (a failover, a
// proxy or a network path restarted: a blip of 10-30 s) had its one write fail, and the job stayed `running` for the
// rest of its lease, REACTION_LEASE_S (300 s by default), its order's later events for that handler waiting behind
// it; then another claim called the handler again for an outcome this replica already had (found by an outside
// review). Now the write is tried again after OUTCOME_RETRY_FIRST_MS, doubling up to OUTCOME_RETRY_MAX_MS, until it
// is written or `signal` aborts: the lease about to end, or the shutdown's grace over. Then one last try is made, and
// if that fails too the lease running out is what brings the job back, as for a replica that died.
//
// Not tried again: an error that says the schema is not whole (a table or a column missing: a restore under way, not
// a blip). The dispatcher's loops then hold until it is whole (db/schema-watch.ts), and the lease brings the job back.
//
// Every try is fenced by the lease token (reaction-job.repository.ts): it writes only while the row is `running`
// under this claim's token. A claim made since (the lease ran out, an operator gave the stream's lease back) holds
// another token, and the try writes nothing: no outcome is ever written over a lease this replica no longer holds.
// A try whose earlier try's COMMIT landed but whose answer was lost (the connection cut after it) finds the fence
// closed by its own commit: the write says so (the row's outcome_token is this claim's: reaction-job.repository.ts,
// ownOutcomes), and the caller reports the outcome it wrote, not a lease lost.
//
// A stream batch's write-back (stream-worker.ts: the record of its events done, its job rows and the stream's new
// place, one statement) is tried again the same way, fenced by the stream's lease token; after a lost answer it finds
// the stream at its place under its token, its own commit, and writes nothing twice (writeReactionStream).
import type { Clock } from '../clock.js'
import type { Logger } from '../logger.js'

/** The first wait before an outcome's write is tried again. */
export const OUTCOME_RETRY_FIRST_MS = 250
/** The longest wait between tries: once the database answers again, the outcome is written within about this. */
export const OUTCOME_RETRY_MAX_MS = 2_000

/**
 * Runs `write` until it resolves, waiting between tries (on `clock`). Once `signal` aborts, one last try is made (the
 * database may be back by then), and its error is thrown (the caller says what then), as is at once an error that is
 * not `retryable`. `log` (the job's logger) says the first failure (warn) and, once a later try wrote, that it did
 * (info, with how long after the first failure).
 */
export async function writeOutcome<T>(
  write: () => Promise<T>,
  {
    clock,
    signal,
    log,
    retryable = () => true,
    what = 'a reaction job outcome',
  }: {
    clock: Pick<Clock, 'now' | 'sleep'>
    signal: AbortSignal
    log: () => Logger
    retryable?: (error: unknown) => boolean
    /** What is written, in the log lines: a job's outcome unless said (a stream batch's write-back). */
    what?: string
  },
): Promise<T> {
  let waitMs = OUTCOME_RETRY_FIRST_MS
  let firstFailedAt: number | undefined
  for (let tries = 1; ; tries += 1) {
    // made after the abort: the last
    const last = signal.aborted
    try {
      const value = await write()
      if (firstFailedAt !== undefined) {
        log().info({ tries, failingForMs: Math.max(0, clock.now() - firstFailedAt) }, `recorded ${what} once the database answered again`)
      }
      return value
    } catch (error) {
      if (last || !retryable(error)) throw error
      if (firstFailedAt === undefined) {
        firstFailedAt = clock.now()
        log().warn({ err: error, retryInMs: waitMs }, `could not record ${what}; trying again while its lease lasts`)
      }
      // (the abort ends the wait: the last try follows at once)
      await clock.sleep(waitMs, signal).catch(() => {})
      waitMs = Math.min(OUTCOME_RETRY_MAX_MS, waitMs * 2)
    }
  }
}
