// The environment read without the configuration's schema (config.ts): what a command needs to find the service
// running from its DATA_DIR and forward itself there (runningServiceLookup, partnerPlatformOf), and the readings of
// single variables that config.ts shares. Kept apart so that a forwarded command does not load config.ts, whose
// schema and the modules it names cost a command's start 310 ms of CPU (`import('dist/src/config.js')` against
// an empty import, 2026-12-07); this module loads only what reading a secret file needs.
import path from 'node:path'
import { ConfigError } from './config-error.js'
import { readSecretFile, type SecretFileRead, secretsFromFiles } from './secret-files.js'

/** DATA_DIR when unset, relative to the working directory. */
export const DEFAULT_DATA_DIR = './data'

export type Env = Record<string, string | undefined>

// PARTNER_ENV picks the key pair: PARTNER_LIVE_API_KEY_ID (or PARTNER_SANDBOX_...) wins over the
// unprefixed PARTNER_API_KEY_ID, so both pairs can sit in one environment.
export function selectPartnerVariables(env: Env): Env {
  const named = partnerVariableNamer(env)
  const picked: Env = { ...env }
  for (const name of ['PARTNER_API_BASE_URL', 'PARTNER_API_KEY_ID', 'PARTNER_API_SECRET']) picked[name] = env[named(name)]
  return picked
}

export interface PartnerPlatform {
  env?: string
  baseUrl?: { name: string; value: string }
  keyId?: { name: string; value: string }
}

/**
 * The platform an environment names for the partner API: PARTNER_ENV and, of the pair it picks (PARTNER_LIVE_… or
 * PARTNER_SANDBOX_… before the unprefixed), the base URL and key id with the variables they came from; each
 * undefined where unset. For a second terminal to tell whether it names another platform than the service's.
 */
export function partnerPlatformOf(env: Env): PartnerPlatform {
  const named = partnerVariableNamer(env)
  const setting = (name: string) => {
    const variable = named(name)
    const value = env[variable]
    return value === undefined || value === '' ? undefined : { name: variable, value }
  }
  const baseUrl = setting('PARTNER_API_BASE_URL')
  const keyId = setting('PARTNER_API_KEY_ID')
  return { ...(env.PARTNER_ENV !== undefined && { env: env.PARTNER_ENV }), ...(baseUrl && { baseUrl }), ...(keyId && { keyId }) }
}

/**
 * The variable a PARTNER_API_* value was read from, for a message about it: its PARTNER_LIVE_ or PARTNER_SANDBOX_
 * form when PARTNER_ENV picked that one (selectPartnerVariables). A short PARTNER_LIVE_API_SECRET was reported as
 * PARTNER_API_SECRET, a variable that was fine, and the operator edited the wrong one.
 */
export function partnerVariableNamer(env: Env): (name: string) => string {
  const selected = env.PARTNER_ENV === 'live' ? 'LIVE' : 'SANDBOX'
  return (name) => {
    if (!name.startsWith('PARTNER_API_')) return name
    const specific = name.replace(/^PARTNER_/, `PARTNER_${selected}_`)
    return env[specific] !== undefined && env[specific] !== '' ? specific : name
  }
}

// What an env file can slip into a value that nobody meant, and that would otherwise surface far away (every
// API request refused 401, every delivery 401, "database \"escrow\r\" does not exist"): a carriage return from
// a file saved with Windows line endings, and quotes, which `docker run --env-file` and systemd keep as part of
// the value. Named without the value, which may be a secret.
// eslint-disable-next-line no-control-regex -- control characters are what it looks for
const CONTROL_CHARACTER = /[\u0000-\u001f\u007f]/
const QUOTED = /^(["']).*\1$/s
// a quote an env file opened and never closed, kept as well
const OPEN_QUOTE = /^["']/

/**
 * The variables that hold a secret, or a URL that can hold a password or a token, and may be given in a file instead:
 * NAME_FILE names the file whose content is NAME's value (secret-files.ts). The proxy variables are other programs'
 * convention as much as ours (curl's), read from the environment, and take no file.
 */
export const SECRET_FILE_VARIABLES: readonly string[] = [
  'WEBHOOK_SECRETS',
  'PARTNER_API_SECRET',
  'PARTNER_SANDBOX_API_SECRET',
  'PARTNER_LIVE_API_SECRET',
  'FORWARD_SECRET',
  'FORWARD_URL',
  'ADMIN_TOKEN',
  'SANDBOX_CONTROL_TOKEN',
  'DATABASE_URL',
  'DATABASE_LISTEN_URL',
  'AMQP_URL',
]

// What an env file (or, `inFile`, a secret file) slipped into a value, or undefined
export function garbledValue(name: string, value: string, inFile: boolean): string | undefined {
  // a secret file's one line ending is removed already: what is left is more than the value
  const keptInFile = 'the file must hold the value alone, with at most one line ending after it'
  if (value.includes('\r')) return `${name}: holds a carriage return (${inFile ? keptInFile : 'an env file saved with Windows line endings?'})`
  if (CONTROL_CHARACTER.test(value)) return `${name}: holds a control character (a tab, a line break${inFile ? `: ${keptInFile}` : ''})`
  const kept = inFile ? 'kept as part of the value: remove them from the file' : 'kept as part of the value (docker run --env-file and systemd keep them): remove them'
  if (QUOTED.test(value)) return `${name}: is wrapped in quotes, which are ${kept}`
  if (OPEN_QUOTE.test(value)) return `${name}: begins with a quote that is never closed, which is kept as part of the value: remove it`
  return undefined
}

export const spacedProblem = (name: string) => `${name}: begins or ends with a space, which is kept as part of the value: remove it`

export function withoutEmptyValues(env: Env): Env {
  return Object.fromEntries(Object.entries(env).filter(([, value]) => value !== undefined && value !== ''))
}

/**
 * `env` with the NAME_FILE of each of `names` read into NAME (secret-files.ts). A path is refused first where an env file
 * slipped something into it (a carriage return would otherwise be told as a file that does not exist).
 */
export function secretsInFiles(
  env: Env,
  names: readonly string[] = SECRET_FILE_VARIABLES,
  readFile: (file: string) => SecretFileRead = readSecretFile,
): ReturnType<typeof secretsFromFiles> {
  return secretsFromFiles(env, names, { read: readFile, pathProblem: secretFilePathProblem, bothSetHint: composeSetsToo })
}

// compose.yaml sets these itself, `NAME: ${NAME:-default}`, so a NAME_FILE given in .env meets NAME there too
const SET_BY_COMPOSE = new Set(['DATABASE_URL', 'PARTNER_API_SECRET', 'WEBHOOK_SECRETS'])
function composeSetsToo(name: string): string {
  return SET_BY_COMPOSE.has(name) ? ` (under docker compose, compose.yaml's own \`${name}: \${${name}:-…}\` sets it: remove that line there)` : ''
}

function secretFilePathProblem(name: string, path: string): string | undefined {
  return garbledValue(name, path, false) ?? (path.trim() !== path ? spacedProblem(name) : undefined)
}

/** DATA_DIR, DATABASE_URL and the mode (local or remote) an environment would give a command, read alone. */
export interface RunningServiceLookup {
  readonly dataDir: string
  readonly databaseUrl: string | undefined
  readonly mode: 'local' | 'remote'
}

/**
 * What a command needs to find the service running from DATA_DIR, and to tell whether its DATABASE_URL names
 * that service's database: DATA_DIR resolved as the service resolves it, and DATABASE_URL as set or read from
 * DATABASE_URL_FILE. Nothing else of the environment is read or checked, and nothing is written. A command the service runs runs with the
 * service's configuration, so the shell's other variables are none of its business: a FORWARD_SECRET set
 * there without FORWARD_URL refused the command (exit 2), and a shell without PARTNER_API_BASE_URL, read as
 * local mode, generated local-secrets.json in the DATA_DIR of a service running in remote mode.
 */
export function runningServiceLookup(rawEnv: Env): RunningServiceLookup {
  // DATABASE_URL_FILE too: a file that cannot be read is refused as the command's configuration would refuse it
  const files = secretsInFiles(rawEnv, ['DATABASE_URL'])
  if (files.problems.length > 0) throw new ConfigError(files.problems)
  const env = withoutEmptyValues(selectPartnerVariables(files.env))
  const dataDir = env.DATA_DIR ?? DEFAULT_DATA_DIR
  return {
    dataDir: dataDir.startsWith('memory://') ? dataDir : path.resolve(dataDir),
    databaseUrl: env.DATABASE_URL,
    // what loadConfig would make of this environment: local mode generates its secrets into DATA_DIR
    mode: env.PARTNER_API_BASE_URL === undefined ? 'local' : 'remote',
  }
}
