import { type Kysely, sql } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from './database.js'
import { errorCode, READ_ONLY } from './database-errors.js'

/** What a trivial query learns of the database. */
export interface DatabaseState {
  /**
   * Its transactions are read-only: a hot standby (a failover under way, or a URL that reaches a replica), or
   * default_transaction_read_only set (some hosted Postgres services set it when their disk fills). Every
   * write fails with 25006 until that ends; the service answers webhooks 503 meanwhile.
   */
  readOnly: boolean
}

/**
 * Resolves when the database answers a trivial query; rejects with the driver's error when it does not.
 *
 * A read-only session answers with the refusal a write gets there (25006), so the connection is closed when given
 * back (open-database.ts) and the next look is a new session's: one that began while the database was read-only
 * keeps that default after a DBA turns it off (ALTER DATABASE … SET default_transaction_read_only), and /readyz,
 * asked every few seconds on the same connection, answered 503 for good.
 */
export async function pingDatabase(db: Kysely<Database>): Promise<DatabaseState> {
  // A session that says read-only may be one of several the pool opened while the database was so: each is
  // closed as it says so, and the next look takes another. A few looks, all read-only, are the database's answer;
  // one look alone read the pool's leftovers for as many looks as it held of them (a gauge and /readyz saying
  // read-only while every write succeeded).
  for (let look = 1; ; look++) {
    try {
      await sql`do $$ begin if current_setting('transaction_read_only') = 'on' then raise sqlstate '25006' using message = 'this session is read-only'; end if; end $$`.execute(db)
      return { readOnly: false }
    } catch (error) {
      if (errorCode(error) !== READ_ONLY) throw error
      if (look === READ_ONLY_LOOKS) return { readOnly: true }
    }
  }
}

// sessions asked before the answer is read-only
const READ_ONLY_LOOKS = 3

/**
 * How far the database's clock is ahead of `clock` (negative: behind), in ms: its clock_timestamp() against
 * the midpoint of the query's round trip here, so off by at most half that round trip. Leases, retention and
 * the received times compare this machine's clock with rows other replicas wrote by theirs.
 */
export async function databaseClockOffsetMs(db: Kysely<Database>, clock: Pick<Clock, 'now'>): Promise<number> {
  const sent = clock.now()
  const { rows } = await sql<{ now: Date | string }>`select clock_timestamp() as now`.execute(db)
  const answered = clock.now()
  return new Date(rows[0]!.now).getTime() - (sent + answered) / 2
}
