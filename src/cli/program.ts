// The command tree. Each group lives in its own *.command.ts file and registers itself here.
import { Command } from 'commander'
import { registerMigrateCommand } from './migrate.command.js'
import { registerServeCommand } from './serve.command.js'
import { registerWebhookCommands } from './webhook.command.js'

export function buildProgram(): Command {
  const program = new Command()
    .name('partner-escrow')
    .description('Integration backend for the escrow trade platform: webhooks, API client, poller, sandbox')
    .showHelpAfterError('(run with --help for usage)')
    // settings set here are inherited by every command registered below: parse errors throw, and
    // src/cli.ts turns them into exit code 2
    .exitOverride()
  registerServeCommand(program)
  registerMigrateCommand(program)
  registerWebhookCommands(program)
  return program
}
