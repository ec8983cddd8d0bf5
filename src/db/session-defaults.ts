// The session settings the service's statements and its driver are written for, whatever defaults a DBA gave the
// database or the role for their own applications:
// - default_transaction_isolation READ COMMITTED: an insert or update that meets a row another session committed
//   meanwhile waits for it and goes on (the claims' SKIP LOCKED, the ingest's ON CONFLICT). Under REPEATABLE READ
//   by default they failed instead (40001): deliveries answered 503, polls and prunes cut short.
// - DateStyle ISO: the driver reads timestamps in ISO form only; under 'SQL, DMY' every timestamp it read was null.
// - IntervalStyle postgres: the form the driver reads intervals in.
// - idle_session_timeout 0 (Postgres 14 and later): a DBA's timeout ended the replica's listener whenever no
//   notification came for that long, and a pooled connection idle that long, each with a warning, the listener
//   deaf until it was back.
// - synchronous_commit on where it is off: a delivery is answered 200 once its commit returns, and under `off` a
//   commit returns before its WAL is on disk; a crash of Postgres lost deliveries already answered 200 (7 of 20,
//   by hand), which the platform never sends again. `local`, `remote_write` and `remote_apply` flush locally as
//   `on` does, and are left as they are.
// Each connection of the service's pools, the migrations' own and the listener's set them before their first
// statement (open-database.ts, postgres-listener.ts). Behind a connection pooler in transaction mode a SET reaches
// one server session of many: at start-up the service reads the defaults a new session gets and says, once, which
// to set for the role.
import { type Kysely, sql } from 'kysely'
import type { Logger } from '../logger.js'
import type { Database, DatabaseKind } from './database.js'

/**
 * The statement each new connection of the service's pools, and its listener, runs first. One statement, each
 * setting only where the server has it: idle_session_timeout came with Postgres 14, and an unknown name would
 * fail the rest; synchronous_commit only where it is off.
 */
export const SESSION_SETTINGS = `select set_config(wanted.name, wanted.value, false)
  from (values ('default_transaction_isolation', 'read committed'), ('DateStyle', 'ISO'), ('IntervalStyle', 'postgres'),
               ('idle_session_timeout', '0'), ('synchronous_commit', 'on')) as wanted (name, value)
  join pg_settings on pg_settings.name = wanted.name
  where wanted.name <> 'synchronous_commit' or pg_settings.setting = 'off'`

// what a session's default must be (reset_val, lower case), and the setting that makes it so
const WANTED: Record<string, { holds: (value: string) => boolean; remedy: string }> = {
  default_transaction_isolation: { holds: (value) => value === 'read committed', remedy: "default_transaction_isolation = 'read committed'" },
  DateStyle: { holds: (value) => value.toLowerCase().startsWith('iso'), remedy: "DateStyle = 'ISO, MDY'" },
  IntervalStyle: { holds: (value) => value === 'postgres', remedy: "IntervalStyle = 'postgres'" },
  synchronous_commit: { holds: (value) => value !== 'off', remedy: "synchronous_commit = 'on'" },
}

export async function checkSessionDefaults(database: { db: Kysely<Database>; kind: DatabaseKind }, logger: Logger): Promise<void> {
  if (database.kind !== 'postgres') return
  // reset_val: what a session has before any SET of its own (the server's, database's, role's or connection's
  // default); a failed look says nothing of them, and start-up does not wait on it
  const rows = await sql<{ name: string; value: string }>`select name, reset_val as value from pg_settings where name = any(${Object.keys(WANTED)})`
    .execute(database.db)
    .then((result) => result.rows, () => [])
  const differing = rows.filter((row) => !WANTED[row.name]?.holds(row.value))
  if (differing.length === 0) return
  logger.warn(
    { sessionDefaults: Object.fromEntries(differing.map((row) => [row.name, row.value])) },
    `this database's sessions start with ${differing.map((row) => `${row.name} = '${row.value}'`).join(', ')}: ` +
      'this service sets its own on each of its connections, which a connection pooler in transaction mode passes on to one server session only; ' +
      `set them for the role: ${differing.map((row) => `ALTER ROLE <the role of DATABASE_URL> SET ${WANTED[row.name]!.remedy}`).join('; ')}`,
  )
}
