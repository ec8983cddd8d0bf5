// `serve`: load config, start the service, stop it cleanly on SIGTERM, SIGINT or SIGHUP (stop-signals.ts).
//
// Stopping drains first (service.ts): /readyz answers 503 and the poller and the reaction dispatcher stop
// claiming at once; requests are still served for SHUTDOWN_DRAIN_DELAY_MS so a load balancer notices; what
// is in flight finishes and unfinished claims are given back. It is bounded: whatever stdout does (a `| tee` interrupted by the same
// Ctrl-C, a full pipe), the process is gone within SHUTDOWN_DRAIN_DELAY_MS + SHUTDOWN_TIMEOUT_MS, and a
// second signal exits at once (130); the same signal again within a second is npm's copy of a Ctrl-C, not a
// second one (stop-signals.ts).
import path from 'node:path'
import { type Config, ConfigError, configSecrets, DEFAULT_DATA_DIR, embeddedDatabaseWarning, loadConfig } from './config.js'
import { loggableError } from './db/database-errors.js'
import { MigrationError } from './db/migrate.js'
import { UNREAD_ENV_FILE_MESSAGE, unreadEnvFile } from './env-file-notice.js'
import { createLogger, exitProcess, flushLogger } from './logger.js'
import { ignoreGoneOutput } from './output-gone.js'
import { logProcessWarnings } from './process-warnings.js'
import { quoteForShell } from './quote-for-shell.js'
import type { LocalCommandRunner } from './local/local-cli.js'
import type { ReactionRegistry } from './reactions/reaction-registry.js'
import { type RunningService, startService } from './service.js'
import { onStopSignals, type StopSignal } from './stop-signals.js'
import { unreadVariableMessage } from './unread-variables.js'

/**
 * `runCommand`: how the service runs a second terminal's command line (given by the CLI that calls this).
 * `registerReactions`: reaction handlers a program that runs `serve` itself registers in code.
 */
export async function main({
  runCommand,
  registerReactions,
}: {
  runCommand: LocalCommandRunner
  registerReactions?: (reactions: ReactionRegistry) => void
}): Promise<void> {
  let config: Config
  try {
    config = loadConfig()
  } catch (error) {
    if (error instanceof ConfigError) {
      console.error(error.message)
      process.exit(2)
    }
    throw error
  }
  // a reader that went away (a pipe's, a closed terminal's) is not the service's failure: the lines are lost
  ignoreGoneOutput()
  const local = config.partner.mode === 'local'
  const logger = createLogger({
    level: config.logLevel,
    // a person at a terminal reads local mode; anything else (a pipe, a container) gets JSON lines
    pretty: config.logPretty ?? (local && process.stdout.isTTY === true),
    secrets: configSecrets(config),
    bufferLimitBytes: config.logBufferLimitBytes,
  })
  logProcessWarnings(logger)
  if (config.localSecretsFile) {
    logger.info({ file: config.localSecretsFile }, 'local mode: generated secrets are kept in this file')
  }
  const unread = unreadEnvFile(process.cwd(), process.env)
  if (unread) logger.warn({ file: unread.file, notSet: unread.names }, UNREAD_ENV_FILE_MESSAGE)
  // a misspelled name is otherwise ignored without a word (FORWARD_EVENT forwarded every type); by name, never by value
  for (const unreadVariable of config.unreadVariables) {
    const { name, nearest } = unreadVariable
    logger.warn({ variable: name, ...(nearest && { didYouMean: nearest }) }, unreadVariableMessage(unreadVariable))
  }
  const embedded = embeddedDatabaseWarning(config)
  if (embedded) logger.warn({ dataDir: config.dataDir }, embedded)

  // set once started; a signal during the first start (PGlite's initdb) exits without it
  const running: { service?: RunningService } = {}
  let stopping = false
  const exitAtOnce = (signal: StopSignal) => {
    logger.warn({ signal }, 'second signal: exiting without waiting')
    exitProcess(logger, 130)
  }
  const stop = async (signal: StopSignal) => {
    // a failed start is already stopping: a signal then is a second one
    if (stopping) exitAtOnce(signal)
    stopping = true
    // the drain delay (SHUTDOWN_DRAIN_DELAY_MS, /readyz answering 503 while the service still serves) comes
    // before the bound on stopping
    const boundMs = config.shutdownDrainDelayMs + config.shutdownTimeoutMs
    const deadline = Date.now() + boundMs
    // the bound holds even if a part never stops (or is still starting); unref'd, it keeps nothing alive. Its
    // last tenth (a second at most) is for writing out the line that says why the exit is 1.
    const lineMs = Math.min(1_000, boundMs / 10)
    setTimeout(() => {
      logger.error({ timeoutMs: boundMs, waitingFor: running.service?.stillStopping() ?? [] }, 'shutdown did not finish in time: exiting')
      void flushLogger(logger, lineMs).then(() => exitProcess(logger, 1))
    }, boundMs - lineMs).unref()
    logger.info({ signal }, 'shutting down')
    let code = 0
    try {
      await running.service?.stop({ drainDelayMs: config.shutdownDrainDelayMs })
      logger.info('stopped')
    } catch (error) {
      logger.error({ err: error }, 'shutdown failed')
      code = 1
    }
    await flushLogger(logger, Math.max(0, deadline - Date.now()))
    exitProcess(logger, code)
  }
  // registered before the (possibly long) first start, so Ctrl-C during it is honoured too
  let stopped: Promise<void> | undefined
  onStopSignals((signal) => void (stopped = stop(signal)), exitAtOnce)

  const service = await startService({ config, logger, runCommand, registerReactions })
  running.service = service
  // an unreachable database is waited for (prepare-database.ts); what waiting cannot fix ends the process
  try {
    await service.ready
  } catch (error) {
    // a signal during the start: its stop ends the process (returning would let the CLI exit before it is done)
    if (stopping) {
      await stopped
      return
    }
    stopping = true
    logger.error({ err: startUpFailure(error) }, 'start-up failed')
    await service.stop()
    await flushLogger(logger, config.shutdownTimeoutMs)
    exitProcess(logger, 1)
  }
  if (service.sandboxUrl)
    process.stdout.write(
      localModeBanner(config, service.url, service.sandboxUrl, service.adminUrl, {
        terminal: process.stdout.isTTY === true,
        cli: cliInvocation(process.argv[1]),
      }),
    )
}

/**
 * What the `start-up failed` line says about `error`. A refusal (a database a newer build migrated, a search_path in front
 * of the service's tables: the operator's to fix) is its code and message, as `migrate` prints it: its stack trace
 * read as a crash of the code's. A database's report is its classification (loggableError); anything else, a
 * fault, keeps its stack.
 */
function startUpFailure(error: unknown): unknown {
  const loggable = loggableError(error)
  if (loggable instanceof Error && error instanceof MigrationError && error.refused) return { code: error.failure, message: error.message }
  return loggable
}

/** What a newcomer sees after `npm start`: where things are and what to type next (README quick start). */
export function localModeBanner(
  config: Config,
  url: string,
  sandboxUrl: string,
  adminUrl: string,
  /** Whether stdout is a terminal: only there is the console's token printed whole. */
  { terminal, cli: invocation = NPM_CLI }: { terminal: boolean; cli?: string },
): string {
  const seller = config.partner.kind === 'marketplace' ? ' --seller seller-1' : ''
  // Another terminal finds this service by DATA_DIR/serve.json, DATA_DIR being ./data unless set: without the
  // service's own, the commands would open (or create) a database of their own. Whole, so that it holds from
  // any working directory. `npm run cli` runs in the checkout, where ./data is the service's; the compiled CLI runs
  // where it is typed, so its commands always name it (typed elsewhere, they made a new database and blamed the
  // platform)
  const cli = `${dataDirFor(config.dataDir, invocation !== NPM_CLI)}${invocation}`
  const database = config.databaseUrl ? 'Postgres' : `embedded PGlite in ${config.dataDir}`
  return [
    '',
    'partner-escrow is running in LOCAL SANDBOX MODE: no platform is configured, a simulated one runs here.',
    `  receiver  ${reachableUrl(url)}${config.webhook.path}   (${database})`,
    `  sandbox   ${sandboxUrl}/api/partner/v1/   (the platform: signed API and webhooks)`,
    ...(config.metrics.enabled ? [`  metrics   ${reachableUrl(adminUrl)}${config.metrics.path}   (operator listener)`] : []),
    ...(config.adminToken
      ? [`  console   ${reachableUrl(adminUrl)}/console/   (${terminal ? `log in with the admin token: ${config.adminToken}` : adminTokenWhere(config)})`]
      : []),
    '',
    'Try next, in another terminal:',
    `  ${cli} orders create --external-reference order-1`,
    `  ${cli} trades open order-1 --title "First trade" --amount 25.00 --currency EUR${seller}`,
    `  ${cli} orders show order-1`,
    `Or watch a whole run with lost and repeated webhooks: ${invocation === NPM_CLI ? 'npm run demo' : `${invocation} demo`}`,
    '',
  ].join('\n')
}

const NPM_CLI = 'npm run cli --'

/**
 * How another terminal runs this CLI: `npm run cli --` under `npm start` (TypeScript through tsx), or the compiled
 * file this process runs, by its whole path. The image has no tsx (dev dependencies are left out), so there the
 * banner's `npm run cli -- …` failed with ERR_MODULE_NOT_FOUND.
 */
export function cliInvocation(script: string | undefined): string {
  return script?.endsWith('.js') ? `node ${quoteForShell(path.resolve(script))}` : NPM_CLI
}

/**
 * A listener bound to every interface (0.0.0.0, ::) by an address a person on this machine can open: the
 * banner printed http://0.0.0.0:3000, which is no address to go to.
 */
export function reachableUrl(url: string): string {
  const parsed = new URL(url)
  if (parsed.hostname === '0.0.0.0') parsed.hostname = '127.0.0.1'
  else if (parsed.hostname === '[::]') parsed.hostname = '[::1]'
  else return url
  return parsed.toString().replace(/\/$/, '')
}

// Piped or redirected (`npm start > service.log`), the banner is kept where a secret has no place: it says where
// the token is instead of printing it.
function adminTokenWhere(config: Config): string {
  switch (config.adminTokenFrom) {
    case 'ADMIN_TOKEN':
      return 'log in with ADMIN_TOKEN'
    case 'local-secrets':
      return `log in with the admin token: adminToken in ${config.localSecretsFile}`
    default:
      return "this run's admin token is printed on a terminal only: set ADMIN_TOKEN to log in"
  }
}

// `DATA_DIR=... ` before a command, or nothing for the default (an in-memory database has no serve.json)
function dataDirFor(dataDir: string, evenTheDefault: boolean): string {
  if (dataDir.startsWith('memory://') || (!evenTheDefault && dataDir === path.resolve(DEFAULT_DATA_DIR))) return ''
  return `DATA_DIR=${quoteForShell(dataDir)} `
}
