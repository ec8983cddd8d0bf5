// What every CLI command needs: the config, a logger (to stderr, so stdout stays for output), and a
// migrated database that is closed when the command ends.
//
// A command can also run inside the service (see src/local/local-cli.ts: while `npm start` holds the
// embedded database, operator commands are run by it). Then the scope below supplies the service's
// database and captures the output, so commands write through `write()` and `setExitCode()`, never
// straight to process.stdout or process.exit.

import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Config } from '../config.js'
import type { Database } from '../db/database.js'
import type { DatabaseHandle } from '../db/open-database.js'
import type { Logger } from '../logger.js'
import type { RetentionHooks } from '../metrics/metrics.js'
import type { PollResult } from '../reconcile/poller.js'
import type { ReactionRouting } from '../reactions/reaction-registry.js'
import type { EventHandlers } from '../webhooks/event-handlers.js'
import { printable, printableLines } from '../printable.js'
import { ScopedStore } from '../scoped-store.js'
import { finishHoldingSignals, stopOnSignals, stopUnlessHeld } from '../stop-signals.js'
import type { TookEffect } from '../output-gone.js'

export interface CliContext {
  config: Config
  logger: Logger
  db: Kysely<Database>
  /** The database handle's advisory lock held in a transaction of its own (open-database.ts); `prune` needs it. */
  holdLock?: DatabaseHandle['holdLock'] | undefined
  /** PGlite: the VACUUM that ends a pruning pass there (open-database.ts); `prune` uses it. */
  vacuum?: DatabaseHandle['vacuum'] | undefined
  /** Runs the migrations where no statement timeout ends them (open-database.ts); `migrate` uses it. */
  withoutTimeouts?: DatabaseHandle['withoutTimeouts'] | undefined
  /** The service's reaction handlers; when absent, the ones its config names (configured-reactions.ts). */
  reactions?: ReactionRouting | undefined
  /** The service's seller and buyer event handlers; when absent, the fork's own (partner-event-handlers.ts). */
  eventHandlers?: EventHandlers | undefined
  /** The time partner API calls are signed and scheduled with; the system clock when absent. */
  clock?: Clock | undefined
  /** Inside a running service, its retention metrics: a `prune` run there is counted as its own passes are. */
  retentionHooks?: RetentionHooks | undefined
  /** Inside a running service, its count of polls (poller_polls_total): a `reconcile --once` run there is counted too. */
  onPollResult?: ((result: PollResult) => void) | undefined
}

/** What a command runs with: a command that moves an order wakes the dispatchers when these reactions take its event. */
export type CommandContext = CliContext & { reactions: ReactionRouting; eventHandlers: EventHandlers }

/**
 * A usage error: printed without a stack as one line ending in its code in brackets, exit code 2. The code is
 * `invalid_arguments` (a bad value, options that do not go together) unless another says more (`file_unreadable`,
 * `secret_required`, ...): such lines ended with no code at all, where every other refusal has one.
 */
export class UsageError extends Error {
  override name = 'UsageError'
  constructor(
    message: string,
    readonly code = 'invalid_arguments',
  ) {
    super(`${message} [${code}]`)
  }
}

/**
 * A command that failed for a reason with a name (`order_not_found`, ...): printed as one line ending in its
 * code in brackets, without a stack, exit code 1. `detail`, lines of their own under it (a refusal's fields),
 * starts with a line feed: the code stays on the failure line, where a script finds it.
 */
export class CommandFailedError extends Error {
  override name = 'CommandFailedError'
  constructor(
    readonly code: string,
    message: string,
    detail = '',
  ) {
    super(`${message} [${code}]${detail}`)
  }
}

/** A command a stop signal ended before its work was done: printed without a stack, exit code 130. */
export class StoppedBySignalError extends Error {
  override name = 'StoppedBySignalError'
}

export async function cliLogger(config: Config): Promise<Logger> {
  // loaded here: `--help` and forwarded commands never log
  const [{ default: pino }, { createLogger }, { configSecrets }, { logProcessWarnings }] = await Promise.all([
    import('pino'),
    import('../logger.js'),
    import('../config.js'),
    import('../process-warnings.js'),
  ])
  // a command tells its person what went wrong in its own words; log lines (JSON, to stderr) only for
  // errors, unless LOG_LEVEL asks for more
  const level = config.logLevel === 'info' ? 'error' : config.logLevel
  const logger = createLogger({ level, secrets: configSecrets(config), destination: pino.destination(2) })
  logProcessWarnings(logger)
  return logger
}

export interface CliScope {
  stdout: { write(text: string): unknown }
  stderr: { write(text: string): unknown }
  exitCode: number
  /** Set once the command's change was made (markTookEffect): its output lost on the way is then not its failure. */
  tookEffect?: TookEffect
  /** Present when the command runs inside the service: its database, config, logger and reactions. */
  context?: CliContext
}

// Kept while a command runs inside the service, and off again between commands (scoped-store.ts): the webhooks the
// service receives meanwhile do not pay for it
const scope = new ScopedStore<CliScope>()

export function runInScope<T>(cliScope: CliScope, run: () => Promise<T>): Promise<T> {
  return scope.run(cliScope, run)
}

/** A template whose every value is printable(): `escaped\`${trade.trade_id} is ${trade.status}\n\``. */
export function escaped(strings: TemplateStringsArray, ...values: unknown[]): string {
  return strings.reduce((text, literal, i) => text + printable(String(values[i - 1])) + literal)
}

/** Writes command output (stdout, or the captured output when run inside the service), its controls escaped. */
export function write(text: string): void {
  ;(scope.getStore()?.stdout ?? process.stdout).write(printableLines(text))
}

/** Writes a message for the operator (stderr, or captured), its controls escaped. */
export function writeError(text: string): void {
  ;(scope.getStore()?.stderr ?? process.stderr).write(printableLines(text))
}

/** True when the command runs inside the service (a second terminal's): the process and its signals are the service's. */
export function runsInService(): boolean {
  return scope.getStore()?.context !== undefined
}

/**
 * The command's change was made and recorded (a trade call the platform answered, an order created, a transaction
 * committed): an output that cannot be written from here on loses only its report, and is said so, not as the
 * command's failure (output-gone.ts): `effect` says what was done and where to see it (a trade call's by default).
 * Inside the service, the second terminal is told with the result, as its output is the one that may fail. Called
 * right after the commit, before anything is printed.
 */
export async function markTookEffect(effect?: TookEffect): Promise<void> {
  const current = scope.getStore()
  const { commandTookEffect, TRADE_CALL_TOOK_EFFECT } = await import('../output-gone.js')
  if (current) current.tookEffect ??= effect ?? TRADE_CALL_TOOK_EFFECT
  else commandTookEffect(effect)
}

export function setExitCode(code: number): void {
  const current = scope.getStore()
  if (current) current.exitCode = code
  else process.exitCode = code
}

/**
 * What a command that a stop signal ends during its own work says (withDatabase), when it holds no signal itself and
 * names no change in flight (below): its work is one transaction (or only reads), which the end of the process rolls
 * back, as long as its COMMIT is not sent (stoppedWhileCommitting, below, once it is).
 */
export const STOPPED_NOTHING_DONE = 'Stopped by a signal before the command was done: nothing was done (its transaction, if one was under way, is rolled back) [stopped]'

/**
 * A command's change that is not one transaction: a statement outside one (`reactions skip`, `reactions retry`). On
 * Postgres a statement sent runs on without the process that sent it (a client killed while its update waited on a
 * lock: the update committed once the lock went), so a process that ends while it is in flight cannot say nothing was
 * done. `change` names it ("the job's skip"), `see` says where to look whether it was made.
 */
export interface ChangeInFlight {
  change: string
  see: string
}

/**
 * What a command of one transaction says when a stop signal ends it while that transaction's COMMIT is in flight
 * (commit-in-flight.ts): sent, not yet answered, so not known to be made or not. `change` names it ("the order's
 * creation"), `see` says where to look whether it was made. In the words of the second signal's `[stopped]` lines.
 */
export function stoppedWhileCommitting({ change, see }: ChangeInFlight): string {
  return (
    `Stopped by a signal while ${change} was being committed: it may or may not have been made (its COMMIT was sent ` +
    `and not yet answered; on Postgres the database finishes it without this process); ${see} [stopped]`
  )
}

/** A command's transaction, when the command names none of its own (withDatabase's `committing`). */
const A_COMMAND_TRANSACTION: ChangeInFlight = {
  change: "the command's transaction",
  see: 'look whether its change was made before running the command again',
}

export async function withDatabase<T>(
  run: (context: CommandContext) => Promise<T>,
  {
    migrate = true,
    changeInFlight,
    committing = A_COMMAND_TRANSACTION,
  }: { migrate?: boolean; changeInFlight?: ChangeInFlight; committing?: ChangeInFlight } = {},
): Promise<T> {
  const inService = scope.getStore()?.context
  if (inService) {
    const [{ configuredReactions }, { configuredEventHandlers }] = await Promise.all([
      import('../reactions/configured-reactions.js'),
      import('../webhooks/event-handlers.js'),
    ])
    return run({
      ...inService,
      reactions: inService.reactions ?? configuredReactions(inService.config, { logger: inService.logger }),
      eventHandlers: inService.eventHandlers ?? configuredEventHandlers(),
    })
  }
  // Opening takes seconds (the driver and the configuration loaded, an embedded database started, up to the connect
  // timeout of 5 s on one that takes the connection and never answers): a stop signal then ends the command there,
  // and says so, where Node's default ended it without a word. Nothing of the command has run yet; a migration cut
  // short is rolled back whole.
  const stopOpening = stopOnSignals(() => {
    writeError('Stopped by a signal while opening the database: the command did nothing [stopped]\n')
    process.exit(130)
  })
  let opened: { database: DatabaseHandle; context: CommandContext } | undefined
  try {
    opened = await openForCommand(migrate)
  } finally {
    stopOpening()
  }
  const { database, context } = opened
  // The command's own work (a statement waiting on a lock another session holds, a long update): a stop signal ended
  // it killed by that signal, without a word (exit 143 for SIGTERM). Now it says so and exits 130; a command that
  // holds the signals itself (prune, reconcile --once, a trade call) keeps its own rules. Once its change is committed
  // (markTookEffect) it finishes its output and exits with its own code, as when the signal comes during the close.
  // A command whose change is not one transaction (changeInFlight) is let finish instead, as `reconcile --requeue-open`
  // finishes its batch in flight: then it says what was done; a second signal ends it saying the change may be made.
  // A signal while its transaction's COMMIT is in flight cannot say that nothing was done: sent, it is carried through
  // by the database whatever becomes of this process, and its answer alone says whether it was made.
  const [{ commandHasTakenEffect }, { commitInFlight }] = await Promise.all([import('../output-gone.js'), import('../db/commit-in-flight.js')])
  let stopAsked = false
  const stopWork = stopUnlessHeld(
    () => {
      if (commandHasTakenEffect()) {
        writeError('the command is done: printing its result, then exiting (a second Ctrl-C ends the process now)\n')
        return
      }
      if (changeInFlight) {
        stopAsked = true
        writeError(
          `stopping once ${changeInFlight.change} is done: it is not one transaction, and on Postgres a statement sent runs on without this process ` +
            '(a second Ctrl-C ends the process now, without knowing whether it was made)\n',
        )
        return
      }
      writeError(`${commitInFlight() ? stoppedWhileCommitting(committing) : STOPPED_NOTHING_DONE}\n`)
      process.exit(130)
    },
    () => {
      if (!changeInFlight || !stopAsked || commandHasTakenEffect()) return
      writeError(
        `Stopped by a second signal before ${changeInFlight.change} was known to be done: it may or may not have been made ` +
          `(on Postgres a statement sent runs on without this process); ${changeInFlight.see} [stopped]\n`,
      )
      process.exit(130)
    },
  )
  try {
    const result = await run(context).catch(async (error: unknown) => Promise.reject(await unansweredFailure(error, context.config)))
    // its own exit code: nothing was left undone, as `reconcile --requeue-open` says of a signal during its last batch
    if (stopAsked) writeError(`the stop signal came while ${changeInFlight!.change} was in flight; the command has finished, its result above: nothing was left undone\n`)
    return result
  } finally {
    stopWork()
    // The command's work is done (its result printed, or its failure on its way): a stop signal now lets the close
    // finish, and the command exits with its own code. On PGlite the close is Postgres's shutdown checkpoint, up to
    // two seconds on a busy machine: a Ctrl-C then, under Node's default, ended the process in the middle of it (exit
    // 130 after a printed success), and the next open of DATA_DIR went through crash recovery.
    await finishHoldingSignals(
      () => database.close(),
      'the command is done: closing its database, then exiting (a second Ctrl-C ends the process now, the database unclosed)\n',
    )
  }
}

async function openForCommand(migrate: boolean): Promise<{ database: DatabaseHandle; context: CommandContext }> {
  // loaded here, not at start-up: `--help` and forwarded commands never need a database driver
  const [
    { loadConfig },
    { migrateToLatest, MigrationError, NewerBuildError, NotMigratedError, requireMigrated },
    { embeddedDatabaseExists, openDatabase },
    { configuredReactions },
    { configuredEventHandlers },
    { pingDatabase },
    { describeDatabaseError },
    { unreadEnvFile, unreadEnvFileCommandNote },
    { unreadVariableMessage },
  ] = await Promise.all([
    import('../config.js'),
    import('../db/migrate.js'),
    import('../db/open-database.js'),
    import('../reactions/configured-reactions.js'),
    import('../webhooks/event-handlers.js'),
    import('../db/ping-database.js'),
    import('../db/database-errors.js'),
    import('../env-file-notice.js'),
    import('../unread-variables.js'),
  ])
  const config = loadConfig()
  const logger = await cliLogger(config)
  // what `serve` warns of at start, said to the operator here too: a misspelled RETENTION_ or REACTION_ variable
  // otherwise ran `prune` or `reactions` on the defaults without a word; by name, never by value
  for (const unread of config.unreadVariables) writeError(`Warning: ${unreadVariableMessage(unread)}\n`)
  const unreadFile = unreadEnvFile(process.cwd(), process.env)
  if (unreadFile) writeError(unreadEnvFileCommandNote(unreadFile))
  if (!config.databaseUrl && !embeddedDatabaseExists(config.dataDir)) {
    // a second terminal without the service's DATABASE_URL would otherwise start a new database unnoticed
    writeError(
      `Note: no DATABASE_URL and no running service in ${config.dataDir}: creating a new embedded database there ` +
        '(set DATABASE_URL to use Postgres).\n',
    )
  }
  const database = openDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: 2,
    statementTimeoutMs: config.databaseStatementTimeoutMs,
    shortRun: true,
    maxWalBytes: config.dataDirMaxWalBytes,
    minFreeBytes: config.dataDirMinFreeBytes,
    logger,
  })
  try {
    if (!migrate) await pingDatabase(database.db).catch((error: unknown) => Promise.reject(openingFailure(error, describeDatabaseError)))
    // the embedded database in DATA_DIR is this service's own: made and migrated for a first command, as the
    // service's start would; a Postgres one is only looked at (requireMigrated says why)
    else if (!config.databaseUrl) {
      await database.withoutTimeouts(migrateToLatest).catch((error: unknown) => {
        // as `migrate` says it (migrate.command.ts), ending in its code: a newer build's database was refused without one
        throw error instanceof MigrationError && error.failure === 'migrated_by_newer_build' ? new CommandFailedError(error.failure, error.message) : error
      })
    } else {
      // on a connection of its own, as the migration was: the command's first statement then opens another
      await database.withoutTimeouts(requireMigrated).catch((error: unknown) => {
        if (error instanceof NotMigratedError || error instanceof NewerBuildError) throw new CommandFailedError(error.code, capitalized(error.message))
        throw openingFailure(error, describeDatabaseError)
      })
    }
    const context: CommandContext = {
      config,
      logger,
      db: database.db,
      holdLock: database.holdLock,
      vacuum: database.vacuum,
      withoutTimeouts: database.withoutTimeouts,
      reactions: configuredReactions(config, { logger }),
      eventHandlers: configuredEventHandlers(),
    }
    return { database, context }
  } catch (error) {
    await database.close()
    throw await unansweredFailure(error, config)
  }
}

/**
 * A connection that something at the database's address took and never answered, given up on at the connect timeout,
 * said as such: the driver's inner words for it, "Connection terminated unexpectedly", read as a connection cut and
 * named neither the wait nor the address. The code is a database not there's, as run-cli.ts gives it.
 */
async function unansweredFailure(error: unknown, config: Config): Promise<unknown> {
  if (!config.databaseUrl) return error
  const [{ CONNECT_TIMEOUT_MS, isConnectTimeout }, { databaseIdentity }] = await Promise.all([
    import('../db/database-errors.js'),
    import('../local/running-service.js'),
  ])
  if (!isConnectTimeout(error)) return error
  // host:port, the address that took the connection (the database's name is no part of it)
  const address = databaseIdentity(config).location.replace(/\/.*$/, '')
  return new CommandFailedError(
    'database_unavailable',
    `The database did not answer within ${CONNECT_TIMEOUT_MS / 1000} s at ${printable(address)}: something there took the connection and ` +
      'sent nothing back (a Postgres server stopped or overloaded, or another program on that port); try again once it answers',
  )
}

function capitalized(text: string): string {
  return `${text.charAt(0).toUpperCase()}${text.slice(1)}`
}

/**
 * A first connection's failure in the words a migration's has: a database's report or a refused certificate by its
 * fixed message and code (the driver's own, `unable to verify the first certificate`, named neither the database nor
 * the setting to change), [database_refused]; a lost connection as it is, which the command line names as such
 * (run-cli.ts, [database_unavailable]).
 */
function openingFailure(error: unknown, describe: typeof import('../db/database-errors.js').describeDatabaseError): unknown {
  const description = describe(error)
  if (description.kind === 'unavailable' || description.code === undefined) return error
  // ending in its code, as every other failed command's line does: a refused password read `… (28P01)` alone
  return new CommandFailedError('database_refused', `The database could not be opened: ${description.message} (${description.code})`)
}

export function printJson(value: unknown): void {
  write(`${JSON.stringify(value, null, 2)}\n`)
}

/** Prints rows as an aligned text table; an empty list prints `empty`. */
export function printTable(rows: Record<string, unknown>[], empty = '(none)'): void {
  if (rows.length === 0) {
    write(`${empty}\n`)
    return
  }
  const columns = Object.keys(rows[0]!)
  const cell = (value: unknown) =>
    value === null || value === undefined ? '-' : value instanceof Date ? value.toISOString() : printable(String(value))
  const widths = columns.map((column) =>
    Math.max(column.length, ...rows.map((row) => cell(row[column]).length)),
  )
  const line = (values: string[]) =>
    values
      .map((value, i) => value.padEnd(widths[i]!))
      .join('  ')
      .trimEnd()
  write(`${line(columns)}\n`)
  for (const row of rows) write(`${line(columns.map((column) => cell(row[column])))}\n`)
}
