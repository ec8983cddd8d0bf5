import type { Command } from 'commander'
import { isDatabaseUnavailable } from '../db/database-errors.js'
import type { MigrationError } from '../db/migrate.js'
import { CommandFailedError, markTookEffect, printJson, UsageError, withDatabase, write } from './cli-context.js'

export function registerMigrateCommand(migrate: Command): void {
  migrate
    .option('--json', 'print the result as JSON')
    .action(async (options: { json?: boolean }) => {
      const { migrateToLatest, MigrationError } = await import('../db/migrate.js')
      const { applied } = await withDatabase(
        ({ db, withoutTimeouts }) => (withoutTimeouts ? withoutTimeouts(migrateToLatest) : migrateToLatest(db)),
        { migrate: false, committing: { change: 'the migrations', see: '`migrate` run again says they are current, or applies them (they are one transaction)' } },
      ).catch((error: unknown) => {
        throw error instanceof MigrationError ? refusal(error) : error
      })
      if (applied.length > 0) await markTookEffect({ done: 'the migrations were applied', see: '`migrate` says they are current' })
      if (options.json) printJson({ applied })
      else write(applied.length ? `applied: ${applied.join(', ')}\n` : 'migrations are current\n')
    })
}

/**
 * A failed migration's line ends in its code, as every failed command's does: `Migration (before any migration ran)
 * failed: …` said no more. A search_path that names no schema, one holding another application's tables, or one whose
 * first schema stands in front of the service's tables, is DATABASE_URL's to change: exit 2, as for a configuration
 * that does not hold. A database that went away mid-way
 * is left as it is, for the line that says so (run-cli.ts, [database_unavailable]).
 */
function refusal(error: MigrationError): Error {
  if (isDatabaseUnavailable(error)) return error
  // a newer build's database is no setting to change: exit 1, as a command's refusal of it
  if (error.failure === 'migration_failed' || error.failure === 'migrated_by_newer_build') return new CommandFailedError(error.failure, error.message)
  return new UsageError(error.message, error.failure)
}
