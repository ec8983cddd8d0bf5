import type { Command } from 'commander'
import { printJson, withDatabase, write } from './cli-context.js'

export function registerMigrateCommand(program: Command): void {
  program
    .command('migrate')
    .description('apply every pending database migration (safe to run from several replicas at once)')
    .option('--json', 'print the result as JSON')
    .action(async (options: { json?: boolean }) => {
      const { migrateToLatest } = await import('../db/migrate.js')
      const { applied } = await withDatabase(
        ({ db, withoutTimeouts }) => (withoutTimeouts ? withoutTimeouts(migrateToLatest) : migrateToLatest(db)),
        { migrate: false },
      )
      if (options.json) printJson({ applied })
      else write(applied.length ? `applied: ${applied.join(', ')}\n` : 'migrations are current\n')
    })
}
