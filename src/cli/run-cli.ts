// Parses and runs one command line; the exit code it returns is the contract of every command:
// 0 done, 1 failed (not found, refused by the platform, the database not there, ...), 2 bad arguments or
// configuration, 130 stopped by a signal.
import { CommanderError } from 'commander'
import { databaseReport, describeDatabaseError } from '../db/database-errors.js'
import { printable } from '../printable.js'
import { shortened } from '../shortened.js'
import { ListenSettingError } from '../listen-error.js'
import { type CliContext, type CliScope, CommandFailedError, runInScope, StoppedBySignalError, UsageError, writeError } from './cli-context.js'
import { withoutPassword } from '../without-password.js'
import { innermostReason } from './failure-reason.js'
import { buildProgram, withArgumentsShown } from './program.js'
import type { CommandOutput } from '../local/running-service.js'

export async function runCommandLine(args: string[], cliScope?: CliScope): Promise<number> {
  const run = async (): Promise<number> => {
    const program = await buildProgram(
      runCapturedCommandLine,
      cliScope && {
        writeOut: (text) => cliScope.stdout.write(text),
        writeErr: (text) => cliScope.stderr.write(text),
      },
      args,
    )
    try {
      await program.parseAsync(args, { from: 'user' })
      return cliScope ? cliScope.exitCode : Number(process.exitCode ?? 0)
    } catch (error) {
      if (error instanceof CommanderError) return error.exitCode === 0 ? 0 : 2
      // ConfigError by name: importing config.js here would load zod for `--help` too
      if (error instanceof UsageError || (error instanceof Error && error.name === 'ConfigError')) {
        writeError(`${withArgumentsShown(error.message, args)}\n`)
        return 2
      }
      if (error instanceof StoppedBySignalError) {
        writeError(`${error.message}\n`)
        return 130
      }
      // a refusal may quote an argument (`No order with external reference …`): as shownArgument shows it
      writeError(`${withArgumentsShown(databaseUnavailable(error) ?? databaseRefused(error) ?? (error instanceof Error ? error.message : String(error)), args)}\n`)
      return 1
    }
  }
  return cliScope ? runInScope(cliScope, run) : run()
}

/**
 * A command line with its output captured: inside the service (a second terminal's, src/local/local-cli.ts)
 * with the service's `context`; without one, the command opens what it needs itself.
 */
export async function runCapturedCommandLine(
  args: string[],
  context?: CliContext,
): Promise<CommandOutput> {
  let stdout = ''
  let stderr = ''
  const captured: CliScope = {
    stdout: { write: (text: string) => (stdout += text) },
    stderr: { write: (text: string) => (stderr += text) },
    exitCode: 0,
    ...(context ? { context } : {}),
  }
  const code = await runCommandLine(args, captured)
  return { code, stdout, stderr, ...(captured.tookEffect ? { tookEffect: true, effect: captured.tookEffect } : {}) }
}

/**
 * The line for a command the database refused for another reason (a permission revoked, a constraint or a trigger of
 * a DBA's, a bug): its words with its SQLSTATE and a code. Printed as they came, they were the whole line, with no
 * code, and a trigger's message may quote a row's values, an outsider's among them, line feeds and escapes raw.
 */
function databaseRefused(error: unknown): string | undefined {
  if (error instanceof CommandFailedError || error instanceof ListenSettingError) return undefined
  const report = databaseReport(error)
  if (report === undefined) return undefined
  return `The database refused the command: ${printable(shortened(report.message, 500))} (SQLSTATE ${report.code}) [database_error]`
}

/**
 * The line for a command the database was not there for, or undefined for any other error. The driver's own words
 * alone ("Connection terminated unexpectedly", "read ECONNRESET", "timeout exceeded when trying to connect") did
 * not say that the database was the problem, nor that the same command can simply be run again.
 */
function databaseUnavailable(error: unknown): string | undefined {
  // a command's own refusal names its code already (a platform that could not be reached is `[not_sent]`), and a
  // listener's names its setting
  if (error instanceof CommandFailedError || error instanceof ListenSettingError) return undefined
  const description = describeDatabaseError(error)
  if (description.kind !== 'unavailable') return undefined
  // a report of the database's own (read-only, a statement timeout, too many clients) by its fixed words and code:
  // its text may quote the command's values
  if (description.sqlstateClass) {
    return `The database could not run the command now: ${description.message} (${description.code}); try again later [database_unavailable]`
  }
  return `The database cannot be reached (${withoutPassword(innermostReason(error))}); try again once it is up [database_unavailable]`
}
