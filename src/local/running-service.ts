// How a second terminal finds the running service, the same way in every mode. Every `serve` writes
// DATA_DIR/serve.json (mode 0600): its pid, the URL and a random token of its command endpoint, where its
// receiver and sandbox listen, and which database it uses (the kind and a non-secret fingerprint: host,
// port and database name, never the user or password). A CLI command that needs the database is run by
// that service, against its own database (embedded PGlite belongs to one process; on Postgres this spares
// the second terminal the service's environment). A CLI whose DATABASE_URL names another database than the
// running service's is refused: that is the "wrong database" a second terminal must never write to.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { userInfo } from 'node:os'
import path from 'node:path'
import type { Config } from '../config.js'
import { printable } from '../printable.js'
import { shortened } from '../shortened.js'

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
  writeFileSync(file, `${JSON.stringify(contents)}\n`, { mode: 0o600 })
  return {
    remove: () => {
      // only its own: another service may have written it since (this one's was removed by hand)
      try {
        if ((JSON.parse(readFileSync(file, 'utf8')) as ServiceFile).pid !== process.pid) return
      } catch {
        return
      }
      rmSync(file, { force: true })
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
 * naming this process: a dead service's pid given to this one (a container's pid 1 after a crash).
 */
export function findRunningService(dataDir: string): ServiceFile | undefined {
  if (dataDir.startsWith('memory://')) return undefined
  try {
    const service = JSON.parse(readFileSync(serviceFilePath(dataDir), 'utf8')) as ServiceFile
    if (service.pid === process.pid) return undefined
    process.kill(service.pid, 0)
    return service
  } catch {
    return undefined
  }
}

/** The CLI cannot use the running service (another database named, or it does not answer): nothing is run. */
/**
 * The running service cannot run the command: its message ends in our code in brackets. `exitCode` 2 for a
 * configuration that does not match the service's (wrong_database), 1 for a service that does not answer.
 */
export class RunningServiceError extends Error {
  override name = 'RunningServiceError'
  constructor(
    message: string,
    readonly exitCode: 1 | 2 = 2,
  ) {
    super(message)
  }
}

// the most of a refusing service's answer printed: its own error body, a line or two
const MAX_REFUSAL_SHOWN = 500

/**
 * The command side: when the command needs the database and a service runs from DATA_DIR, ask that service
 * to run it. Returns the exit code, or undefined to run the command here (no service running).
 */
export async function forwardToLocalService(args: string[]): Promise<number | undefined> {
  if (!FORWARDED_COMMANDS.has(args[0] ?? '') || args.includes('--help') || args.includes('-h'))
    return undefined
  // loaded only for a command that may be forwarded: `--help` does not pay for it. Only DATA_DIR and DATABASE_URL
  // are read: the service runs the command with its own configuration (config.ts, runningServiceLookup)
  const { runningServiceLookup } = await import('../config.js')
  const config = runningServiceLookup(process.env)
  const service = findRunningService(config.dataDir)
  if (!service) return undefined
  const mine = databaseIdentity(config)
  // a DATABASE_URL that cannot be read is refused, naming the problem, by the command's own configuration
  if (config.databaseUrl && mine.location === UNPARSABLE_DATABASE_URL) return undefined
  const matches = service.database.kind === mine.kind && service.database.location === mine.location
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
  let response: Response
  try {
    response = await fetch(`${service.adminUrl}${LOCAL_CLI_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${service.token}` },
      body: JSON.stringify({ args }),
    })
  } catch (error) {
    throw new RunningServiceError(
      `The service running from ${config.dataDir} (pid ${service.pid}) does not answer at ` +
        `${service.adminUrl} (${(error as Error & { cause?: { code?: string } }).cause?.code ?? (error as Error).message}). ` +
        'Try again once it is up, or stop it. [service_unreachable]',
      1,
    )
  }
  if (!response.ok) {
    const answer = await response.text()
    const command = args[0] ?? ''
    if (response.status === 400 && !commandsTakenBy(answer).has(command)) {
      // a service started from an older build than this CLI's: its list of commands predates this one
      process.stderr.write(
        `The service running from ${config.dataDir} (pid ${service.pid}) is older than this CLI and does not run ` +
          `\`${command}\`. Restart it with this build, or stop it and run the command alone. [service_too_old]\n`,
      )
      return 1
    }
    // (on one line and visible: whatever answers on that port may not be the service)
    process.stderr.write(`The running service refused the command (${response.status}): ${printable(shortened(answer, MAX_REFUSAL_SHOWN))} [service_refused]\n`)
    return 1
  }
  const result = (await response.json()) as { code: number; stdout: string; stderr: string }
  process.stdout.write(result.stdout)
  process.stderr.write(result.stderr)
  return result.code
}
