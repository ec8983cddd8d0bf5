// Runs a command line in this process against a test database, as the service runs a forwarded one:
// fast, and on whichever database the suite uses.
import type { Kysely } from 'kysely'
import { runCommandLine } from '../../src/cli/run-cli.js'
import type { Config } from '../../src/config.js'
import type { Database } from '../../src/db/database.js'
import { testLogger } from './log-sink.js'
import { testConfig } from './test-config.js'

export async function runCommand(
  args: string[],
  db: Kysely<Database>,
  config: Config = testConfig(),
): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = ''
  let stderr = ''
  const code = await runCommandLine(args, {
    stdout: { write: (text: string) => (stdout += text) },
    stderr: { write: (text: string) => (stderr += text) },
    exitCode: 0,
    context: { config, db, logger: testLogger(config.webhook.secrets) },
  })
  return { code, stdout, stderr }
}
