// Kysely's Migrator over the static list in migrations/. On Postgres the migrator takes an advisory
// lock, so two replicas starting at once apply each migration once; the other waits and finds it done.
import { type Kysely, sql } from 'kysely'
import { type MigrationResultSet, Migrator } from 'kysely/migration'
import { migrations } from '../../migrations/index.js'
import type { Database } from './database.js'
import { describeDatabaseError } from './database-errors.js'

// The migrator's own tables live in the connection's current schema, named explicitly: left unnamed,
// Kysely accepts a table of that name in ANY schema, so a second app (or test schema) in the same
// database would make it skip creating its own.
async function createMigrator(db: Kysely<Database>): Promise<Migrator> {
  const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(db)
  return new Migrator({
    db,
    provider: { getMigrations: async () => migrations },
    migrationTableSchema: rows[0]?.schema ?? 'public',
  })
}

export interface MigrationReport {
  applied: string[]
}

// The migrator's lock is a session's advisory lock, which Kysely takes and gives back as two statements on one
// connection. Behind a pooler in transaction mode (PgBouncer) two statements outside a transaction may run on
// two server sessions: the lock stayed with the first, and every later start waited on it (an hour, Kysely's
// lock_timeout; our statement timeout ended it first as "Query read timeout"). Given a transaction, the
// migrator takes the lock, runs the migrations and gives it back inside it, on the one session the pooler keeps
// for it. A failed migration throws inside it, so the transaction is rolled back, as before. Processes that
// migrate at once wait for each other on a transaction lock taken first, and find the work done.
/**
 * The advisory lock key that orders processes migrating at once ("migr" in ASCII). The migrator reads the
 * catalog of every schema in the database under it (Kysely's introspector), so the tests drop their throwaway
 * schemas under it too (test/helpers/test-database.ts).
 */
export const MIGRATION_LOCK_KEY = 0x6d696772

class MigrationFailed extends Error {
  constructor(readonly outcome: MigrationResultSet) {
    super('a migration failed')
  }
}

export async function migrateToLatest(db: Kysely<Database>): Promise<MigrationReport> {
  let outcome: MigrationResultSet
  try {
    outcome = await db.transaction().execute(async (trx) => {
      // no statement_timeout, the role's or the database's included: a migration may index a large table for
      // minutes, and a process waiting here for another's migrations waits until they are done
      await sql`set local statement_timeout = 0`.execute(trx)
      // then a lock of the transaction's own: the migrator creates its tables before taking its lock, and two
      // processes creating them at once inside transactions would leave one aborted (its error caught, the
      // transaction unusable)
      await sql`select pg_advisory_xact_lock(${MIGRATION_LOCK_KEY}::bigint)`.execute(trx)
      const result = await (await createMigrator(trx)).migrateToLatest()
      if (result.error) throw new MigrationFailed(result)
      return result
    })
  } catch (error) {
    outcome = error instanceof MigrationFailed ? error.outcome : { error, results: undefined }
  }
  const { error, results } = outcome
  if (error) {
    const failed = results?.find((result) => result.status === 'Error')?.migrationName
    // what failed, in words safe to print: a database's report only by its class and code (it may quote data)
    const database = describeDatabaseError(error)
    const reason = database.code ? `${database.message} (${database.code})` : error instanceof Error ? error.message : String(error)
    // a database's report stays the cause (its log line shows the code); any other error's message is in this one
    throw new Error(`Migration ${failed ?? '(before any migration ran)'} failed: ${reason}`, database.code ? { cause: error } : {})
  }
  return { applied: (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName) }
}

/** True when every known migration has been applied. */
export async function migrationsAreCurrent(db: Kysely<Database>): Promise<boolean> {
  const known = await (await createMigrator(db)).getMigrations()
  return known.every((migration) => migration.executedAt !== undefined)
}
