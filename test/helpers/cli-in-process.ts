// Runs a command line in this process, its output captured, as the service runs a forwarded one: fast,
// and on whichever database the suite uses.
import type { Kysely } from 'kysely'
import type { CliContext } from '../../src/cli/cli-context.js'
import { runCommandLine } from '../../src/cli/run-cli.js'
import type { Config } from '../../src/config.js'
import type { Database } from '../../src/db/database.js'
import { testLogger } from './log-sink.js'
import { testConfig } from './test-config.js'

export interface CommandResult {
  code: number
  stdout: string
  stderr: string
}

/** Runs `args` with the given context (none: the command builds its own, as from a terminal). */
export async function runCommandWith(args: string[], context?: CliContext): Promise<CommandResult> {
  let stdout = ''
  let stderr = ''
  const code = await runCommandLine(args, {
    stdout: { write: (text: string) => (stdout += text) },
    stderr: { write: (text: string) => (stderr += text) },
    exitCode: 0,
    ...(context ? { context } : {}),
  })
  return { code, stdout, stderr }
}

export function runCommand(args: string[], db: Kysely<Database>, config: Config = testConfig()): Promise<CommandResult> {
  return runCommandWith(args, { config, db, logger: testLogger(config.webhook.secrets) })
}
