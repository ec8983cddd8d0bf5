// The embedded database's planner statistics. PGlite runs Postgres as one process, without the autovacuum
// that analyzes a table on Postgres once enough of its rows changed. The ingest's statements are prepared, and
// Postgres keeps one generic plan for each, chosen on the statistics of the moment it was made and made again
// only when they change. Without an analyze, a plan chosen while `webhook_deliveries` was nearly empty kept
// reading the whole table for every delivery as it grew: 852 µs a delivery over the first 6,500 deliveries,
// 7,731 µs over deliveries 32,501-39,000 (bench/stale-statistics.ts; bench/results/latest.md, 2026-11-30).
// So the service does here what autovacuum's analyze does:
// each table whose rows changed by more than 50 + 10 % of its size since its last analyze (autovacuum's own
// threshold) is analyzed, and the plans that read it are made again on the new figures. It looks every 10 s,
// not every minute as autovacuum does: the ingest on PGlite stores thousands of deliveries a second, and a
// table analyzed while small (a seq scan is then its cheapest plan) must not grow for a minute under that plan.
// Looking costs three short statements; the 10 % keeps the analyzes themselves rare once a table is large.
import { type Kysely, sql } from 'kysely'
import { type Clock, systemClock } from '../clock.js'
import type { Logger } from '../logger.js'
import { loggableError } from './database-errors.js'
import type { Database } from './database.js'

/** How often the tables are looked at (autovacuum's naptime is a minute). */
export const STATISTICS_CHECK_INTERVAL_MS = 10_000

// autovacuum_analyze_threshold and autovacuum_analyze_scale_factor, Postgres's defaults
const ANALYZE_THRESHOLD = 50
const ANALYZE_SCALE_FACTOR = 0.1

/**
 * Analyzes the tables of the current schema whose rows changed past autovacuum's analyze threshold since
 * their last analyze (one never analyzed counts as empty); returns their names, in the order analyzed.
 */
export async function analyzeChangedTables(db: Kysely<Database>): Promise<string[]> {
  // the counters of this session's last statements are sent to the statistics at most once a second: now
  await sql`select pg_stat_force_next_flush()`.execute(db)
  await sql`select pg_stat_clear_snapshot()`.execute(db)
  const { rows } = await sql<{ relname: string }>`
    select s.relname from pg_stat_user_tables s join pg_class c on c.oid = s.relid
    where s.schemaname = current_schema()
      and s.n_mod_since_analyze > ${sql.lit(ANALYZE_THRESHOLD)} + ${sql.lit(ANALYZE_SCALE_FACTOR)} * greatest(c.reltuples, 0)
    order by s.relname`.execute(db)
  for (const { relname } of rows) await sql`analyze ${sql.id(relname)}`.execute(db)
  return rows.map((row) => row.relname)
}

export interface StatisticsWatch {
  /** Stops looking; resolves once a pass under way has ended. */
  stop(): Promise<void>
}

/** Runs analyzeChangedTables every `intervalMs` of the clock's time, the first time one interval after the start. */
export function watchStatistics({
  db,
  logger,
  clock = systemClock,
  intervalMs = STATISTICS_CHECK_INTERVAL_MS,
}: {
  db: Kysely<Database>
  logger: Logger
  clock?: Clock
  intervalMs?: number
}): StatisticsWatch {
  const stopping = new AbortController()
  let failing = false

  const look = async () => {
    try {
      const analyzed = await analyzeChangedTables(db)
      if (analyzed.length > 0) logger.debug({ tables: analyzed }, 'embedded database statistics refreshed')
      if (failing) logger.info('embedded database statistics refreshed again')
      failing = false
    } catch (error) {
      // the next look tries again; one line until one succeeds
      if (!failing) logger.warn({ err: loggableError(error) }, 'cannot refresh the embedded database statistics; trying again in 10 s')
      failing = true
    }
  }
  const looking = (async () => {
    for (;;) {
      try {
        await clock.sleep(intervalMs, stopping.signal)
      } catch {
        return // stopped
      }
      await look()
    }
  })()

  return {
    async stop() {
      stopping.abort()
      await looking
    },
  }
}
