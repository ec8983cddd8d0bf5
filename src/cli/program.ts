// The command tree: the commands are listed here, and each is filled in by its own *.command.ts file.
import { Command, type CommanderError, Help, type OutputConfiguration } from 'commander'
import type { LocalCommandRunner } from '../local/local-cli.js'
import { printable, printableLines } from '../printable.js'
import { shortened } from '../shortened.js'
import { withoutPassword } from '../without-password.js'
import { serviceVersion } from '../version.js'

/**
 * The program's commands, in the order its help lists them. Each fills in its own command (options, arguments,
 * subcommands, action) in its *.command.ts file, which is loaded only for a command line that names it: `--help`
 * and the rest need only these names and descriptions: loading every file was half of what `--help` took beyond Node's
 * own start (83 against 57 ms on Node 24, where `node -e 0` takes 30).
 * `options`: the command takes options of its own (its line in the program's help reads `migrate [options]`).
 */
const COMMANDS: readonly CommandEntry[] = [
  {
    name: 'serve',
    description: 'run the webhook receiver and the poller (what `npm start` runs)',
    fill: async () => (await import('./serve.command.js')).registerServeCommand,
  },
  {
    name: 'migrate',
    description: 'apply every pending database migration (safe to run from several replicas at once)',
    options: true,
    fill: async () => (await import('./migrate.command.js')).registerMigrateCommand,
  },
  {
    name: 'webhook',
    description: 'sign or send a webhook body as the platform would',
    fill: async () => (await import('./webhook.command.js')).registerWebhookCommands,
  },
  {
    name: 'reconcile',
    description:
      'run one poll cycle (--once), show the latest runs (--report), requeue flagged orders (--requeue), or poll every open order soon (--requeue-open)',
    options: true,
    fill: async () => (await import('./reconcile.command.js')).registerReconcileCommands,
  },
  {
    name: 'orders',
    description: 'the partner’s orders: create, show, list',
    fill: async () => (await import('./orders.command.js')).registerOrdersCommands,
  },
  {
    name: 'deliveries',
    description: 'webhook deliveries as received: list, show, reapply, dismiss',
    fill: async () => (await import('./deliveries.command.js')).registerDeliveriesCommands,
  },
  {
    name: 'prune',
    description:
      'delete what retention says is old: raw bodies after RETENTION_DAYS, delivery rows, done reaction jobs and reconcile runs after DELIVERY_RETENTION_DAYS (never order history or parked deliveries)',
    options: true,
    fill: async () => (await import('./prune.command.js')).registerPruneCommand,
  },
  {
    name: 'reactions',
    description:
      "reaction jobs (one per transition and handler): list, show, retry, skip; rebase the streams after a restore; release a stream's lease",
    fill: async () => (await import('./reactions.command.js')).registerReactionsCommands,
  },
  {
    name: 'trades',
    description: 'create and move the platform trade of an order',
    fill: async () => (await import('./trades.command.js')).registerTradesCommands,
  },
  {
    name: 'disputes',
    description: 'disputes on an order’s trade',
    fill: async () => (await import('./disputes.command.js')).registerDisputesCommands,
  },
  {
    name: 'proposals',
    description: 'proposals that resolve a dispute',
    fill: async () => (await import('./proposals.command.js')).registerProposalsCommands,
  },
  {
    name: 'sandbox',
    description: 'run the platform simulator: signed partner API and webhooks with retries and faults',
    options: true,
    fill: async () => (await import('./sandbox.command.js')).registerSandboxCommand,
  },
  {
    name: 'demo',
    description: 'run trades of five kinds in turn (50 by default: ten of each) against the sandbox with lost, repeated and reordered webhooks',
    options: true,
    fill: async () => (await import('./demo.command.js')).registerDemoCommand,
  },
]

interface CommandEntry {
  name: string
  description: string
  options?: true
  fill: () => Promise<(command: Command, runCommand: LocalCommandRunner) => void>
}

/**
 * The program for `commandLine`: every command named with its description, and filled in for the one the line names
 * (`orders …`, `help orders …`), or for all of them with `fill: 'all'`.
 * `runCommand` is how `serve` runs a second terminal's command lines: given by the caller (run-cli.ts),
 * so that nothing the service loads imports the command tree back.
 */
export async function buildProgram(
  runCommand: LocalCommandRunner,
  output?: OutputConfiguration,
  commandLine: readonly string[] = [],
  { fill = 'named' }: { fill?: 'named' | 'all' } = {},
): Promise<Command> {
  const program = new Command()
    .name('partner-escrow')
    .description('Integration backend for the escrow trade platform: webhooks, API client, poller, sandbox')
    .version(serviceVersion(), '-V, --version', 'print the version and exit')
  // what commander writes to stderr has its controls shown, not acted on
  const writeErr = output?.writeErr ?? ((text: string) => process.stderr.write(text))
  // commander's refusal of the command line (`error: unknown option '--colour'`) is held until its exit, where its
  // code is known, and said there ending in ours, as every other refusal's line does: it ended with no code
  let refusal: string | undefined
  // settings set here are inherited by every command registered below: parse errors throw, and run-cli.ts turns
  // them into exit code 2
  program
    .configureOutput({
      ...output,
      writeErr: (text) => writeErr(printableLines(text)),
      outputError: (text) => (refusal = text),
    })
    .exitOverride((error) => {
      if (refusal !== undefined) {
        writeErr(printableLines(withCode(shownParseError(refusal, commandLine), parseErrorCode(error))))
        writeErr('(run with --help for usage)\n')
        refusal = undefined
      }
      throw error
    })
  const named = fill === 'all' ? undefined : namedCommand(commandLine)
  const unfilled = new Map<Command, string>()
  for (const entry of COMMANDS) {
    const command = program.command(entry.name).description(entry.description)
    if (fill === 'all' || entry.name === named) (await entry.fill())(command, runCommand)
    else unfilled.set(command, entry.options ? `${entry.name} [options]` : entry.name)
  }
  // a command not filled in is listed in the help as it would be filled (the help's test compares the two)
  const defaultTerm = Help.prototype.subcommandTerm
  program.configureHelp({
    subcommandTerm(command) {
      return unfilled.get(command) ?? defaultTerm.call(this, command)
    },
  })
  addHelpCommands(program)
  return program
}

/** The command a command line names: its first argument that is no option, or the one after `help`. */
function namedCommand(commandLine: readonly string[]): string | undefined {
  const [first, second] = commandLine.filter((argument) => !argument.startsWith('-'))
  return first === 'help' ? second : first
}

/** The code a refusal of commander's ends in: `unknown_command`, or `invalid_arguments` for any other. */
function parseErrorCode(error: CommanderError): string {
  return error.code === 'commander.unknownCommand' ? 'unknown_command' : 'invalid_arguments'
}

/** A refusal as shownParseError shows it, `[code]` at the end of its first line (a suggestion keeps its own). */
function withCode(shown: string, code: string): string {
  const end = shown.indexOf('\n')
  return end < 0 ? `${shown} [${code}]` : `${shown.slice(0, end)} [${code}]${shown.slice(end)}`
}

/**
 * `help [command...]` on the program and on each group of commands, in place of commander's own, which reads one
 * name: `help orders list` showed the help of `orders`, and `help bogus` the program's, with no refusal. A name that
 * is no command is refused as commander refuses one, `[unknown_command]`.
 */
function addHelpCommands(command: Command): void {
  if (command.commands.length === 0) return
  for (const group of command.commands) addHelpCommands(group)
  if (command.parent) {
    // a group named without one of its commands (`orders`): commander prints its help to stderr, exit 2, and that
    // ended with no refusal line, so no code
    const names = command.commands.map((sub) => sub.name())
    command.addHelpText('after', (context) =>
      context.error ? `\nerror: missing command: '${commandPath(command).join(' ')}' takes one of ${names.join(', ')} [invalid_arguments]` : '',
    )
  }
  const help: Command = command
    .command('help')
    .description('display help for command')
    .argument('[command...]', 'the command (and subcommand) to show the help of')
    .action((names: string[]) => {
      let shown = command
      for (const [index, name] of names.entries()) {
        const found = shown.commands.find((sub) => sub.name() === name || sub.aliases().includes(name))
        if (!found) {
          const typed = [...commandPath(command), ...names.slice(0, index + 1)].join(' ')
          const similar = similarNames(name, shown.commands.map((sub) => sub.name()).filter((sub) => sub !== 'help'))
          help.error(`error: unknown command '${typed}'${didYouMean(similar)}`, { code: 'commander.unknownCommand' })
        }
        shown = found
      }
      shown.outputHelp()
    })
}

/** `\n(Did you mean x?)` (or `one of x, y`) for names like a mistyped one, as commander's own refusal adds; '' for none. */
function didYouMean(similar: string[]): string {
  if (similar.length === 0) return ''
  return similar.length === 1 ? `\n(Did you mean ${similar[0]}?)` : `\n(Did you mean one of ${similar.join(', ')}?)`
}

/**
 * The names closest to `typed` by edit distance (a letter added, dropped, changed or two swapped), at most 3 edits
 * and over 40 % alike: the rule commander suggests by for a command typed wrong.
 */
export function similarNames(typed: string, names: readonly string[]): string[] {
  let best = 3
  let found: string[] = []
  for (const name of names) {
    const distance = editDistance(typed, name)
    const longer = Math.max(typed.length, name.length)
    if (distance > best || (longer - distance) / longer <= 0.4) continue
    if (distance < best) found = []
    best = distance
    found.push(name)
  }
  return found.sort()
}

/** Damerau-Levenshtein distance (optimal string alignment) between two short names. */
function editDistance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)))
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      d[i]![j] = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i]![j] = Math.min(d[i]![j]!, d[i - 2]![j - 2]! + 1)
    }
  }
  return d[a.length]![b.length]!
}

/** The names that lead to `command` from the program: `['orders']` for `orders`, none for the program. */
function commandPath(command: Command): string[] {
  return command.parent ? [...commandPath(command.parent), command.name()] : []
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
