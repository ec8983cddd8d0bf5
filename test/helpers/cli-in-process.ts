// Runs a command line in this process, its output captured, as the service runs a forwarded one: fast,
// and on whichever database the suite uses.
import type { Kysely } from 'kysely'
import type { CliContext } from '../../src/cli/cli-context.js'
import { runCapturedCommandLine } from '../../src/cli/run-cli.js'
import type { Config } from '../../src/config.js'
import type { Database } from '../../src/db/database.js'
import { configuredReactions } from '../../src/reactions/configured-reactions.js'
import { testLogger } from './log-sink.js'
import { testConfig } from './test-config.js'

/**
 * Runs `args` with the given context (none: the command opens what it needs, as from a terminal): its exit code and
 * output. Whether it took effect, which the service sends a second terminal with them, is left out: the compiled
 * process's tests read it where it shows (output-full-process.test.ts).
 */
export async function runCommandWith(args: string[], context?: CliContext) {
  const { code, stdout, stderr } = await runCapturedCommandLine(args, context)
  return { code, stdout, stderr }
}

export function runCommand(args: string[], db: Kysely<Database>, config: Config = testConfig()) {
  const logger = testLogger(config.webhook.secrets)
  // the handlers a command routes by, without the fork's own (as startTestService starts the service)
  return runCommandWith(args, { config, db, logger, reactions: configuredReactions(config, { logger, partnerHandlers: false }) })
}
