// The planner's statistics where nothing else keeps them. On Postgres, autovacuum analyzes a table once enough
// of its rows changed. PGlite runs Postgres as one process, without autovacuum, and a Postgres may run with it
// off. The ingest's statements are prepared, and Postgres keeps one generic plan for each, chosen on the
// statistics of the moment it was made and made again only when they change. Without an analyze, a plan chosen
// while `webhook_deliveries` was nearly empty kept reading the whole table for every delivery as it grew: on
// PGlite 852 µs a delivery over the first 6,500 deliveries, 7,731 µs over deliveries 32,501-39,000
// (bench/stale-statistics.ts; bench/results/latest.md, 2026-11-30). On Postgres without autovacuum such a plan
// stays for good: two sequential scans of the table a delivery, 30-s loads on fresh tables at 620-2,972 req/s
// where the plans went that way, 5,023-5,284 where they did not (README.md, "The planner's statistics").
// So the service does there what autovacuum's analyze does:
// each table whose rows changed by more than 50 + 10 % of its size since its last analyze (autovacuum's own
// threshold) is analyzed, and the plans that read it are made again on the new figures. It looks every 10 s,
// not every minute as autovacuum does: the ingest stores thousands of deliveries a second, and a table analyzed
// while small (a seq scan is then its cheapest plan) must not grow for a minute under that plan.
// Looking costs four short statements (on Postgres one first, whether autovacuum runs, and only that one while
// it does: a reload may turn it on or off); the 10 % keeps the analyzes themselves rare once a table is large.
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
// A table smaller than this is left until it grows. Analyzed that small, its statistics make a sequential scan
// the cheapest plan of a lookup by key (a table never analyzed is planned as 10 pages at least), and every plan
// that reads it is made again on them, to be kept while the table grows until the next analyze. Without this
// floor, loads on fresh Postgres tables spent about 10 s after an early analyze of the young
// `webhook_deliveries` at about 900 deliveries a second, each delivery scanning the whole table twice, until
// the next look (README.md, "The planner's statistics where autovacuum does not run").
const MIN_ANALYZED_PAGES = 16

/**
 * Analyzes the tables of the current schema whose rows changed past autovacuum's analyze threshold since
 * their last analyze (one never analyzed counts as empty) and that are no longer small (MIN_ANALYZED_PAGES);
 * returns their names, in the order analyzed.
 */
export async function analyzeChangedTables(db: Kysely<Database>): Promise<string[]> {
  // the counters of this session's last statements are sent to the statistics at most once a second: now
  // (pg_stat_force_next_flush is Postgres 15's; before it, counters reached the statistics within half a second)
  const { rows: flushing } = await sql<{ exists: boolean }>`
    select exists (select 1 from pg_proc where proname = 'pg_stat_force_next_flush') as exists`.execute(db)
  if (flushing[0]?.exists) await sql`select pg_stat_force_next_flush()`.execute(db)
  await sql`select pg_stat_clear_snapshot()`.execute(db)
  const { rows } = await sql<{ relname: string }>`
    select s.relname from pg_stat_user_tables s join pg_class c on c.oid = s.relid
    where s.schemaname = current_schema()
      and s.n_mod_since_analyze > ${sql.lit(ANALYZE_THRESHOLD)} + ${sql.lit(ANALYZE_SCALE_FACTOR)} * greatest(c.reltuples, 0)
      and pg_relation_size(c.oid) >= ${sql.lit(MIN_ANALYZED_PAGES)} * current_setting('block_size')::bigint
    order by s.relname`.execute(db)
  for (const { relname } of rows) await sql`analyze ${sql.id(relname)}`.execute(db)
  return rows.map((row) => row.relname)
}

// Parked deliveries (references with no order yet) are few, until a burst parks thousands at once (a partner's
// webhooks arriving before its orders). Autovacuum analyzes a table once 10 % of its rows changed, so after a burst of
// 30,000 on a table of 10,000,000 the planner still counts them as it did, none, and on that count the ingest's look
// for an earlier parked copy of a body read an index of every outcome, every parked row of it, for each delivery:
// 0.12 ms a delivery with the statistics up to date, 3.5 ms at 12,000 parked rows with the statistics of none
// (2026-12-03, a script not kept). So each look also counts them, no further than past twice the planner's figure
// and 1,000 more, and analyzes the table when they outgrew it. The count stops at 20,000 rows: a figure of 10,000 or
// more parked rows already has the planner look them up by reference, so the look never reads more than that. (Its
// first version counted every delivery not applied, kept for the retention's days: a whole table's scan each look.)
const PARKED_INDEX = 'webhook_deliveries_unmatched_idx'
// Also looked at as soon as this process parked as many since the last look: a burst parks thousands a second, and
// for up to 10 s each of them would read every parked row (`npm run bench -- ingest --quick`, its 3-s unmatched load:
// 1,836 deliveries a second at 701 µs of Postgres CPU each when only the 10-s look counted them, 4,388 at 153 µs
// with this)
const PARKED_SLACK = 1_000
const PARKED_COUNTED_AT_MOST = 20_000

/**
 * Analyzes webhook_deliveries when its parked deliveries outgrew the planner's figure of them (that of the partial
 * index holding them: more than twice it and 1,000 more, for a figure under 10,000); true when it did.
 */
export async function analyzeIfParkedOutgrown(db: Kysely<Database>): Promise<boolean> {
  const { rows } = await sql<{ planned: number | null }>`
    select greatest(c.reltuples, 0)::float8 as planned from pg_class c where c.oid = to_regclass(${PARKED_INDEX})`.execute(db)
  const planned = rows[0]?.planned
  if (planned === null || planned === undefined) return false
  const enough = Math.min(Math.floor(2 * planned) + PARKED_SLACK, PARKED_COUNTED_AT_MOST)
  if (enough <= planned) return false
  const { rows: counted } = await sql<{ rows: number }>`
    select count(*)::int as rows from (select 1 from webhook_deliveries where outcome = 'unmatched' limit ${enough}) parked`.execute(db)
  if (counted[0]!.rows < enough) return false
  await sql`analyze webhook_deliveries`.execute(db)
  return true
}

/**
 * Whether autovacuum keeps this database's statistics: it is on, and so are the counts of changed rows it (and
 * analyzeChangedTables) works from.
 */
export async function autovacuumRuns(db: Kysely<Database>): Promise<boolean> {
  const { rows } = await sql<{ runs: boolean }>`
    select current_setting('autovacuum')::boolean and current_setting('track_counts')::boolean as runs`.execute(db)
  return rows[0]!.runs
}

export interface StatisticsWatch {
  /**
   * Whether the last look found autovacuum off (and the service analyzing in its stead): for the
   * database_autovacuum_off gauge. Undefined before the first look, after a look that failed to read it, and
   * where the watch does not ask (PGlite, which has no autovacuum).
   */
  autovacuumOff(): boolean | undefined
  /**
   * The ingest parked this many deliveries: once 1,000 were parked since the last look at them, analyzeIfParkedOutgrown
   * runs at once, without waiting for the next look (one at a time; none after stop).
   */
  parkedStored(count: number): void
  /** Stops looking; resolves once a pass under way has ended. */
  stop(): Promise<void>
}

/**
 * Runs analyzeChangedTables every `intervalMs` of the clock's time, the first time one interval after the start, and
 * analyzeIfParkedOutgrown at every look, whatever autovacuum does.
 * `whileAutovacuumOff` (Postgres): only while `autovacuumRuns` says autovacuum does not, with a warning when
 * the service starts doing its work and a line when it stops.
 */
export function watchStatistics({
  db,
  logger,
  clock = systemClock,
  intervalMs = STATISTICS_CHECK_INTERVAL_MS,
  whileAutovacuumOff = false,
  autovacuum = autovacuumRuns,
}: {
  db: Kysely<Database>
  logger: Logger
  clock?: Clock
  intervalMs?: number
  whileAutovacuumOff?: boolean
  /** Whether autovacuum runs (a test's stand-in for the database's settings). */
  autovacuum?: (db: Kysely<Database>) => Promise<boolean>
}): StatisticsWatch {
  const stopping = new AbortController()
  let failing = false
  // whether the last look found autovacuum off (and said so): the service does its analyzes
  let standingIn = false
  // what the last look read of it (undefined: not read, or its read failed)
  let lastRead: boolean | undefined

  // Postgres: whether autovacuum is off, read afresh at each look (a reload may change it), and said when that changes
  const readAutovacuumOff = async () => {
    lastRead = undefined
    const off = !(await autovacuum(db))
    lastRead = off
    if (off !== standingIn) {
      if (off) {
        logger.warn(
          'autovacuum is off on the database (autovacuum or track_counts): the service analyzes its tables itself every 10 s, ' +
            'but nothing VACUUMs them, so the space of pruned deliveries is not reused; turn autovacuum on',
        )
      } else logger.info('autovacuum is on: the service leaves the planner statistics to it again')
      standingIn = off
    }
    return off
  }

  // deliveries this process parked since the parked rows were last counted, and that count while it runs
  let parkedSince = 0
  let countingParked: Promise<void> | undefined
  const lookAtParked = async () => {
    parkedSince = 0
    if (await analyzeIfParkedOutgrown(db)) logger.info('planner statistics refreshed: parked deliveries outgrew them')
  }

  // One analyze at a time: a look that came while a burst's count ran would count (and analyze) the same table
  // beside it, and a burst that comes while a look runs is counted by that look or, past it, by the next burst.
  let lookRunning = false
  const look = async () => {
    lookRunning = true
    await countingParked
    try {
      if (!whileAutovacuumOff || (await readAutovacuumOff())) {
        const analyzed = await analyzeChangedTables(db)
        if (analyzed.length > 0) logger.debug({ tables: analyzed }, 'planner statistics refreshed')
      }
      // with autovacuum too: its threshold is a tenth of the table
      await lookAtParked()
      if (failing) logger.info('the planner statistics watch works again')
      failing = false
    } catch (error) {
      // the next look tries again; one line until one succeeds
      if (!failing) logger.warn({ err: loggableError(error) }, 'cannot refresh the planner statistics; trying again in 10 s')
      failing = true
    } finally {
      lookRunning = false
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
    autovacuumOff: () => lastRead,
    parkedStored(count) {
      parkedSince += count
      if (parkedSince < PARKED_SLACK || countingParked || lookRunning || stopping.signal.aborted) return
      countingParked = lookAtParked()
        .catch((error: unknown) => {
          // one line until a look succeeds, as the looks' own failures
          if (!failing) logger.warn({ err: loggableError(error) }, 'cannot count the parked deliveries; the next look tries again')
          failing = true
        })
        .finally(() => {
          countingParked = undefined
        })
    },
    async stop() {
      stopping.abort()
      await looking
      await countingParked
    },
  }
}
