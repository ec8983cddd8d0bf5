// Kysely's Migrator over the static list in migrations/. On Postgres the migrator takes an advisory
// lock, so two replicas starting at once apply each migration once; the other waits and finds it done.
import { type Kysely, sql } from 'kysely'
import { type MigrationResultSet, Migrator } from 'kysely/migration'
import { migrations } from '../../migrations/index.js'
import type { Database } from './database.js'

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

export async function migrateToLatest(db: Kysely<Database>): Promise<MigrationReport> {
  const { error, results }: MigrationResultSet = await (await createMigrator(db)).migrateToLatest()
  if (error) {
    const failed = results?.find((result) => result.status === 'Error')?.migrationName
    throw new Error(`Migration ${failed ?? '(before any migration ran)'} failed`, { cause: error })
  }
  return { applied: (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName) }
}

/** True when every known migration has been applied. */
export async function migrationsAreCurrent(db: Kysely<Database>): Promise<boolean> {
  const known = await (await createMigrator(db)).getMigrations()
  return known.every((migration) => migration.executedAt !== undefined)
}
