// How a second terminal finds the running service, the same way in every mode. Every `serve` writes
// DATA_DIR/serve.json (mode 0600): its pid, the URL and a random token of its command endpoint, where its
// receiver and sandbox listen, and which database it uses (the kind and a non-secret fingerprint: host,
// port and database name, never the user or password). A CLI command that needs the database is run by
// that service, against its own database (embedded PGlite belongs to one process; on Postgres this spares
// the second terminal the service's environment). A CLI whose DATABASE_URL names another database than the
// running service's is refused: that is the "wrong database" a second terminal must never write to.
//
// Neither the file nor the answer is trusted: whoever can write DATA_DIR, or listen on the port the file names,
// may not be the service. A file that is not a service's is ignored (readServiceFile), an answer is read up to a
// bound (MAX_RESULT_BYTES) and one that is not a command's result is refused (commandResult), a redirect is not
// followed, and what the command printed reaches the terminal with its controls shown as \uXXXX (printableLines).
import { constants } from 'node:buffer'
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { isIP } from 'node:net'
import { networkInterfaces, userInfo } from 'node:os'
import path from 'node:path'
import type { Config, PartnerPlatform } from '../config.js'
import { isLoopbackAddress } from '../http/loopback-host.js'
import { isJsonObject, parseJsonObject } from '../json-object.js'
import { commandTookEffect, type TookEffect } from '../output-gone.js'
import { printable, printableLines } from '../printable.js'
import { shortened } from '../shortened.js'
import { stopOnSignals } from '../stop-signals.js'
import { postToService, type ServiceAnswer, ServiceRequestError } from './service-request.js'

/** Commands that need the database; the rest (serve, sandbox, demo, webhook, help) run where typed. */
export const FORWARDED_COMMANDS = new Set([
  'orders',
  'deliveries',
  'trades',
  'disputes',
  'proposals',
  'reconcile',
  'migrate',
  'reactions',
  'prune',
])
export const LOCAL_CLI_PATH = '/_local/cli'
/**
 * A command line's result: its exit code and output, and whether its change was made (a trade call answered), so a
 * second terminal whose own output fails does not report a done command as failed.
 */
export interface CommandOutput {
  code: number
  stdout: string
  stderr: string
  tookEffect?: true
  /** With tookEffect: what was done and where to see it (a service of an older build sends none: a trade call's). */
  effect?: TookEffect
}

/**
 * Set on the command endpoint's answer once the command has begun to run (local-cli.ts): an answer other than its
 * result then says nothing of what it did (the service stopping answers 503 `not_ready` to what it could not finish).
 */
export const COMMAND_STARTED_HEADER = 'X-Command-Started'

/**
 * The largest request for a command line the service takes, in bytes (local-cli.ts). A forwarded command's whole
 * input is its arguments (none reads a file or stdin), and the kernel bounds them: Linux gives a new process at most
 * 6 MiB of arguments and environment together, whatever its stack limit (3/4 of _STK_LIM since 4.13; Node 20 needs
 * 4.18), and macOS (1 MiB) and Windows (32,767 characters) less. JSON writes a byte as 6 at most (a control as
 * \u0001), and an argument's quotes and comma as 3, fewer than the 9 the kernel counted for it (its NUL and pointer):
 * no command line a process can be given is past this bound, the request's braces included. The service refused
 * anything past 64 KiB, which one long argument is, where the same command run with no service ran.
 */
export const MAX_COMMAND_REQUEST_BYTES = 6 * 6 * 1024 * 1024 + 1024

/** How the service refuses a command it does not run (local-cli.ts); every build since forwarding began says so. */
export const COMMANDS_TAKEN_PREFIX = 'args must be a command line starting with one of: '

/**
 * The commands a service's 400 answer says it runs, or, for any other answer, every command forwarded (the
 * refusal was not about the command).
 */
function commandsTakenBy(answer: string): ReadonlySet<string> {
  try {
    const message = (JSON.parse(answer) as { error?: { message?: unknown } }).error?.message
    if (typeof message === 'string' && message.startsWith(COMMANDS_TAKEN_PREFIX)) {
      return new Set(message.slice(COMMANDS_TAKEN_PREFIX.length).split(', '))
    }
  } catch {
    // not the error shape
  }
  return FORWARDED_COMMANDS
}

export interface ServiceFile {
  pid: number
  /** The public listener (webhooks, health). */
  url: string
  /** The operator listener, where the command endpoint (LOCAL_CLI_PATH) is served. */
  adminUrl: string
  token: string
  /** The receiver's webhook URL, the default of `webhook send`. */
  webhookUrl: string
  /** Local mode: the in-process sandbox platform. */
  sandboxUrl?: string | undefined
  /** Local mode (its secrets in DATA_DIR/local-secrets.json) or remote (its own, from its environment); not in a file of a build before 2026-12-02. */
  mode?: 'local' | 'remote' | undefined
  database: DatabaseIdentity
  /** The platform its partner API calls go to (PARTNER_ENV, the base URL, the key id; no secret); not in a file of a build before 2026-12-04. */
  platform?: ServicePlatform | undefined
}

export interface ServicePlatform {
  env: string
  baseUrl: string
  keyId: string
}

export interface DatabaseIdentity {
  kind: 'postgres' | 'pglite'
  /** Postgres: host:port/database (no credentials); PGlite: the data directory. */
  location: string
  /** Postgres: the role it connects as (the URL's user, else PGUSER, else the OS user's name, as node-postgres). */
  user?: string
}

const UNPARSABLE_DATABASE_URL = '(unparsable DATABASE_URL)'

/** Which database a config points at, in words safe to print and to store. */
export function databaseIdentity(config: Pick<Config, 'databaseUrl' | 'dataDir'>): DatabaseIdentity {
  if (!config.databaseUrl) return { kind: 'pglite', location: config.dataDir }
  try {
    const url = new URL(config.databaseUrl)
    const database = decodeURIComponent(url.pathname.replace(/^\//, '')) || '(default database)'
    const user = decodeURIComponent(url.username) || process.env.PGUSER || userInfo().username
    return { kind: 'postgres', location: `${url.hostname}:${url.port || '5432'}/${database}`, user }
  } catch {
    return { kind: 'postgres', location: UNPARSABLE_DATABASE_URL }
  }
}

// the names of this machine's loopback address: a service whose DATABASE_URL says 127.0.0.1 and a command's that says
// localhost name the same server, and the command was refused as naming another database ([wrong_database])
const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]'])

/**
 * Whether two databases' locations name the same one: Postgres's `host:port/database`, a loopback name being any
 * other; an embedded database's directory, as it is.
 */
export function sameLocation(a: string, b: string): boolean {
  const loopback = (location: string) => {
    const split = /^(\[[^\]]*\]|[^:]*)(:.*)$/.exec(location)
    return split && LOOPBACK.has(split[1]!.toLowerCase()) ? `localhost${split[2]!}` : location
  }
  return loopback(a) === loopback(b)
}

function describe(identity: DatabaseIdentity): string {
  return identity.kind === 'pglite' ? `embedded PGlite in ${identity.location}` : `Postgres ${identity.location}`
}

function serviceFilePath(dataDir: string): string {
  return path.join(dataDir, 'serve.json')
}


/**
 * Writes serve.json for the running service; `remove` takes it away again. Another live service that advertises
 * from this DATA_DIR (a second replica on one host, on Postgres) keeps its file: `other` names it and nothing is
 * written. Two used to overwrite each other's, and the first to stop removed the file of the one still running.
 */
export async function advertiseLocalService(
  dataDir: string,
  service: Omit<ServiceFile, 'pid'>,
): Promise<{ remove: () => void; other?: number }> {
  // a file whose pid now belongs to another process (a container restarted, the pid given again) is no service's
  const other = findRunningService(dataDir)
  if (other && (await answersHealth(other.url))) return { remove: () => {}, other: other.pid }
  const file = serviceFilePath(dataDir)
  const contents: ServiceFile = { pid: process.pid, ...service }
  mkdirSync(dataDir, { recursive: true })
  // written aside and renamed into place: a command reading the file as it is written sees the whole file or none,
  // never a truncated one that it would take for a file that is not a service's
  const written = `${file}.${process.pid}.tmp`
  writeFileSync(written, `${JSON.stringify(contents)}\n`, { mode: 0o600 })
  renameSync(written, file)
  const remove = () => {
    // only its own: another service may have written it since (this one's was removed by hand)
    try {
      if ((JSON.parse(readFileSync(file, 'utf8')) as ServiceFile).pid !== process.pid) return
    } catch {
      return
    }
    rmSync(file, { force: true })
  }
  // and on any exit: a stop that ran past its bound (a reaction handler that ignores its abort) exited 1 and left the
  // file naming a dead process
  process.once('exit', remove)
  return {
    remove: () => {
      process.off('exit', remove)
      remove()
    },
  }
}

// whether a service answers /healthz at `url` within a second
async function answersHealth(url: string): Promise<boolean> {
  try {
    return (await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(1_000) })).ok
  } catch {
    return false
  }
}

/**
 * The service running from this DATA_DIR, if any. A serve.json whose process is gone is ignored, and so is one
 * naming this process: a dead service's pid given to this one (a container's pid 1 after a crash). So is a file
 * that is not a service's (readServiceFile).
 */
export function findRunningService(dataDir: string): ServiceFile | undefined {
  return readServiceFile(dataDir).service
}

// the largest process id (pid_t is a 32-bit int; Linux's pid_max is 2^22 at most)
const MAX_PID = 2 ** 31 - 1
// RFC 6750's b64token: what an Authorization header can carry as it is (the service writes 64 hex digits)
const BEARER_TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/

/**
 * What DATA_DIR/serve.json says: the running service; nothing (no file, or its process is gone); or `problem`, a
 * file that is not a service's, in fixed words (what the file holds is not repeated: it need not be printable).
 *
 * A file that is not a service's is ignored as if absent, and the command runs in its own process. That is safe:
 * a service that wrote the file holds the embedded database's lock (DATA_DIR/pglite/partner-escrow.lock, taken in
 * db/open-database.ts when the service opens it, before serve.json is written, and let go after the file is
 * removed), so a command that then opens PGlite itself is refused, `in use by process N`, and never writes to it
 * beside the service; on Postgres it runs as it would with no service running.
 */
function readServiceFile(dataDir: string): { service?: ServiceFile; problem?: string } {
  if (dataDir.startsWith('memory://')) return {}
  let text: string
  try {
    text = readFileSync(serviceFilePath(dataDir), 'utf8')
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    return code === 'ENOENT' || code === 'ENOTDIR' ? {} : { problem: `it cannot be read: ${code ?? 'error'}` }
  }
  const file = parseJsonObject(text)
  if (typeof file === 'string') return { problem: `it is ${file}` }
  // 0 and below name process groups, not a process: process.kill(0, 0) succeeds whatever runs. 1 is a service's
  // pid in a container (the image runs `node dist/src/cli.js serve` as its first process)
  const { pid } = file
  if (typeof pid !== 'number' || !Number.isInteger(pid) || pid < 1 || pid > MAX_PID) {
    return { problem: 'its pid is not a process id' }
  }
  // a file left by a process that is gone is a service's that stopped without removing it (killed, a crash)
  if (pid === process.pid || !processRuns(pid)) return {}
  const problem = serviceFileProblem(file)
  return problem ? { problem } : { service: file as unknown as ServiceFile }
}

function processRuns(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

// what in a file with a live pid is not as a service writes it (advertiseLocalService), in fixed words
function serviceFileProblem(file: Record<string, unknown>): string | undefined {
  for (const name of ['url', 'adminUrl'] as const) {
    if (!isServiceUrl(file[name], { withPath: false })) return `its ${name} is not an http URL of this machine`
  }
  if (!isServiceUrl(file.webhookUrl, { withPath: true })) return 'its webhookUrl is not an http URL of this machine'
  if (file.sandboxUrl !== undefined && !isServiceUrl(file.sandboxUrl, { withPath: false })) {
    return 'its sandboxUrl is not an http URL of this machine'
  }
  if (typeof file.token !== 'string' || !BEARER_TOKEN.test(file.token)) return 'its token is not a bearer token'
  if (file.mode !== undefined && file.mode !== 'local' && file.mode !== 'remote') return 'its mode is neither local nor remote'
  const { database } = file
  if (
    !isJsonObject(database) ||
    (database.kind !== 'postgres' && database.kind !== 'pglite') ||
    typeof database.location !== 'string' ||
    (database.user !== undefined && typeof database.user !== 'string')
  ) {
    return 'its database is not a kind and a location'
  }
  const { platform } = file
  if (platform !== undefined && !(isJsonObject(platform) && ['env', 'baseUrl', 'keyId'].every((name) => typeof platform[name] === 'string'))) {
    return 'its platform is not an env, a base URL and a key id'
  }
  return undefined
}

/**
 * Whether `value` is a URL a service on this machine writes: http (https for a fork that added TLS), no credentials,
 * query or fragment, a path only where one is expected, and its host an address of this machine. The service writes
 * the address its listener is bound to (http/server.ts): loopback by default, but ADMIN_HOST and HOST may bind
 * 0.0.0.0, :: or one interface's address (README, "The operator console under compose"); never a name.
 */
function isServiceUrl(value: unknown, { withPath }: { withPath: boolean }): boolean {
  if (typeof value !== 'string') return false
  let url: URL
  try {
    url = new URL(value)
  } catch {
    return false
  }
  return (
    (url.protocol === 'http:' || url.protocol === 'https:') &&
    url.username === '' &&
    url.password === '' &&
    url.search === '' &&
    url.hash === '' &&
    (withPath || url.pathname === '/') &&
    isAddressOfThisMachine(url.hostname.replace(/^\[(.*)\]$/, '$1'))
  )
}

// an IP address that a listener of this machine can be bound to: loopback, any, or one of its interfaces'
function isAddressOfThisMachine(address: string): boolean {
  if (isIP(address) === 0) return false
  if (isLoopbackAddress(address) || address === '0.0.0.0' || address === '::') return true
  // both written as the URL parser writes them (IPv6 compressed and in lower case, as Node writes its own)
  const written = canonicalAddress(address)
  return Object.values(networkInterfaces()).some((entries) => entries?.some((entry) => canonicalAddress(entry.address) === written))
}

function canonicalAddress(address: string): string {
  try {
    return new URL(`http://${isIP(address) === 6 ? `[${address}]` : address}/`).hostname
  } catch {
    return address
  }
}

/**
 * The running service cannot run the command, or its result cannot be shown: its message ends in our code in
 * brackets. `exitCode` 2 for a configuration that does not match the service's (wrong_database), 1 for a service
 * that does not answer or answers with something else than a result, 130 for a stop signal while waiting.
 */
export class RunningServiceError extends Error {
  override name = 'RunningServiceError'
  constructor(
    message: string,
    readonly exitCode: 1 | 2 | 130 = 2,
  ) {
    super(message)
  }
}

// the settings a command reads that an operator may set for one run (`RETENTION_DAYS=7 prune`): beside a running
// service the service's own are used, and that is said
const SETTINGS_OF_COMMAND: Record<string, readonly string[]> = {
  prune: ['RETENTION_DAYS', 'DELIVERY_RETENTION_DAYS', 'PRUNE_BATCH_SIZE'],
}
// the commands that call the platform: `PARTNER_ENV=live trades fund …` beside a service on the sandbox funded on the
// sandbox with the service's key, saying nothing (and the other way round, on live)
const PLATFORM_COMMANDS = new Set(['trades', 'disputes', 'proposals', 'reconcile'])

/**
 * The platform settings of this environment that name another platform or key than the service's: PARTNER_ENV, and
 * the base URL and key id of the pair it picks, each only where set here. None for a service file of an older build.
 */
function otherPlatformSettings(platform: ServicePlatform | undefined, mine: PartnerPlatform): string[] {
  if (!platform) return []
  const differing: string[] = []
  if (mine.env !== undefined && mine.env !== platform.env) differing.push('PARTNER_ENV')
  const withoutClosingSlash = (url: string) => url.replace(/\/+$/, '')
  if (mine.baseUrl && withoutClosingSlash(mine.baseUrl.value) !== withoutClosingSlash(platform.baseUrl)) differing.push(mine.baseUrl.name)
  if (mine.keyId && mine.keyId.value !== platform.keyId) differing.push(mine.keyId.name)
  return differing
}

// the most of a refusing service's answer printed: its own error body, a line or two
const MAX_REFUSAL_SHOWN = 500
// the most of a refusing service's answer read: many times what is printed, and the service's own is far smaller
const MAX_REFUSAL_BYTES = 64 * 1024

/**
 * The most of a command's result read, in bytes: the longest string this runtime holds (MAX_STRING_LENGTH, 2^29 - 24
 * UTF-16 units on 64-bit, about 512 MiB). The service caps no command's output (local-cli.ts), but it sends the result
 * as one string (res.json), which cannot be longer: no real answer in one-byte characters is refused here. And up to
 * this many bytes the answer can always be decoded here into one string (a byte never decodes to more than one unit),
 * where more would fail past the bound instead of at it. Only a result longer than that in mostly non-ASCII text,
 * half a gigabyte that no command prints (a listing stops at 10,000 rows), would pass the service and be refused here.
 */
const MAX_RESULT_BYTES = constants.MAX_STRING_LENGTH

/**
 * The command side: when the command needs the database and a service runs from DATA_DIR, ask that service
 * to run it. Returns the exit code, or undefined to run the command here (no service running).
 */
export async function forwardToLocalService(args: string[]): Promise<number | undefined> {
  if (!FORWARDED_COMMANDS.has(args[0] ?? '') || args.includes('--help') || args.includes('-h'))
    return undefined
  // loaded only for a command that may be forwarded: `--help` does not pay for it. Only DATA_DIR and DATABASE_URL
  // are read: the service runs the command with its own configuration (environment.ts, runningServiceLookup)
  const { partnerPlatformOf, runningServiceLookup } = await import('../environment.js')
  let config: ReturnType<typeof runningServiceLookup>
  try {
    config = runningServiceLookup(process.env)
  } catch (error) {
    // a DATABASE_URL_FILE that cannot be read: the command runs here, and its own configuration refuses it (exit 2)
    if (error instanceof Error && error.name === 'ConfigError') return undefined
    throw error
  }
  const { service, problem } = readServiceFile(config.dataDir)
  if (problem) {
    // said, since the command then runs here: beside a service on PGlite it is refused as the database's owner's
    process.stderr.write(
      `Ignored ${serviceFilePath(config.dataDir)}: it is not a running service's file (${problem}); ` +
        'the command runs in this process [service_file_ignored]\n',
    )
  }
  if (!service) return undefined
  const mine = databaseIdentity(config)
  // a DATABASE_URL that cannot be read is refused, naming the problem, by the command's own configuration
  if (config.databaseUrl && mine.location === UNPARSABLE_DATABASE_URL) return undefined
  const matches = service.database.kind === mine.kind && sameLocation(service.database.location, mine.location)
  // the service's database as another role (a DBA's, a read-only one): run here, with that role's rights; the
  // service would run it with its own. A service file of an older build names no role.
  if (config.databaseUrl && matches && service.database.user !== undefined && service.database.user !== mine.user) return undefined
  if (config.databaseUrl && !matches) {
    throw new RunningServiceError(
      `The service running from ${config.dataDir} (pid ${service.pid}) uses ` +
        `${describe(service.database)}, but DATABASE_URL here names ${describe(mine)}. ` +
        'Unset DATABASE_URL to run the command in the running service, or set DATA_DIR to another directory. ' +
        '[wrong_database]',
    )
  }
  const running = `The service running from ${config.dataDir} (pid ${service.pid})`
  const ignored = [
    ...(SETTINGS_OF_COMMAND[args[0] ?? ''] ?? []).filter((name) => process.env[name] !== undefined),
    ...(PLATFORM_COMMANDS.has(args[0] ?? '') ? otherPlatformSettings(service.platform, partnerPlatformOf(process.env)) : []),
  ]
  if (ignored.length > 0) {
    // `RETENTION_DAYS=7 prune` beside a service pruned with the service's 30 days, saying nothing
    const these = `${ignored.join(', ')} ${ignored.length === 1 ? 'is' : 'are'}`
    process.stderr.write(`${running} runs the command with its own settings: ${these} set here and not used [settings_ignored]\n`)
  }
  // No time limit: the service may rightly take long (prune, reconcile). A stop signal (Ctrl-C) ends the wait
  // instead; the service runs the command to its end all the same (it is not told), and a second signal ends
  // this process at once
  const stop = new AbortController()
  const off = stopOnSignals(() => stop.abort())
  let response: ServiceAnswer
  let answer: string | undefined
  try {
    try {
      // (never following a redirect: one followed would send the command line again, wherever it said)
      response = await postToService(new URL(LOCAL_CLI_PATH, service.adminUrl), JSON.stringify({ args }), { authorization: `Bearer ${service.token}` }, stop.signal)
    } catch (error) {
      if (stop.signal.aborted) throw stoppedWaiting(config.dataDir, service)
      if (!(error instanceof ServiceRequestError)) throw error
      // once connected, the command may have been sent whatever came next (a reset, an answer that is not HTTP)
      if (error.connected) {
        // the connection was made and the command sent: a service that died while it ran it (30,000 of 200,002 orders
        // requeued) was reported as one that does not answer, as if the command had not been taken
        throw new RunningServiceError(
          `${running} took \`${printable(shortened(args.slice(0, 2).join(' '), 100))}\` and the connection to it was lost ` +
            `before its result (${failureReason(error)}): the command may have run there in part or whole, its outcome is ` +
            'unknown. Check what it would have changed (`orders show`, `trades get`) before running it again [outcome_unknown]',
          1,
        )
      }
      throw new RunningServiceError(
        `${running} does not answer at ${service.adminUrl} (${failureReason(error)}). ` +
          'Try again once it is up, or stop it. [service_unreachable]',
        1,
      )
    }
    try {
      // bounded: whatever listens on that port may answer without end
      answer = await response.text(ok(response) ? MAX_RESULT_BYTES : MAX_REFUSAL_BYTES)
    } catch (error) {
      if (stop.signal.aborted) throw stoppedWaiting(config.dataDir, service)
      throw new RunningServiceError(
        `${running} cut its answer to the command short (${failureReason(error)}); the command may have run there [service_bad_answer]`,
        1,
      )
    }
  } finally {
    off()
  }
  if (!ok(response)) {
    const command = args[0] ?? ''
    if (response.status === 400 && answer !== undefined && !commandsTakenBy(answer).has(command)) {
      // a service started from an older build than this CLI's: its list of commands predates this one
      process.stderr.write(
        `${running} is older than this CLI and does not run ` +
          `\`${command}\`. Restart it with this build, or stop it and run the command alone. [service_too_old]\n`,
      )
      return 1
    }
    if (response.header(COMMAND_STARTED_HEADER) === 'true') {
      // a trade command the service stopped in its call was told to retry, and the operation was sent twice
      process.stderr.write(
        `${running} had begun to run \`${printable(args.slice(0, 2).join(' '))}\` and answered ${response.status}, not its result: ` +
          `it may or may not have taken effect (${printable(shortened(answer ?? '', MAX_REFUSAL_SHOWN))}). Check what it would ` +
          'have changed (`orders show`, `trades get`) before running it again [outcome_unknown]\n',
      )
      return 1
    }
    const location = response.header('location')
    const status =
      response.status >= 300 && response.status < 400
        ? `${response.status}, a redirect${location === undefined ? '' : ` to ${printable(shortened(location, MAX_REFUSAL_SHOWN))}`}, not followed`
        : String(response.status)
    // (on one line and visible: whatever answers on that port may not be the service)
    const shown =
      answer === undefined ? `(an answer larger than ${MAX_REFUSAL_BYTES.toLocaleString('en-US')} bytes, not read)` : printable(shortened(answer, MAX_REFUSAL_SHOWN))
    process.stderr.write(`The running service refused the command (${status}): ${shown} [service_refused]\n`)
    return 1
  }
  if (answer === undefined) {
    throw new RunningServiceError(
      `${running} answered the command with more than ${MAX_RESULT_BYTES.toLocaleString('en-US')} bytes, the most this CLI reads; ` +
        'the rest was not read, and the command may have run there [service_bad_answer]',
      1,
    )
  }
  const result = commandResult(answer)
  if ('problem' in result) {
    throw new RunningServiceError(`${running} answered the command with something that is not its result (${result.problem}) [service_bad_answer]`, 1)
  }
  // a done command whose output cannot be written here is no failure of it (output-gone.ts)
  if (result.tookEffect) commandTookEffect(result.effect)
  // laid out in lines as the command printed them, its controls shown. A JSON document stays the same document:
  // JSON.stringify escapes the C0 controls itself, and what it leaves in a string (DEL, C1, the Cf characters)
  // becomes \uXXXX, JSON for the same character
  process.stdout.write(printableLines(result.stdout))
  process.stderr.write(printableLines(result.stderr))
  return result.code
}

function stoppedWaiting(dataDir: string, service: ServiceFile): RunningServiceError {
  return new RunningServiceError(
    `Stopped waiting for the command's result: the service running from ${dataDir} (pid ${service.pid}) ` +
      'may still run it to its end, without showing its output here [stopped_waiting]',
    130,
  )
}

const ok = (response: ServiceAnswer) => response.status >= 200 && response.status < 300

// the innermost reason a request failed, as Node says it (ECONNREFUSED, ECONNRESET), on one line
function failureReason(error: unknown): string {
  return printable(error instanceof ServiceRequestError ? error.code : String((error as Error).message ?? error))
}

/**
 * The command's result from the service's answer: what local-cli.ts sends, `runCommand`'s `{code, stdout,
 * stderr, tookEffect?}` as JSON; a field a newer service may add is ignored. Anything else is `problem`, in fixed words.
 */
function commandResult(answer: string): CommandOutput | { problem: string } {
  const result = parseJsonObject(answer)
  if (typeof result === 'string') return { problem: result }
  const { code, stdout, stderr, tookEffect, effect } = result
  if (typeof code !== 'number' || !Number.isInteger(code) || code < 0 || code > 255) return { problem: 'no exit code from 0 to 255' }
  if (typeof stdout !== 'string' || typeof stderr !== 'string') return { problem: 'no stdout and stderr as text' }
  if (tookEffect !== true) return { code, stdout, stderr }
  // said on this terminal, its controls shown and bounded: whatever answers on that port may not be the service
  const told =
    isJsonObject(effect) && typeof effect.done === 'string' && typeof effect.see === 'string'
      ? { effect: { done: printable(shortened(effect.done, 200)), see: printable(shortened(effect.see, 200)) } }
      : {}
  return { code, stdout, stderr, tookEffect, ...told }
}
