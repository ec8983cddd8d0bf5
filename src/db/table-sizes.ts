// How large the service's tables are: what retention does not keep bounded (order_status_history and orders are
// never pruned, README "Retention") shows here as it grows. Read from the catalog, never by counting: the rows are
// the planner's estimate (pg_class.reltuples, as of the table's last VACUUM or ANALYZE: autovacuum's on Postgres,
// the statistics watch's and each pruning pass's on PGlite), the bytes the table's with its indexes and TOAST
// (pg_total_relation_size, which asks the file system for the size of each file).
import { type Kysely, sql } from 'kysely'
import type { Database } from './database.js'
import { SERVICE_TABLES } from './migrate.js'

export interface TableSize {
  table: string
  /** The planner's estimate of its rows; null where the database has not estimated them yet (never vacuumed or analyzed). */
  rows: number | null
  /** Bytes on disk: the table, its indexes and its TOAST. */
  bytes: number
}

/** The service's tables in the connection's schema, with their size. */
export async function readTableSizes(db: Kysely<Database>): Promise<TableSize[]> {
  const { rows } = await sql<{ table: string; rows: number; bytes: string }>`
    select c.relname as table, c.reltuples::float8 as rows, pg_total_relation_size(c.oid)::text as bytes
    from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
    where n.nspname = current_schema() and c.relkind in ('r', 'p') and c.relname = any(${[...SERVICE_TABLES]}::text[])
    order by c.relname`.execute(db.withoutPlugins())
  // reltuples is -1 before the table's first VACUUM or ANALYZE (Postgres 14 and later)
  return rows.map((row) => ({ table: row.table, rows: row.rows < 0 ? null : Math.round(row.rows), bytes: Number(row.bytes) }))
}
