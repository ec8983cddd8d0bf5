// `sandbox`: the platform simulator on its own port, for a receiver configured against it
// (PARTNER_API_BASE_URL=http://127.0.0.1:4010). Every option also reads an environment variable.
import { lookup } from 'node:dns/promises'
import { BlockList } from 'node:net'
import { type Command, InvalidArgumentError, Option } from 'commander'
import { MAX_TIMER_MS } from '../clock.js'
import type { Faults } from '../sandbox/webhook-dispatcher.js'
import { untilStopSignal } from '../stop-signals.js'
import { portNumber, wholeNumber } from './cli-arguments.js'
import { cliLogger, UsageError, write, writeError } from './cli-context.js'
import { withoutPassword } from '../without-password.js'
import { describeListenError } from '../listen-error.js'

function rate(value: string): number {
  const parsed = Number(value)
  if (!(parsed >= 0 && parsed <= 1)) throw new InvalidArgumentError('must be a share between 0 and 1')
  return parsed
}

// a wait: past the timers' limit it would end after 1 ms, not when asked
function milliseconds(value: string): number {
  const parsed = wholeNumber(value)
  if (parsed > MAX_TIMER_MS) throw new InvalidArgumentError(`must be at most ${MAX_TIMER_MS} ms (about 24.8 days)`)
  return parsed
}

// a wait that must be able to end in time: 0 would abort every attempt before it is sent
function positiveMilliseconds(value: string): number {
  const parsed = milliseconds(value)
  if (parsed === 0) throw new InvalidArgumentError(`must be from 1 to ${MAX_TIMER_MS} ms`)
  return parsed
}

// a key id or secret: an empty one would sign (or accept) with nothing, so every request or webhook fails
function nonEmpty(value: string): string {
  if (value.trim() === '') throw new InvalidArgumentError('must not be empty')
  return value
}

// where webhooks are POSTed: only http(s) is ever delivered to, so anything else would fail every attempt
function webhookUrl(value: string): string {
  let url: URL
  try {
    url = new URL(value)
  } catch {
    throw new InvalidArgumentError('must be an http:// or https:// URL')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new InvalidArgumentError('must be an http:// or https:// URL')
  }
  return value
}

// the fault flags are the dispatcher's Faults, one for one
interface SandboxFlags extends Faults {
  port?: number
  host: string
  webhookUrl?: string
  webhookSecret?: string
  partnerKind?: 'marketplace' | 'merchant'
  milestoneAnswer?: 'trade' | 'milestone'
  keyId?: string
  apiSecret?: string
  retryBaseDelayMs: number
  attemptTimeoutMs: number
  timestampWindowS: number
  refundDelayMs: number
  reorderHoldMs: number
}

export function registerSandboxCommand(sandbox: Command): void {
  const option = (flags: string, description: string, env: string) => new Option(flags, description).env(env)
  sandbox
    .addOption(option('--port <port>', 'port to listen on (default: SANDBOX_PORT, 4010)', 'SANDBOX_PORT').argParser(portNumber))
    .addOption(option('--host <host>', 'interface to bind', 'SANDBOX_HOST').default('127.0.0.1'))
    .addOption(option('--webhook-url <url>', 'where webhooks go (default: this service’s receiver)', 'SANDBOX_WEBHOOK_URL').argParser(webhookUrl))
    .addOption(option('--webhook-secret <secret>', 'webhook signing secret (default: the first WEBHOOK_SECRETS)', 'SANDBOX_WEBHOOK_SECRET').argParser(nonEmpty))
    .addOption(option('--partner-kind <kind>', 'marketplace or merchant (default: PARTNER_KIND)', 'SANDBOX_PARTNER_KIND').choices(['marketplace', 'merchant']))
    .addOption(
      option('--milestone-answer <record>', 'what a milestone deliver or release answers: the trade record or the milestone record (default: trade)', 'SANDBOX_MILESTONE_ANSWER').choices([
        'trade',
        'milestone',
      ]),
    )
    .addOption(option('--key-id <id>', 'the API key id it accepts (default: PARTNER_API_KEY_ID)', 'SANDBOX_API_KEY_ID').argParser(nonEmpty))
    .addOption(option('--api-secret <secret>', 'the API secret it verifies with (default: PARTNER_API_SECRET)', 'SANDBOX_API_SECRET').argParser(nonEmpty))
    .addOption(option('--retry-base-delay-ms <ms>', 'first retry delay; doubles per attempt', 'SANDBOX_RETRY_BASE_DELAY_MS').argParser(milliseconds).default(1_000))
    .addOption(option('--attempt-timeout-ms <ms>', 'a 2xx within this counts as delivered', 'SANDBOX_ATTEMPT_TIMEOUT_MS').argParser(positiveMilliseconds).default(5_000))
    .addOption(option('--timestamp-window-s <s>', 'accepted request timestamp skew', 'SANDBOX_TIMESTAMP_WINDOW_S').argParser(wholeNumber).default(300))
    .addOption(option('--refund-delay-ms <ms>', 'cancelled → refunded delay for a funded trade', 'SANDBOX_REFUND_DELAY_MS').argParser(milliseconds).default(1_000))
    .addOption(option('--drop-rate <share>', 'share of webhooks never delivered', 'SANDBOX_DROP_RATE').argParser(rate).default(0))
    .addOption(option('--duplicate-rate <share>', 'share of deliveries sent twice', 'SANDBOX_DUPLICATE_RATE').argParser(rate).default(0))
    .addOption(option('--reorder-rate <share>', 'share of webhooks overtaken by the next', 'SANDBOX_REORDER_RATE').argParser(rate).default(0))
    .addOption(
      option('--reorder-hold-ms <ms>', 'how long a reordered webhook waits at most for its trade’s next one', 'SANDBOX_REORDER_HOLD_MS')
        .argParser(milliseconds)
        .default(3_000),
    )
    .addOption(option('--delay-rate <share>', 'share of webhooks delayed', 'SANDBOX_DELAY_RATE').argParser(rate).default(0))
    .addOption(option('--delay-ms <ms>', 'how long a delayed webhook waits', 'SANDBOX_DELAY_MS').argParser(milliseconds).default(0))
    .addOption(option('--seed <n>', 'seed of the fault injection', 'SANDBOX_SEED').argParser(wholeNumber).default(1))
    .action(async (flags: SandboxFlags, command: Command) => {
      // loaded when run, so that other commands do not pay for the sandbox's modules
      const [{ loadConfig }, { createSandbox }] = await Promise.all([
        import('../config.js'),
        import('../sandbox/create-sandbox.js'),
      ])
      const config = loadConfig()
      // the simulator signs webhooks with the configured secret: under live, that would be the live one
      if (config.partner.env === 'live') {
        throw new UsageError(
          'The sandbox does not run with PARTNER_ENV=live: it would sign webhooks with the live webhook secret. ' +
            'Run it with PARTNER_ENV=sandbox (the default) and the sandbox key pair.',
          'config_invalid',
        )
      }
      const inFiles = await secretsInFiles(command)
      // commander fills an option from its variable too: the source says which one the operator set
      // (commander keys a value by the option's name in camelCase: --webhook-url's is webhookUrl)
      const setting = (option: string, variable: string) =>
        command.getOptionValueSource(option.replace(/-(\w)/g, (_, letter: string) => letter.toUpperCase())) === 'cli' ? `--${option}` : variable
      if (flags.webhookUrl !== undefined && hasCredentials(flags.webhookUrl)) {
        // (not in the option's own parser: commander's refusal quotes the value, and one from the variable whole)
        throw new UsageError(
          `${setting('webhook-url', 'SANDBOX_WEBHOOK_URL')}: holds a user name or password, and fetch sends no request to such a URL, so ` +
            'every webhook would fail; give the receiver’s URL without them (the receiver checks the signature)',
          'webhook_url_has_credentials',
        )
      }
      const logger = await cliLogger(config)
      // a simulator runs on like a service: its warnings (an attempt that got no answer, an event given up) are what
      // its person needs to see, where a command's log lines are errors only
      if (config.logLevel === 'info') logger.level = 'warn'
      const host = config.host === '0.0.0.0' ? '127.0.0.1' : config.host
      const sandbox = createSandbox({
        keyId: flags.keyId ?? config.partner.keyId,
        apiSecret: flags.apiSecret ?? inFiles.SANDBOX_API_SECRET ?? config.partner.secret,
        webhookSecret: flags.webhookSecret ?? inFiles.SANDBOX_WEBHOOK_SECRET ?? config.webhook.secrets[0]!,
        webhookUrl: flags.webhookUrl ?? `http://${host}:${config.port}${config.webhook.path}`,
        partnerKind: flags.partnerKind ?? config.partner.kind,
        milestoneAnswer: flags.milestoneAnswer ?? config.sandbox.milestoneAnswer,
        controlToken: config.sandbox.controlToken,
        retryBaseDelayMs: flags.retryBaseDelayMs,
        attemptTimeoutMs: flags.attemptTimeoutMs,
        timestampWindowS: flags.timestampWindowS,
        refundDelayMs: flags.refundDelayMs,
        reorderHoldMs: flags.reorderHoldMs,
        faults: {
          dropRate: flags.dropRate,
          duplicateRate: flags.duplicateRate,
          reorderRate: flags.reorderRate,
          delayRate: flags.delayRate,
          delayMs: flags.delayMs,
          seed: flags.seed,
        },
        logger,
      })
      const port = flags.port ?? config.sandbox.port
      const url = await sandbox.listen(port, flags.host).catch((error: unknown) => {
        throw describeListenError(error, {
          portSetting: setting('port', 'SANDBOX_PORT'),
          hostSetting: setting('host', 'SANDBOX_HOST'),
          port,
          host: flags.host,
        })
      })
      const reachable = await reachableFromOtherMachines(flags.host)
      if (reachable) {
        const given = setting('host', 'SANDBOX_HOST')
        writeError(
          `warning: ${given === '--host' ? `--host ${flags.host}` : `SANDBOX_HOST=${flags.host}`} is not a loopback address, so other machines ` +
            'can reach the simulator: its API is signed and its control endpoints need the token, but it is a simulator ' +
            'with test secrets. Give 127.0.0.1 unless they must reach it.\n',
        )
      }
      // the base URL a receiver is given is the root: the client adds /api/partner/v1/ (config.ts refuses it whole)
      // bound to every interface, its own address is no address to give a receiver (another container, another machine)
      const everywhere = /^http:\/\/(?:0\.0\.0\.0|\[::\])(:\d+)$/.exec(url)
      const baseUrl = everywhere ? `http://<this machine's address>${everywhere[1]} (http://127.0.0.1${everywhere[1]} on this machine)` : url
      write(`sandbox platform listening on ${url} (partner API at ${url}/api/partner/v1/; a receiver's PARTNER_API_BASE_URL=${baseUrl})\n`)
      write(`webhooks go to ${withoutPassword(flags.webhookUrl ?? `http://${host}:${config.port}${config.webhook.path}`)}\n`)
      if ((flags.milestoneAnswer ?? config.sandbox.milestoneAnswer) === 'milestone') {
        write('a milestone deliver or release answers the milestone record, not the trade record\n')
      }
      write(`key id ${flags.keyId ?? config.partner.keyId}; secrets as configured (not shown). Ctrl-C stops it.\n`)
      // they answer only under a loopback Host name: bound to every interface, at 127.0.0.1 (0.0.0.0 is no Host they
      // take); on another address, with a loopback Host header
      const controlBase = everywhere ? `http://127.0.0.1${everywhere[1]}` : url
      const hostNote = reachable && !everywhere ? ' and a loopback Host header (Host: localhost): they answer only to localhost, 127.0.0.1 or [::1]' : ''
      write(
        config.sandbox.controlToken
          ? `control endpoints ${controlBase}/sandbox/* need Authorization: Bearer <${controlTokenSource(config.localSecretsFile)}>${hostNote}\n`
          : 'control endpoints /sandbox/* are off: set SANDBOX_CONTROL_TOKEN to use them\n',
      )
      await untilStopSignal()
      await sandbox.close()
    })
}

/**
 * Where the control token came from, as the start line names it: SANDBOX_CONTROL_TOKEN (or its _FILE) wins over
 * local-secrets.json (config.ts), and the line named the file even when the variable was set, so the token looked
 * up there was refused.
 */
function controlTokenSource(localSecretsFile: string | undefined): string {
  if (process.env.SANDBOX_CONTROL_TOKEN !== undefined) return 'SANDBOX_CONTROL_TOKEN'
  if (process.env.SANDBOX_CONTROL_TOKEN_FILE !== undefined) return 'the contents of SANDBOX_CONTROL_TOKEN_FILE'
  return localSecretsFile ? `sandboxControlToken in ${localSecretsFile}` : 'SANDBOX_CONTROL_TOKEN'
}

// a URL with a user name or password: fetch refuses to send a request to one
function hasCredentials(value: string): boolean {
  const url = new URL(value)
  return url.username !== '' || url.password !== ''
}

/**
 * SANDBOX_WEBHOOK_SECRET_FILE and SANDBOX_API_SECRET_FILE read (secret-files.ts), for the options the command line
 * leaves to the environment (`--api-secret` wins over the file as over the variable); refused as a configuration is.
 */
async function secretsInFiles(command: Command): Promise<Record<string, string | undefined>> {
  const [{ secretsInFiles: read }, { ConfigError }, { shownPath }] = await Promise.all([
    import('../config.js'),
    import('../config-error.js'),
    import('../secret-files.js'),
  ])
  const names = (
    [
      ['webhookSecret', 'SANDBOX_WEBHOOK_SECRET'],
      ['apiSecret', 'SANDBOX_API_SECRET'],
    ] as const
  )
    .filter(([option]) => command.getOptionValueSource(option) !== 'cli')
    .map(([, name]) => name)
  const { env, fromFiles, problems } = read(process.env, names)
  // as the option's own reading (nonEmpty) refuses a blank value
  const blank = [...fromFiles].filter(([name]) => env[name]!.trim() === '').map(([name, file]) => `${name}_FILE: the file ${shownPath(file)} holds nothing but spaces`)
  if (problems.length > 0 || blank.length > 0) throw new ConfigError([...problems, ...blank])
  return Object.fromEntries([...fromFiles.keys()].map((name) => [name, env[name]]))
}

// Whether the address the sandbox listens on is other than a loopback one (127.0.0.0/8, ::1): 0.0.0.0 or ::
// (every interface), a network's address, or a name for one. listen() looks a name up as lookup() does and
// takes the first address, so this is the address it bound; '' is every interface, as for listen().
async function reachableFromOtherMachines(host: string): Promise<boolean> {
  if (host === '') return true
  const loopback = new BlockList()
  loopback.addSubnet('127.0.0.0', 8, 'ipv4')
  loopback.addAddress('::1', 'ipv6')
  try {
    const { address, family } = await lookup(host)
    return !loopback.check(address, family === 6 ? 'ipv6' : 'ipv4')
  } catch {
    // it listens, so the name resolved a moment ago: whatever it is now, say so rather than nothing
    return true
  }
}
