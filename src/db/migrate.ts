// Kysely's Migrator over the static list in migrations/. On Postgres the migrator takes an advisory
// lock, so two replicas starting at once apply each migration once; the other waits and finds it done.
import type { Kysely } from 'kysely'
import { type MigrationResultSet, Migrator } from 'kysely/migration'
import { migrations } from '../../migrations/index.js'
import type { Database } from './database.js'

function createMigrator(db: Kysely<Database>): Migrator {
  return new Migrator({ db, provider: { getMigrations: async () => migrations } })
}

export interface MigrationReport {
  applied: string[]
}

export async function migrateToLatest(db: Kysely<Database>): Promise<MigrationReport> {
  const { error, results }: MigrationResultSet = await createMigrator(db).migrateToLatest()
  if (error) {
    const failed = results?.find((result) => result.status === 'Error')?.migrationName
    throw new Error(`Migration ${failed ?? '(before any migration ran)'} failed`, { cause: error })
  }
  return { applied: (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName) }
}

/** True when every known migration has been applied. */
export async function migrationsAreCurrent(db: Kysely<Database>): Promise<boolean> {
  const known = await createMigrator(db).getMigrations()
  return known.every((migration) => migration.executedAt !== undefined)
}
