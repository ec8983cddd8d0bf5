// What every CLI command needs: the config, a logger (to stderr, so stdout stays for output), and a
// migrated database that is closed when the command ends.

import type { Kysely } from 'kysely'
import pino from 'pino'
import { type Config, configSecrets, loadConfig } from '../config.js'
import type { Database } from '../db/database.js'
import { migrateToLatest } from '../db/migrate.js'
import { openDatabase } from '../db/open-database.js'
import { createLogger, type Logger } from '../logger.js'

export interface CliContext {
  config: Config
  logger: Logger
  db: Kysely<Database>
}

/** A usage error: printed without a stack, exit code 2. */
export class UsageError extends Error {
  override name = 'UsageError'
}

export function cliLogger(config: Config): Logger {
  // CLI commands log warnings only unless LOG_LEVEL asks for more, and always to stderr
  const level = config.logLevel === 'info' ? 'warn' : config.logLevel
  return createLogger({ level, secrets: configSecrets(config), destination: pino.destination(2) })
}

export async function withDatabase<T>(
  run: (context: CliContext) => Promise<T>,
  { migrate = true }: { migrate?: boolean } = {},
): Promise<T> {
  const config = loadConfig()
  const logger = cliLogger(config)
  const database = openDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: 2,
    logger,
  })
  try {
    if (migrate) await migrateToLatest(database.db)
    return await run({ config, logger, db: database.db })
  } finally {
    await database.close()
  }
}

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`)
}

/** Prints rows as an aligned text table; an empty list prints `empty`. */
export function printTable(rows: Record<string, unknown>[], empty = '(none)'): void {
  if (rows.length === 0) {
    process.stdout.write(`${empty}\n`)
    return
  }
  const columns = Object.keys(rows[0]!)
  const cell = (value: unknown) =>
    value === null || value === undefined ? '-' : value instanceof Date ? value.toISOString() : String(value)
  const widths = columns.map((column) =>
    Math.max(column.length, ...rows.map((row) => cell(row[column]).length)),
  )
  const line = (values: string[]) =>
    values
      .map((value, i) => value.padEnd(widths[i]!))
      .join('  ')
      .trimEnd()
  process.stdout.write(`${line(columns)}\n`)
  for (const row of rows) process.stdout.write(`${line(columns.map((column) => cell(row[column])))}\n`)
}
