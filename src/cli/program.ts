// The command tree. Each group lives in its own *.command.ts file and registers itself here.
import { Command, type OutputConfiguration } from 'commander'
import type { LocalCommandRunner } from '../local/local-cli.js'
import { registerDeliveriesCommands } from './deliveries.command.js'
import { registerDisputesCommands } from './disputes.command.js'
import { registerDemoCommand } from './demo.command.js'
import { registerMigrateCommand } from './migrate.command.js'
import { registerOrdersCommands } from './orders.command.js'
import { registerProposalsCommands } from './proposals.command.js'
import { registerPruneCommand } from './prune.command.js'
import { registerReactionsCommands } from './reactions.command.js'
import { registerReconcileCommands } from './reconcile.command.js'
import { registerSandboxCommand } from './sandbox.command.js'
import { registerServeCommand } from './serve.command.js'
import { registerTradesCommands } from './trades.command.js'
import { registerWebhookCommands } from './webhook.command.js'
import { printable, printableLines } from '../printable.js'
import { shortened } from '../shortened.js'
import { withoutPassword } from '../without-password.js'
import { serviceVersion } from '../version.js'

/**
 * `runCommand` is how `serve` runs a second terminal's command lines: given by the caller (run-cli.ts),
 * so that nothing the service loads imports the command tree back.
 */
export function buildProgram(runCommand: LocalCommandRunner, output?: OutputConfiguration, commandLine: readonly string[] = []): Command {
  const program = new Command()
    .name('partner-escrow')
    .description('Integration backend for the escrow trade platform: webhooks, API client, poller, sandbox')
    .version(serviceVersion(), '-V, --version', 'print the version and exit')
    .showHelpAfterError('(run with --help for usage)')
    // settings set here are inherited by every command registered below: parse errors throw, and
    // src/cli.ts turns them into exit code 2
    .exitOverride()
  // what commander writes to stderr (its help after an error, too) has its controls shown, not acted on
  const writeErr = output?.writeErr ?? ((text: string) => process.stderr.write(text))
  program.configureOutput({
    ...output,
    writeErr: (text) => writeErr(printableLines(text)),
    outputError: (text, write) => write(shownParseError(text, commandLine)),
  })
  registerServeCommand(program, runCommand)
  registerMigrateCommand(program)
  registerWebhookCommands(program)
  registerReconcileCommands(program)
  registerOrdersCommands(program)
  registerDeliveriesCommands(program)
  registerPruneCommand(program)
  registerReactionsCommands(program)
  registerTradesCommands(program)
  registerDisputesCommands(program)
  registerProposalsCommands(program)
  registerSandboxCommand(program)
  registerDemoCommand(program)
  return program
}

/**
 * A parse error of commander's as the terminal shows it. Its messages quote the argument as typed and break a
 * line only before a suggestion, `(Did you mean …?)`, and at their end: every other line feed and tab is the
 * argument's, shown as \u000a and \u0009 like its other controls, so a pasted value cannot start a line. An
 * argument of `commandLine` it quotes is shown as `shownArgument` shows it.
 */
export function shownParseError(text: string, commandLine: readonly string[] = []): string {
  const end = text.endsWith('\n') ? '\n' : ''
  const message = withArgumentsShown(text.slice(0, text.length - end.length), commandLine)
  const suggestion = message.lastIndexOf('\n(Did you mean ')
  if (suggestion < 0) return printable(message) + end
  return `${printable(message.slice(0, suggestion))}\n${printable(message.slice(suggestion + 1))}${end}`
}

/** An argument as a refusal quotes it: a URL's password as `***`, and the first 200 characters of a long one. */
export function shownArgument(value: string): string {
  return shortened(withoutPassword(value), 200)
}

/**
 * `text` with each argument of `commandLine` in it (an option's `--name=value` given whole or as its value) as
 * `shownArgument` shows it: a refusal repeated a pasted 10 kB value whole, and a URL with its password.
 */
export function withArgumentsShown(text: string, commandLine: readonly string[]): string {
  const values = commandLine.flatMap((argument) => {
    const equals = argument.startsWith('-') ? argument.indexOf('=') : -1
    return equals > 0 ? [argument, argument.slice(equals + 1)] : [argument]
  })
  // the longest first, so that a value inside another is not shown twice over
  const changed = values.filter((value) => value !== '' && shownArgument(value) !== value).sort((a, b) => b.length - a.length)
  return changed.reduce((shown, value) => shown.split(value).join(shownArgument(value)), text)
}
