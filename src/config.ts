// The one place that reads process.env. Every variable is parsed and validated once into a frozen,
// typed Config; a bad value stops start-up with one message that names every bad variable.
//
// Local mode: while PARTNER_API_BASE_URL is unset the service plays against the in-process sandbox and
// needs no environment at all; its secrets are generated once and kept in DATA_DIR (the file is named
// in the start-up log, the values never are). With a real platform configured, every secret is required.
import { randomBytes } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { parse as parseQueryString } from 'node:querystring'
import bytes from 'bytes'
import { z } from 'zod'
import { ConfigError } from './config-error.js'
import { dataDirProblem, leftByAnotherUser, ownerOf, writingIntoDataDir } from './data-dir.js'
import { DEFAULT_MAX_WAL_BYTES, MIN_MAX_WAL_BYTES } from './db/pglite-wal.js'
import { DEFAULT_STATEMENT_TIMEOUT_MS } from './db/statement-timeout.js'
import { DEFAULT_LOG_BUFFER_LIMIT } from './logger.js'
import { variablesNotUtf8 } from './not-utf8.js'
import { TRADE_STATUSES } from './orders/trade-status.js'
import type { ProxySettings } from './partner-api/partner-api-proxy.js'
import { DEFAULT_MAX_ANSWER_BYTES, DEFAULT_RETRY, PARTNER_API_PREFIX } from './partner-api/partner-api-transport.js'
import { DEFAULT_DISPATCHER_SETTINGS, DEFAULT_MAX_ATTEMPTS, HELD_BACK_WARN_MS, leaseMarginMs } from './reactions/dispatcher-settings.js'
import { POLL_JITTER } from './reconcile/poll-jitter.js'
import { DEFAULT_POLL_LEASE_S, POLL_START_WINDOW_S, shortestPollLeaseS } from './reconcile/poll-lease.js'
import { forwardSecrets, MIN_WEBHOOK_SECRET_BYTES, WEBHOOK_SECRET_PREFIX, webhookSecretFault } from './reactions/forwarder.js'
import { FILE_SUFFIX, namingTheFile, readSecretFile, type SecretFileRead } from './secret-files.js'
import { type UnreadVariable, editDistance, unreadVariables } from './unread-variables.js'
import { removeIfThere, writeWholeUnlessThere } from './write-whole.js'
import {
  DEFAULT_DATA_DIR,
  type Env,
  garbledValue,
  partnerVariableNamer,
  SECRET_FILE_VARIABLES,
  secretsInFiles,
  selectPartnerVariables,
  spacedProblem,
  withoutEmptyValues,
} from './environment.js'

// read without the schema, for a command forwarded to the running service (environment.ts); exported here as before
export {
  DEFAULT_DATA_DIR,
  partnerPlatformOf,
  type PartnerPlatform,
  runningServiceLookup,
  type RunningServiceLookup,
  SECRET_FILE_VARIABLES,
  secretsInFiles,
} from './environment.js'

export const MIN_SECRET_LENGTH = 24

export type PartnerEnv = 'sandbox' | 'live'
export type PartnerKind = 'marketplace' | 'merchant'
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent'

export interface Config {
  /** The public listener: the webhook path, /healthz and /readyz, nothing else. */
  readonly port: number
  readonly host: string
  /** The operator listener: metrics and the local command endpoint (loopback unless set otherwise). */
  readonly admin: {
    readonly port: number
    readonly host: string
    /** ADMIN_ALLOWED_HOSTS, lower-cased: Host names answered besides loopback ones and IP addresses (`*`: any). */
    readonly allowedHosts: readonly string[]
  }
  /** Caps on the public listener, so unauthenticated clients cannot hold the process's memory. */
  readonly limits: {
    /** Open connections at once; past it new connections are dropped. */
    readonly maxConnections: number
    /** Request body bytes being read or held at once; past it a request gets 503 before its body is read. */
    readonly maxInflightBodyBytes: number
    /** A body still arriving after this long gives its place in a full budget to a new request (503 to it). */
    readonly slowBodyMs: number
  }
  readonly databaseUrl: string | undefined
  /**
   * DATABASE_EMBEDDED: true, the embedded database in DATA_DIR on purpose (what PARTNER_ENV=live needs to run
   * without DATABASE_URL); false, DATABASE_URL required; undefined (unset), embedded where DATABASE_URL is unset.
   */
  readonly databaseEmbedded: boolean | undefined
  /** The LISTEN connection's URL when it is not databaseUrl (a direct one beside a pooler in transaction mode). */
  readonly databaseListenUrl: string | undefined
  readonly databasePoolSize: number
  /**
   * Postgres: the database cancels a statement of the service's after this (statement_timeout); the client
   * stops waiting 1 s later.
   */
  readonly databaseStatementTimeoutMs: number
  readonly dataDir: string
  /**
   * DATA_DIR_MIN_FREE: with the embedded database on disk, deliveries are answered 503 while DATA_DIR's file
   * system has less free space than this (db/storage-guard.ts); 0: no guard.
   */
  readonly dataDirMinFreeBytes: number
  /**
   * DATA_DIR_MAX_WAL: the embedded database's max_wal_size, which its checkpoints keep its write-ahead log (pg_wal)
   * near (db/pglite-worker.mjs); at least 32 MB (two segments).
   */
  readonly dataDirMaxWalBytes: number
  readonly logLevel: LogLevel
  /** Human-readable log lines; undefined (LOG_PRETTY unset): on a terminal in local mode only. */
  readonly logPretty: boolean | undefined
  /** LOG_BUFFER_LIMIT: the most log output held in memory while stdout's reader is behind (logger.ts). */
  readonly logBufferLimitBytes: number
  readonly shutdownTimeoutMs: number
  /** SHUTDOWN_DRAIN_DELAY_MS: on a signal, /readyz answers 503 this long before the service stops taking work. */
  readonly shutdownDrainDelayMs: number
  readonly webhook: {
    readonly path: string
    readonly secrets: readonly string[]
    readonly bodyLimitBytes: number
    /** Group commit: most deliveries written by one statement (1: each alone). */
    readonly batchMax: number
    /** Group commit: statements in flight at once (WEBHOOK_BATCH_STATEMENTS; on Postgres at most the pool). */
    readonly batchStatements: number
    /** Stored delivery ids remembered per process, so their retries skip the database (0: none). */
    readonly seenCacheSize: number
  }
  readonly partner: {
    /** local: no platform configured, the sandbox runs in-process; remote: a real platform. */
    readonly mode: 'local' | 'remote'
    readonly env: PartnerEnv
    readonly kind: PartnerKind
    readonly baseUrl: string | undefined
    readonly keyId: string
    readonly secret: string
    readonly timeoutMs: number
    /** The most of an answer's body read (PARTNER_API_ANSWER_LIMIT); past it the call fails, the rest unread. */
    readonly maxAnswerBytes: number
    /**
     * HTTP_PROXY, HTTPS_PROXY and NO_PROXY (the lower-case name wins, as in curl and undici); undefined when
     * neither proxy is set, and in local mode. The partner API client's alone: the forwarder and RabbitMQ
     * connect directly.
     */
    readonly proxy: ProxySettings | undefined
  }
  readonly poll: {
    readonly enabled: boolean
    readonly intervalS: number
    readonly concurrency: number
    readonly batchSize: number
    /**
     * POLL_LEASE_S: how long a claimed order belongs to the claiming replica. Unset: 300 s, or the longest one poll
     * can last where PARTNER_API_TIMEOUT_MS and DATABASE_STATEMENT_TIMEOUT_MS make that longer (poll-lease.ts).
     */
    readonly leaseS: number
    readonly expectedWebhookS: number
    readonly staleAfterS: number
  }
  readonly metrics: { readonly enabled: boolean; readonly path: string }
  readonly orders: {
    /**
     * ORDER_REFERENCE_PATTERN, matched against a whole external reference: the references this backend's orders
     * use. A trade event for one it does not match, with no order, is stored `dismissed` rather than parked, and
     * no order is created with one. Undefined (unset): every reference may be an order's.
     */
    readonly referencePattern: RegExp | undefined
  }
  readonly reactions: {
    /** Calls of one (event, handler) in all before the job is failed (dead letter). */
    readonly maxAttempts: number
    /** Calls of each handler running at once per replica. */
    readonly concurrency: number
    /** How long a claimed job belongs to its replica: a replica that died mid-handler gives it up after this. */
    readonly leaseS: number
    /**
     * The wait before a failed call's next attempt: between half and all of base × 2^(attempt − 1), at most the
     * cap; a Retry-After longer than the cap is cut to it.
     */
    readonly backoff: { readonly baseS: number; readonly capS: number }
    /**
     * How long a handler's committed events may wait behind an open transaction before the dispatcher says so
     * (`reaction stream held back`, warn), and again as often while they wait.
     */
    readonly heldBackWarnS: number
  }
  /** The built-in forwarder; undefined when FORWARD_URL is unset. */
  readonly forward:
    | {
        readonly url: string
        /** `whsec_<base64>`, the Standard Webhooks form */
        readonly secret: string
        readonly timeoutMs: number
        /** FORWARD_EVENTS: the event types it takes, 'trade.<status>' or 'trade.*' (the default) */
        readonly events: readonly string[]
      }
    | undefined
  /** The built-in RabbitMQ publisher; undefined when AMQP_URL is unset. */
  readonly amqp:
    | {
        /** amqp:// or amqps://, credentials included: never logged (see describeBroker) */
        readonly url: string
        /** a durable topic exchange */
        readonly exchange: string
        /** per publish: to connect, and from publishing to the broker's confirm */
        readonly timeoutMs: number
        /** AMQP_EVENTS: the event types it publishes, 'trade.<status>' or 'trade.*' (the default) */
        readonly events: readonly string[]
      }
    | undefined
  readonly sandbox: {
    readonly port: number
    /** Bearer token of the sandbox's /sandbox/* control endpoints; undefined: they refuse every call. */
    readonly controlToken: string | undefined
    /** SANDBOX_MILESTONE_ANSWER: which of the two records the spec allows a milestone deliver or release answers. */
    readonly milestoneAnswer: 'trade' | 'milestone'
  }
  /**
   * The operator console's token (ADMIN_TOKEN; in local mode generated and kept with the local secrets).
   * Undefined: no token is configured and the console is off.
   */
  readonly adminToken: string | undefined
  /**
   * Where adminToken came from: ADMIN_TOKEN, the local secrets file (local mode), or made for this process alone
   * (local mode with its other secrets given). The start-up banner names where to find it when it cannot print it.
   */
  readonly adminTokenFrom: 'ADMIN_TOKEN' | 'local-secrets' | 'this-process' | undefined
  /** What is deleted by age, and how often (src/retention/prune.ts). */
  readonly retention: {
    /** RETENTION_DAYS: raw bodies of deliveries older than this are emptied (the row stays). */
    readonly bodyDays: number
    /** DELIVERY_RETENTION_DAYS: delivery rows and done reaction jobs older than this are deleted. */
    readonly deliveryDays: number
    /** PRUNE_INTERVAL_S: time between two pruning passes of a replica. */
    readonly intervalS: number
    /** PRUNE_BATCH_SIZE: rows per delete or update statement. */
    readonly batchSize: number
  }
  /** Where local mode keeps its generated secrets; undefined in remote mode. */
  readonly localSecretsFile: string | undefined
  /**
   * Variables of the environment that look meant for the service and that it does not read (a misspelled name, a
   * name under one of its prefixes): `serve` warns of each at start, by name alone.
   */
  readonly unreadVariables: readonly UnreadVariable[]
}

export { ConfigError }

const booleanString = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'])
  .transform((value) => value === 'true' || value === '1' || value === 'yes')

// A whole number written in decimal digits alone: Number() would also take 0x10 (16), 0b11, 0o7, 1e3, +80,
// 3000.0 and surrounding spaces, so PORT=0x10 listened on port 16. Its bounds are said as the other messages say
// theirs (zod's own words were `Too small: expected number to be >=1`)
const wholeNumber = ({ min = 1, max = Number.MAX_SAFE_INTEGER }: { min?: number; max?: number } = {}) =>
  z
    .string()
    .regex(/^[0-9]+$/, 'must be a whole number in decimal digits (0-9)')
    .transform(Number)
    .pipe(z.number().min(min, `must be at least ${min}`).max(max, `must be at most ${max}`))

const port = wholeNumber({ min: 0, max: 65535 })

// Node's longest timer: a longer delay is taken as 1 ms, with a warning. POLL_INTERVAL_S=3000000 ran the poller
// every millisecond, and PARTNER_API_TIMEOUT_MS=2147483648 timed every platform call out at once (a trade create
// left with its outcome unknown)
const MAX_TIMER_MS = 2 ** 31 - 1
// the poller waits up to its interval and a quarter (its jitter) between cycles, on one timer
const MAX_POLL_INTERVAL_S = Math.floor(MAX_TIMER_MS / 1000 / (1 + POLL_JITTER))
// seconds the database takes as an integer (an order's next poll, `make_interval(secs => …::int)`): 68 years.
// STALE_AFTER_S=2147483648 failed every webhook's statement (stored `invalid`) and every trade create's
const MAX_DATABASE_SECONDS = 2 ** 31 - 1

// A size: decimal digits and an optional unit b, kb, mb or gb in either case (1024-based), such as 256kb or 1MB; with zeroAllowed, 0
// too (what turns a guard off). bytes.parse alone reads as much as looks like a number and drops the rest
// (0x10 as 0, 1e3 as 1, 12abc as 12), so DATA_DIR_MIN_FREE=0x10 turned the free-space guard off.
const SIZE_FORM = /^[0-9]+(b|kb|mb|gb)?$/i
const sizeOf = (zeroAllowed: boolean) =>
  z.string().transform((value, ctx) => {
    const parsed = SIZE_FORM.test(value) ? bytes.parse(value) : null
    if (parsed === null || !Number.isSafeInteger(parsed)) {
      ctx.addIssue({
        code: 'custom',
        message: `must be a size in decimal digits (0-9) with an optional unit b, kb, mb or gb, such as 256kb${zeroAllowed ? ' (or 0)' : ''}`,
      })
      return z.NEVER
    }
    if (parsed === 0 && !zeroAllowed) {
      ctx.addIssue({ code: 'custom', message: 'must be more than 0 (a size such as 256kb)' })
      return z.NEVER
    }
    return parsed
  })
const byteSize = sizeOf(false)

// WEBHOOK_PATH, METRICS_PATH: said whole, as `/wébhook`, `/a?b=1` and `/a#b` start with / too
const PATH_RULE = 'must be a path starting with / and holding only ASCII letters, digits, _, -, . and / (no query, fragment or space)'

const secretList = z.string().transform((value) =>
  value
    .split(',')
    .map((secret) => secret.trim())
    .filter((secret) => secret.length > 0),
)

// A comma-separated list, blanks dropped, each entry once. FORWARD_EVENTS, AMQP_EVENTS: which event types a built-in
// handler takes, e.g. trade.funded,trade.released, checked against the status table below (eventListProblems), as
// the schema knows no statuses; ADMIN_ALLOWED_HOSTS: host names (allowedHostProblems).
const eventList = z.string().transform((value) => [
  ...new Set(
    value
      .split(',')
      .map((pattern) => pattern.trim())
      .filter((pattern) => pattern.length > 0),
  ),
])

// HTTP_PROXY, HTTPS_PROXY: http://[user:password@]host:port, or host:port (taken as http://, as curl does);
// undefined when the value is no such URL, the problem said by the form only (the value may hold a password)
function proxyUrl(name: string, value: string | undefined, problems: string[]): string | undefined {
  if (value === undefined) return undefined
  const url = /^[a-z][a-z0-9+.-]*:\/\//i.test(value) ? value : `http://${value}`
  const parsed = URL.canParse(url) ? new URL(url) : undefined
  if (!parsed || (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') || parsed.hostname === '') {
    problems.push(`${name}: must be an http:// or https:// proxy URL (http://user:password@proxy.example:3128)`)
    return undefined
  }
  return url
}

// The SSL modes node-postgres knows: another (a typo of one, libpq's `allow`) was taken as TLS with the certificate
// verified, whatever it said
const SSL_MODES = ['disable', 'prefer', 'require', 'verify-ca', 'verify-full', 'no-verify']

// DATABASE_URL and DATABASE_LISTEN_URL. A URL node-postgres cannot read failed the start with "Invalid URL" only: a
// password with a `#` in it, not percent-encoded, or a port past 65535. The problem is told by its form, never the
// value (it holds the password).
const databaseUrl = z
  .string()
  .regex(/^postgres(ql)?:\/\//, 'must be a postgres:// or postgresql:// URL')
  .superRefine((value, context) => {
    const url = readAsNodePostgresDoes(value)
    if (!url) {
      context.addIssue({
        code: 'custom',
        message:
          'is not a URL node-postgres can read: percent-encode the user and the password where they hold one of : / ? # [ ] @ % ' +
          "(encodeURIComponent; `#` is %23), and give a port from 1 to 65535",
      })
      return
    }
    const sslmode = url.searchParams.get('sslmode')
    if (sslmode !== null && !SSL_MODES.includes(sslmode))
      context.addIssue({ code: 'custom', message: `its sslmode is none of ${SSL_MODES.join(', ')} (verify-full with sslrootcert=… to verify the server)` })
  })

// node-postgres's own reading (pg-connection-string): a space or a stray % is encoded first, and a socket's form
// without a host (postgres://user@/db?host=/var/run/postgresql) is read with a stand-in one
function readAsNodePostgresDoes(value: string): URL | undefined {
  const text = / |%[^a-f0-9]|%[a-f0-9][^a-f0-9]/i.test(value) ? encodeURI(value).replace(/%25(\d\d)/g, '%$1') : value
  for (const candidate of [text, text.replace('@/', '@___DUMMY___/')])
    if (URL.canParse(candidate, 'postgres://base')) return new URL(candidate, 'postgres://base')
  return undefined
}

const EnvSchema = z.object({
  PORT: port.default(3000),
  HOST: z.string().min(1).default('127.0.0.1'),
  ADMIN_PORT: port.default(3001),
  ADMIN_HOST: z.string().min(1).default('127.0.0.1'),
  ADMIN_ALLOWED_HOSTS: eventList.default([]),
  MAX_CONNECTIONS: wholeNumber({ max: 1_000_000 }).default(1_000),
  MAX_INFLIGHT_BODY_BYTES: byteSize.default(16 * 1024 * 1024),
  SLOW_BODY_MS: wholeNumber({ min: 0, max: 600_000 }).default(1_000),
  DATABASE_URL: databaseUrl.optional(),
  DATABASE_EMBEDDED: booleanString.optional(),
  DATABASE_LISTEN_URL: databaseUrl.optional(),
  DATABASE_POOL_SIZE: wholeNumber({ max: 200 }).default(10),
  DATABASE_STATEMENT_TIMEOUT_MS: wholeNumber({ min: 100, max: 3_600_000 }).default(DEFAULT_STATEMENT_TIMEOUT_MS),
  DATA_DIR: z.string().min(1).default(DEFAULT_DATA_DIR),
  // 0 turns the guard off
  DATA_DIR_MIN_FREE: sizeOf(true).default(128 * 1024 * 1024),
  // Postgres's least max_wal_size is two 16-MB segments
  DATA_DIR_MAX_WAL: byteSize
    .refine((value) => value >= MIN_MAX_WAL_BYTES, { message: 'must be at least 32mb (two write-ahead log segments)' })
    .default(DEFAULT_MAX_WAL_BYTES),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  LOG_PRETTY: booleanString.optional(),
  LOG_BUFFER_LIMIT: byteSize.default(DEFAULT_LOG_BUFFER_LIMIT),
  // a day: a larger number is a typo (and the whole stop's bound, with the drain delay, is one timer)
  SHUTDOWN_TIMEOUT_MS: wholeNumber({ max: 86_400_000 }).default(10_000),
  SHUTDOWN_DRAIN_DELAY_MS: wholeNumber({ min: 0, max: 120_000 }).default(0),
  WEBHOOK_PATH: z
    .string()
    .regex(/^\/[\w\-./]*$/, PATH_RULE)
    .default('/webhooks/partner'),
  WEBHOOK_SECRETS: secretList.optional(),
  WEBHOOK_BODY_LIMIT: byteSize.default(256 * 1024),
  WEBHOOK_BATCH_MAX: wholeNumber({ max: 1_000 }).default(100),
  WEBHOOK_BATCH_STATEMENTS: wholeNumber({ max: 200 }).default(2),
  WEBHOOK_SEEN_CACHE: wholeNumber({ min: 0, max: 10_000_000 }).default(100_000),
  PARTNER_ENV: z.enum(['sandbox', 'live']).default('sandbox'),
  PARTNER_KIND: z.enum(['marketplace', 'merchant']).default('marketplace'),
  PARTNER_API_BASE_URL: z.url({ protocol: /^https?$/, error: 'must be an http(s) URL' }).optional(),
  // sent as the X-Partner-Key-Id header, which carries bytes, not characters: `pk_€x` passed here and every call then
  // failed before sending (Cannot convert argument to a ByteString), reported as of unknown outcome
  PARTNER_API_KEY_ID: z
    .string()
    .min(1)
    .regex(/^[\x21-\x7e]*$/, 'must be printable ASCII without spaces: it is sent as the X-Partner-Key-Id header')
    .optional(),
  PARTNER_API_SECRET: z.string().optional(),
  PARTNER_API_TIMEOUT_MS: wholeNumber({ max: MAX_TIMER_MS }).default(10_000),
  PARTNER_API_ANSWER_LIMIT: byteSize.default(DEFAULT_MAX_ANSWER_BYTES),
  HTTP_PROXY: z.string().optional(),
  http_proxy: z.string().optional(),
  HTTPS_PROXY: z.string().optional(),
  https_proxy: z.string().optional(),
  NO_PROXY: z.string().optional(),
  no_proxy: z.string().optional(),
  POLL_ENABLED: booleanString.default(true),
  POLL_INTERVAL_S: wholeNumber({ max: MAX_POLL_INTERVAL_S }).default(30),
  POLL_CONCURRENCY: wholeNumber({ max: 256 }).default(8),
  POLL_BATCH_SIZE: wholeNumber({ max: 10_000 }).default(100),
  // a day, as REACTION_LEASE_S; unset: the default, or the shortest allowed where that is longer (pollLeaseS)
  POLL_LEASE_S: wholeNumber({ max: 86_400 }).optional(),
  EXPECTED_WEBHOOK_S: wholeNumber({ max: MAX_DATABASE_SECONDS }).default(600),
  STALE_AFTER_S: wholeNumber({ max: MAX_DATABASE_SECONDS }).default(21_600),
  ORDER_REFERENCE_PATTERN: z.string().optional(),
  METRICS_ENABLED: booleanString.default(true),
  METRICS_PATH: z
    .string()
    .regex(/^\/[\w\-./]*$/, PATH_RULE)
    .default('/metrics'),
  SANDBOX_PORT: port.default(4010),
  SANDBOX_CONTROL_TOKEN: z.string().optional(),
  SANDBOX_MILESTONE_ANSWER: z
    .enum(['trade', 'milestone'], {
      error: 'must be trade (a milestone deliver or release answers the trade record) or milestone (the milestone record)',
    })
    .default('trade'),
  REACTION_MAX_ATTEMPTS: wholeNumber({ max: 1_000 }).default(DEFAULT_MAX_ATTEMPTS),
  REACTION_CONCURRENCY: wholeNumber({ max: 256 }).default(32),
  REACTION_LEASE_S: wholeNumber({ max: 86_400 }).default(300),
  REACTION_BACKOFF_BASE_S: wholeNumber({ max: 86_400 }).default(DEFAULT_DISPATCHER_SETTINGS.backoff.baseS),
  REACTION_BACKOFF_CAP_S: wholeNumber({ max: 86_400 }).default(DEFAULT_DISPATCHER_SETTINGS.backoff.capS),
  REACTION_HELD_BACK_WARN_S: wholeNumber({ max: 86_400 }).default(HELD_BACK_WARN_MS / 1000),
  FORWARD_URL: z.url({ protocol: /^https?$/, error: 'must be an http(s) URL' }).optional(),
  FORWARD_SECRET: z.string().optional(),
  FORWARD_TIMEOUT_MS: wholeNumber({ max: MAX_TIMER_MS }).default(10_000),
  FORWARD_EVENTS: eventList.default(['trade.*']),
  ADMIN_TOKEN: z.string().optional(),
  // the message names the form only: the value holds a password
  AMQP_URL: z
    .string()
    .refine(isAmqpUrl, 'must be an amqp:// or amqps:// URL (amqp://user:password@host:5672/vhost)')
    .optional(),
  // RabbitMQ's names: up to 255 of these characters; amq.* belongs to the broker
  AMQP_EXCHANGE: z
    .string()
    .regex(/^[A-Za-z0-9_.:-]{1,255}$/, 'must be 1 to 255 letters, digits, "-", "_", "." or ":"')
    .refine((name) => !name.startsWith('amq.'), 'must not start with "amq." (reserved by the broker)')
    .default('partner-escrow'),
  AMQP_TIMEOUT_MS: wholeNumber({ max: MAX_TIMER_MS }).default(10_000),
  AMQP_EVENTS: eventList.default(['trade.*']),
  // a century: a larger number is a typo, and would overflow the cut-off date
  RETENTION_DAYS: wholeNumber({ max: 36_500 }).default(30),
  DELIVERY_RETENTION_DAYS: wholeNumber({ max: 36_500 }).default(90),
  PRUNE_INTERVAL_S: wholeNumber({ max: 604_800 }).default(3_600),
  PRUNE_BATCH_SIZE: wholeNumber({ max: 100_000 }).default(1_000),
})

// The paths each listener serves besides the one a setting names (test/config.test.ts checks them against the
// routes): METRICS_PATH=/console/ answered the console's home page with the metrics, and WEBHOOK_PATH=/healthz
// took the health check's POSTs. Express matches paths without regard to case or a trailing slash.
export const PUBLIC_LISTENER_PATHS = ['/', '/healthz', '/readyz']
export const OPERATOR_LISTENER_PATHS = ['/', '/console', '/_local/cli']

function pathTakenProblems(name: string, value: string, taken: readonly string[]): string[] {
  const normal = (path: string) => path.toLowerCase().replace(/\/+$/, '') || '/'
  const path = normal(value)
  const clash = taken.find((each) => path === each || (each !== '/' && path.startsWith(`${each}/`)))
  return clash === undefined ? [] : [`${name}: ${value} is the listener's own ${clash === '/' ? 'root' : clash}; choose another path`]
}

// ORDER_REFERENCE_PATTERN as written, held to the whole reference (`ORD-[0-9]+` does not take `XORD-1`), in
// JavaScript's syntax with the u flag (a character class or `.` takes a character, not half of one)
function wholeReferencePattern(pattern: string): RegExp {
  return new RegExp(`^(?:${pattern})$`, 'u')
}

/** The name of every variable the schema reads: `.env.example` documents each (test/env-example.test.ts). */
export const CONFIG_VARIABLES: readonly string[] = Object.keys(EnvSchema.shape)

/**
 * What the client could not use of a base URL as given. The client sends to its origin and path alone: a user and
 * password were dropped without a word (the platform authenticates by signature), and so were a query string and a
 * fragment. Told by their form, never the value, which may hold a password.
 */
function baseUrlProblems(value: string, name: string): string[] {
  const url = new URL(value)
  const problems: string[] = []
  // the URL parser takes port 0 (and :00): every call failed as the platform unreachable
  if (url.port === '0') problems.push(`${name}: must not have port 0, where nothing can be reached; give the platform's port (or none: 80, 443)`)
  if (url.username !== '' || url.password !== '') {
    problems.push(`${name}: must not hold a user or password (requests are signed with PARTNER_API_SECRET; they would not be sent)`)
  }
  if (url.search !== '' || url.hash !== '' || value.includes('?') || value.includes('#')) {
    problems.push(`${name}: must not have a query string or fragment (the client sends to the base URL's path alone)`)
  }
  // as a server may read it: slashes doubled and letter case aside (/api//partner/v1, /API/partner/v1 were taken)
  const path = url.pathname.replace(/\/{2,}/g, '/').replace(/\/+$/, '')
  if (path.toLowerCase().endsWith(PARTNER_API_PREFIX)) {
    const root = `${url.origin}${path.slice(0, -PARTNER_API_PREFIX.length)}`
    problems.push(`${name}: give the platform's base URL without ${PARTNER_API_PREFIX} (the client adds it): ${root}`)
  }
  return problems
}

// FORWARD_URL's scheme and authority (user, password, host, port) as written; what follows is its path and query.
// The URL parser ends an authority at / ? # or \
const URL_AUTHORITY = /^https?:\/\/[^/?#\\]*/i

/**
 * What the forwarder would send other than written. It sends to the parsed URL's path and query, which the URL
 * parser rewrote without a word: a fragment dropped, `/x y` sent as /x%20y, `/\evil` as //evil, `/a/../b` as /b.
 * A query string is the receiver's to use (a token), so it is taken as written. Told by the form, never the value,
 * which may hold a password or a token.
 */
function forwardUrlProblems(value: string): string[] {
  if (value.includes('#')) {
    return ['FORWARD_URL: must not have a fragment (#…), which is never sent; a # in the user, password, path or query is written %23']
  }
  if (/\s/.test(value)) {
    return ['FORWARD_URL: must not hold a space or other whitespace; write it percent-encoded, as it is to be sent (a space is %20)']
  }
  if (value.includes('\\')) {
    return ['FORWARD_URL: must not hold a backslash, which the URL parser reads as / (…/\\evil is sent to //evil); write / or %5C']
  }
  const url = new URL(value)
  // the URL parser takes port 0 (and :00): every call failed as the receiver unreachable, retried for a day
  if (url.port === '0') return ["FORWARD_URL: must not have port 0, where nothing can be reached; give the receiver's port (or none: 80, 443)"]
  const written = value.replace(URL_AUTHORITY, '')
  const queryAt = written.indexOf('?')
  const writtenPath = queryAt === -1 ? written : written.slice(0, queryAt)
  const writtenQuery = queryAt === -1 ? '' : written.slice(queryAt)
  const problems: string[] = []
  // no path at all is sent as /, as curl does
  if (url.pathname !== (writtenPath || '/')) {
    problems.push(
      'FORWARD_URL: its path would be sent other than written: the URL parser resolves . and .. segments (%2e too) and ' +
        'percent-encodes characters such as é " < > ` { }; write the path as it is to be sent',
    )
  }
  if (url.search !== writtenQuery) {
    problems.push(
      "FORWARD_URL: its query string would be sent other than written: the URL parser percent-encodes characters such as é \" ' < > " +
        'and drops a ? with nothing after it; write the query as it is to be sent',
    )
  }
  return problems
}

// The options amqplib reads from AMQP_URL's query string (lib/connect.js, openFrames), by exact name, the first of a
// repeated one winning, each held to what its connection opening can send: amqplib reads a number with parseInt and
// sent NaN for `heartbeat=abc`, which failed every publish as "Field 'heartbeat' is the wrong type" after the
// service had started, reported as the broker unreachable and retried for a day. A name it does not read is refused
// too: `?heartbeet=10` or `?prefetch=5` was let through and did nothing, the operator believing it set.
const AMQP_QUERY_OPTIONS: Record<string, { rule: string; accepts: (value: string) => boolean }> = {
  // unsigned shorts and an unsigned long on the wire (connection.tune-ok)
  heartbeat: { rule: 'a whole number of seconds from 0 to 65535 (0: no heartbeats)', accepts: (value) => wholeUpTo(value, 0xffff) },
  channelMax: { rule: 'a whole number from 0 to 65535 (0: the broker\'s limit)', accepts: (value) => wholeUpTo(value, 0xffff) },
  // the protocol's smallest frame is 4096 bytes: RabbitMQ closes a connection that asks for less
  frameMax: {
    rule: 'a whole number of bytes, 0 (the broker\'s limit) or from 4096 to 4294967295',
    accepts: (value) => wholeUpTo(value, 0xffff_ffff) && (Number(value) === 0 || Number(value) >= 4096),
  },
  // amqplib's own limit on a frame it takes, checked by it as it opens the connection
  maxFrameSize: {
    rule: 'a whole number of bytes, 0 (no limit) or at least 4096',
    accepts: (value) => wholeUpTo(value, Number.MAX_SAFE_INTEGER) && (Number(value) === 0 || Number(value) >= 4096),
  },
  // a short string on the wire; empty is amqplib's default, en_US
  locale: { rule: 'at most 255 bytes', accepts: (value) => Buffer.byteLength(value) <= 255 },
}

function wholeUpTo(value: string, max: number): boolean {
  return /^\d{1,16}$/.test(value) && Number(value) <= max
}

/** AMQP_URL's port 0 and query options amqplib could not send. Told by the option's name, never the value. */
function amqpUrlProblems(value: string): string[] {
  const url = new URL(value)
  // amqplib reads port 0 as none given, and connected to 5672 (5671 for amqps://)
  const problems: string[] = url.port === '0' ? ["AMQP_URL: must not have port 0; give the broker's port (or none: 5672, 5671 for amqps://)"] : []
  const query = url.search.slice(1)
  const options = new Map<string, string>()
  for (const [name, given] of Object.entries(parseQueryString(query))) {
    options.set(name, Array.isArray(given) ? (given[0] ?? '') : (given ?? ''))
  }
  const known = Object.keys(AMQP_QUERY_OPTIONS)
  for (const [name, given] of options) {
    const option = AMQP_QUERY_OPTIONS[name]
    if (Object.hasOwn(AMQP_QUERY_OPTIONS, name) && option !== undefined) {
      if (!option.accepts(given)) problems.push(`AMQP_URL: its query option ${name} must be ${option.rule}`)
      continue
    }
    // amqplib reads the names as written: Heartbeat=10 was ignored without a word
    const meant = known.find((each) => each.toLowerCase() === name.toLowerCase())
    if (meant !== undefined) problems.push(`AMQP_URL: its query option ${name} is not read; the name is ${meant} (letter case counts)`)
    else problems.push(`AMQP_URL: its query option ${queryOptionName(name)} is not one amqplib reads; the options it reads are ${known.join(', ')}`)
  }
  return problems
}

/** A query option's name as a problem shows it: as it is when plain, else quoted and cut (it is the URL's text). */
function queryOptionName(name: string): string {
  return /^[A-Za-z0-9_.-]{1,60}$/.test(name) ? name : JSON.stringify(name.length > 60 ? `${name.slice(0, 60)}…` : name)
}

function isAmqpUrl(value: string): boolean {
  try {
    const url = new URL(value)
    return (url.protocol === 'amqp:' || url.protocol === 'amqps:') && url.hostname !== ''
  } catch {
    return false
  }
}

// the lower-case name wins, as in curl and undici
function proxySettings(values: z.infer<typeof EnvSchema>, problems: string[]): ProxySettings | undefined {
  const [httpName, httpValue] = values.http_proxy !== undefined ? ['http_proxy', values.http_proxy] : ['HTTP_PROXY', values.HTTP_PROXY]
  const [httpsName, httpsValue] = values.https_proxy !== undefined ? ['https_proxy', values.https_proxy] : ['HTTPS_PROXY', values.HTTPS_PROXY]
  if (httpValue === undefined && httpsValue === undefined) return undefined
  const httpProxy = proxyUrl(httpName, httpValue, problems)
  const httpsProxy = proxyUrl(httpsName, httpsValue, problems)
  return { httpProxy, httpsProxy, noProxy: values.no_proxy ?? values.NO_PROXY }
}

// ADMIN_ALLOWED_HOSTS: the names besides loopback ones and IP addresses the operator listener answers as Host
// (src/http/loopback-host.ts): a host name without port or scheme, or * for any
const HOST_NAME = /^(\*|(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*)$/i

function allowedHostProblems(names: readonly string[]): string[] {
  return names
    .filter((name) => !HOST_NAME.test(name))
    .map(
      (name) =>
        `ADMIN_ALLOWED_HOSTS: ${JSON.stringify(name.length > 60 ? `${name.slice(0, 60)}…` : name)} is not a host name ` +
        '(a comma-separated list of names such as metrics.internal, without port or scheme, or * for any)',
    )
}

const EVENT_PATTERN = /^trade\.(\*|[a-z0-9_]+)$/

// A pattern naming a status the table does not know would match no event the service writes from its
// known statuses, and the handler would quietly receive nothing: refused, with the list to pick from. (An
// unknown status the platform sends later reaches trade.* only; add it to src/orders/trade-status.ts.)
function eventListProblems(name: string, patterns: readonly string[]): string[] {
  const form = 'a comma-separated list of trade.<status>, or trade.* for every event'
  if (patterns.length === 0) return [`${name}: is set but names no event type (${form})`]
  const known = Object.keys(TRADE_STATUSES)
  const problems: string[] = []
  for (const pattern of patterns) {
    const shown = JSON.stringify(pattern.length > 60 ? `${pattern.slice(0, 60)}…` : pattern)
    if (!EVENT_PATTERN.test(pattern)) problems.push(`${name}: ${shown} is not an event type pattern (${form})`)
    else if (pattern !== 'trade.*' && !Object.hasOwn(TRADE_STATUSES, pattern.slice('trade.'.length))) {
      problems.push(`${name}: ${shown} matches no event type; the types are ${known.map((status) => `trade.${status}`).join(', ')}`)
    }
  }
  return problems
}

// A file saved with a byte-order mark: Node's --env-file keeps it as part of the first variable's name, so that
// variable was not set at all (a DATABASE_URL first: the service ran on a new embedded database, warned only that the
// file was not loaded). And a space before or after a value, which env files keep too: a secret with a trailing space
// started cleanly, then every call to the platform was refused 401, and a DATA_DIR with one opened a new, empty database.
// The comma-separated lists trim each entry, so a space there means nothing.
const BYTE_ORDER_MARK = '\uFEFF'
const TRIMMED_LISTS = new Set(['WEBHOOK_SECRETS', 'FORWARD_EVENTS', 'AMQP_EVENTS', 'ADMIN_ALLOWED_HOSTS'])

const PER_ENVIRONMENT = ['SANDBOX', 'LIVE'].flatMap((which) => ['API_BASE_URL', 'API_KEY_ID', 'API_SECRET'].map((name) => `PARTNER_${which}_${name}`))

/** The NAME_FILE variables of SECRET_FILE_VARIABLES. */
export const SECRET_FILE_NAMES: readonly string[] = SECRET_FILE_VARIABLES.map((name) => `${name}${FILE_SUFFIX}`)

/**
 * The `sandbox` command's variables, one for each of its options (src/cli/sandbox.command.ts), and the _FILE forms of
 * its two secrets, read by that command alone; SANDBOX_PORT and SANDBOX_MILESTONE_ANSWER are the configuration's too.
 */
export const SANDBOX_COMMAND_VARIABLES: readonly string[] = [
  'SANDBOX_HOST',
  'SANDBOX_WEBHOOK_URL',
  'SANDBOX_WEBHOOK_SECRET',
  'SANDBOX_WEBHOOK_SECRET_FILE',
  'SANDBOX_PARTNER_KIND',
  'SANDBOX_API_KEY_ID',
  'SANDBOX_API_SECRET',
  'SANDBOX_API_SECRET_FILE',
  'SANDBOX_RETRY_BASE_DELAY_MS',
  'SANDBOX_ATTEMPT_TIMEOUT_MS',
  'SANDBOX_TIMESTAMP_WINDOW_S',
  'SANDBOX_REFUND_DELAY_MS',
  'SANDBOX_DROP_RATE',
  'SANDBOX_DUPLICATE_RATE',
  'SANDBOX_REORDER_RATE',
  'SANDBOX_REORDER_HOLD_MS',
  'SANDBOX_DELAY_RATE',
  'SANDBOX_DELAY_MS',
  'SANDBOX_SEED',
]

/**
 * Every variable the service and its CLI read: the configuration's (CONFIG_VARIABLES), the PARTNER_LIVE_API_* and
 * PARTNER_SANDBOX_API_* pairs, and the `sandbox` command's. Any other under their prefixes, or a near miss of one
 * of them, is named at start (unreadVariables). A fork whose own code reads variables under these prefixes adds
 * their names here.
 */
export const READ_VARIABLES: readonly string[] = [...new Set([...CONFIG_VARIABLES, ...PER_ENVIRONMENT, ...SECRET_FILE_NAMES, ...SANDBOX_COMMAND_VARIABLES])]

/** The variables set in `env` that look meant for the service and that it does not read, each with the name meant where one is near. */
export function unreadVariablesOf(env: Env): UnreadVariable[] {
  return unreadVariables(env, READ_VARIABLES, {
    // read by other programs too (curl, package managers): a near miss of one (FTP_PROXY) is as likely theirs
    sharedWithOthers: ['HTTP_PROXY', 'http_proxy', 'HTTPS_PROXY', 'https_proxy', 'NO_PROXY', 'no_proxy'],
    // MAX_CONNECTIONS and MAX_INFLIGHT_BODY_BYTES share it with build tools' MAX_JOBS
    prefixesNotOurs: ['MAX_'],
  })
}

// A name this near DATABASE_URL is the database's, misspelled (DATABSE_URL, DATABASE_URI, database_url): without
// DATABASE_URL the service ran, without a word, on an embedded database of its own in DATA_DIR, and with several
// replicas each on its own, where deduplication, claims and exactly-once hold per database
const DATABASE_URL_NEAR_MISS_EDITS = 2

function databaseUrlNearMisses(unread: readonly UnreadVariable[]): string[] {
  // and of DATABASE_URL_FILE (DATABASE_URL_FIEL, DATABSE_URL_FILE), which runs it there alike
  return unread.flatMap(({ name }) => {
    const [meant, edits] = (['DATABASE_URL', 'DATABASE_URL_FILE'] as const)
      .map((each) => [each, editDistance(name, each)] as const)
      .reduce((nearest, each) => (each[1] < nearest[1] ? each : nearest))
    if (edits > DATABASE_URL_NEAR_MISS_EDITS) return []
    return [
      `${name}: is not a variable the service reads: did you mean ${meant}? Without DATABASE_URL the service would run on ` +
        `an embedded database of its own in DATA_DIR (each replica on its own); rename it to ${meant}, or unset it`,
    ]
  })
}

/**
 * The secrets this repository publishes for its own plays (compose.yaml's sandbox and replicas, the demo, the
 * benchmarks): anyone can read them, so anyone could sign deliveries or calls with them. test/config-published-secrets.test.ts
 * keeps the list whole.
 */
export const PUBLISHED_SECRETS: readonly string[] = [
  'compose-sandbox-api-secret-not-for-production',
  'compose-sandbox-webhook-secret-not-for-production',
  'demo-api-secret-not-for-production-0001',
  'demo-webhook-secret-not-for-production-01',
  'bench-webhook-secret-0123456789abcdef',
]

// compose.yaml's simulator, reached by its service name, and anything on this machine
const LOCAL_SANDBOX_HOSTS = new Set(['localhost', 'sandbox', '[::1]'])

/**
 * Whether a base URL is a sandbox played here: on this machine (loopback) or compose.yaml's `sandbox` service.
 * Anything else is taken as a real platform.
 */
export function isLocalSandboxUrl(baseUrl: string): boolean {
  const { hostname } = new URL(baseUrl)
  return LOCAL_SANDBOX_HOSTS.has(hostname) || hostname.endsWith('.localhost') || /^127\.\d+\.\d+\.\d+$/.test(hostname)
}

/** Whether the configuration talks to a real platform: PARTNER_ENV=live, or a base URL other than a local sandbox's. */
function onRealPlatform(env: PartnerEnv, baseUrl: string | undefined): boolean {
  return env === 'live' || (baseUrl !== undefined && !isLocalSandboxUrl(baseUrl))
}

/**
 * The warning `serve` logs when it runs on the embedded database against a real platform without DATABASE_EMBEDDED=true
 * saying so: a forgotten DATABASE_URL runs each replica on a database of its own. Undefined otherwise.
 */
export function embeddedDatabaseWarning(config: Config): string | undefined {
  if (config.databaseUrl !== undefined || config.databaseEmbedded === true) return undefined
  if (config.partner.mode !== 'remote' || !onRealPlatform(config.partner.env, config.partner.baseUrl)) return undefined
  return (
    'DATABASE_URL is not set: this service runs on an embedded database of its own in DATA_DIR, against a real platform. ' +
    'Several replicas must share one DATABASE_URL (each on its own database deduplicates, claims and hands over exactly once ' +
    'for itself alone); set DATABASE_URL, or DATABASE_EMBEDDED=true to run one instance on the embedded database on purpose'
  )
}

function garbledValues(env: Env, fromFiles: ReadonlyMap<string, string>): string[] {
  const problems: string[] = []
  const names = [...Object.keys(EnvSchema.shape), ...PER_ENVIRONMENT, ...SECRET_FILE_NAMES]
  for (const key of Object.keys(env)) {
    const name = key.slice(BYTE_ORDER_MARK.length)
    if (key.startsWith(BYTE_ORDER_MARK) && names.includes(name)) {
      problems.push(
        `${name}: is not set: the env file it is in starts with a byte-order mark (BOM), which is read as part of its first variable's name; save the file as UTF-8 without a BOM`,
      )
    }
  }
  for (const name of names) {
    const value = env[name]
    const problem = value === undefined ? undefined : garbledValue(name, value, fromFiles.has(name))
    if (problem !== undefined) problems.push(problem)
  }
  return problems
}

/** The variables of ours set to a value that begins or ends with a space (the lists aside, which trim each entry). */
function spacedValues(env: Env): string[] {
  return [...Object.keys(EnvSchema.shape), ...PER_ENVIRONMENT].filter((name) => {
    const value = env[name]
    return value !== undefined && value.trim() !== value && !TRIMMED_LISTS.has(name)
  })
}

export interface LocalSecrets {
  webhookSecret: string
  apiKeyId: string
  apiSecret: string
  sandboxControlToken: string
  adminToken: string
}

/**
 * Parses an environment into a Config. Pure apart from `localSecrets`, which local mode calls to get
 * (or create) its generated secrets, and `readFile`, which reads the secret files NAME_FILE variables name.
 */
export function parseConfig(
  rawEnv: Env,
  localSecrets: (dataDir: string) => LocalSecrets = readLocalSecrets,
  readFile: (file: string) => SecretFileRead = readSecretFile,
): Config {
  // the files first, and alone: without the value a file would have given, the rest would be refused for its want
  // (`WEBHOOK_SECRETS: required …`), or local mode would generate a secret in DATA_DIR in its stead
  const { env, fromFiles, problems } = secretsInFiles(rawEnv, SECRET_FILE_VARIABLES, readFile)
  if (problems.length > 0) throw new ConfigError(problems)
  try {
    return parseEnvironment(env, localSecrets, fromFiles)
  } catch (error) {
    if (!(error instanceof ConfigError) || fromFiles.size === 0) throw error
    throw new ConfigError(error.problems.map((problem) => namingTheFile(problem, fromFiles)))
  }
}

function parseEnvironment(rawEnv: Env, localSecrets: (dataDir: string) => LocalSecrets, fromFiles: ReadonlyMap<string, string>): Config {
  const env = withoutEmptyValues(selectPartnerVariables(rawEnv))
  // by the names as set (a PARTNER_SANDBOX_* value is copied to its PARTNER_* name above)
  const garbled = garbledValues(withoutEmptyValues(rawEnv), fromFiles)
  if (garbled.length > 0) throw new ConfigError(garbled)
  const named = partnerVariableNamer(rawEnv)
  const parsed = EnvSchema.safeParse(env)
  // a space is named where the variable's own reading did not refuse it already (a port, a size, an enum)
  const spaced = spacedValues(withoutEmptyValues(rawEnv))
  if (!parsed.success) {
    const refused = parsed.error.issues.map((issue) => named(issue.path.join('.')) || '(environment)')
    throw new ConfigError([
      ...parsed.error.issues.map((issue, index) => `${refused[index]}: ${issue.message}`),
      ...spaced.filter((name) => !refused.includes(name)).map(spacedProblem),
    ])
  }
  const values = parsed.data
  const problems: string[] = []
  const mode = values.PARTNER_API_BASE_URL === undefined ? 'local' : 'remote'
  // remote mode's alone: local mode calls the sandbox it runs itself, so a proxy set in the shell for other
  // programs, of whatever kind, is none of its business
  const proxy = mode === 'remote' ? proxySettings(values, problems) : undefined

  if (values.PARTNER_ENV === 'live' && mode === 'local') {
    problems.push('PARTNER_API_BASE_URL: required when PARTNER_ENV=live (live never runs the sandbox)')
  }
  const unread = unreadVariablesOf(rawEnv)
  const databaseMisspelled = values.DATABASE_URL === undefined ? databaseUrlNearMisses(unread) : []
  problems.push(...databaseMisspelled)
  problems.push(...embeddedDatabaseProblems(values, databaseMisspelled.length > 0))
  const halfPair = halfKeyPairProblems(rawEnv, values.PARTNER_ENV)
  problems.push(...halfPair)
  if (mode === 'remote' && onRealPlatform(values.PARTNER_ENV, values.PARTNER_API_BASE_URL)) {
    problems.push(...publishedSecretProblems(values, named('PARTNER_API_SECRET')))
  }
  for (const [index, secret] of (values.WEBHOOK_SECRETS ?? []).entries()) {
    if (secret.length < MIN_SECRET_LENGTH) {
      problems.push(`WEBHOOK_SECRETS: secret #${index + 1} is shorter than ${MIN_SECRET_LENGTH} characters`)
    }
  }
  if (rawEnv.WEBHOOK_SECRETS !== undefined && values.WEBHOOK_SECRETS?.length === 0) {
    problems.push('WEBHOOK_SECRETS: is set but holds no secret')
  }
  if (values.SANDBOX_CONTROL_TOKEN !== undefined && values.SANDBOX_CONTROL_TOKEN.length < MIN_SECRET_LENGTH) {
    problems.push(`SANDBOX_CONTROL_TOKEN: is shorter than ${MIN_SECRET_LENGTH} characters`)
  }
  if (values.ADMIN_TOKEN !== undefined && values.ADMIN_TOKEN.length < MIN_SECRET_LENGTH) {
    problems.push(`ADMIN_TOKEN: is shorter than ${MIN_SECRET_LENGTH} characters`)
  }
  if (values.ADMIN_TOKEN !== undefined) problems.push(...sharedTokenProblems(values.ADMIN_TOKEN, values, named('PARTNER_API_SECRET')))
  if (values.DATABASE_LISTEN_URL !== undefined && values.DATABASE_URL === undefined) {
    problems.push('DATABASE_LISTEN_URL: is set but DATABASE_URL is not (it is the direct connection beside a pooled DATABASE_URL)')
  }
  if (values.MAX_INFLIGHT_BODY_BYTES < values.WEBHOOK_BODY_LIMIT) {
    problems.push('MAX_INFLIGHT_BODY_BYTES: must be at least WEBHOOK_BODY_LIMIT (one largest body must fit)')
  }
  if (values.REACTION_BACKOFF_CAP_S < values.REACTION_BACKOFF_BASE_S) {
    // every wait would be the cap: the base would mean nothing
    problems.push(
      `REACTION_BACKOFF_CAP_S: must be at least REACTION_BACKOFF_BASE_S (${values.REACTION_BACKOFF_CAP_S} < ${values.REACTION_BACKOFF_BASE_S})`,
    )
  }
  if (values.DELIVERY_RETENTION_DAYS < values.RETENTION_DAYS) {
    // a row deleted before its body is due: the body setting would mean nothing
    problems.push(
      `DELIVERY_RETENTION_DAYS: must be at least RETENTION_DAYS (${values.DELIVERY_RETENTION_DAYS} < ${values.RETENTION_DAYS}): a delivery row outlives its body`,
    )
  }
  // the spec's {base_url} is what comes before /api/partner/v1/, which the client adds: given whole (as the local
  // banner prints the sandbox), every call went to /api/partner/v1/api/partner/v1/… and was refused 404, so the
  // poller flagged each order trade_not_found
  if (values.PARTNER_API_BASE_URL !== undefined) problems.push(...baseUrlProblems(values.PARTNER_API_BASE_URL, named('PARTNER_API_BASE_URL')))
  // as written: zod's URL check hands on the value trimmed, and a space after a token was dropped unseen
  if (env.FORWARD_URL !== undefined) problems.push(...forwardUrlProblems(env.FORWARD_URL))
  if (values.AMQP_URL !== undefined) problems.push(...amqpUrlProblems(values.AMQP_URL))
  if (values.PARTNER_API_SECRET !== undefined && values.PARTNER_API_SECRET.length < MIN_SECRET_LENGTH) {
    problems.push(`${named('PARTNER_API_SECRET')}: is shorter than ${MIN_SECRET_LENGTH} characters`)
  }
  if (values.FORWARD_SECRET !== undefined) {
    // each secret's fault by its place, never its value: one message for every case left the operator guessing
    const secrets = forwardSecrets(values.FORWARD_SECRET)
    const form = `${WEBHOOK_SECRET_PREFIX} followed by the base64 of at least ${MIN_WEBHOOK_SECRET_BYTES} random bytes`
    const makeOne = 'make one with: echo "whsec_$(openssl rand -base64 32)"'
    if (secrets.length === 0) problems.push(`FORWARD_SECRET: is set but holds no secret (each is ${form}); ${makeOne}`)
    secrets.forEach((secret, index) => {
      const fault = webhookSecretFault(secret)
      if (fault === undefined) return
      const which = secrets.length > 1 ? `secret #${index + 1} of ${secrets.length}` : 'the secret'
      problems.push(`FORWARD_SECRET: ${which} ${fault} (each is ${form}); ${makeOne}`)
    })
  }
  problems.push(...pathTakenProblems('WEBHOOK_PATH', values.WEBHOOK_PATH, PUBLIC_LISTENER_PATHS))
  problems.push(...pathTakenProblems('METRICS_PATH', values.METRICS_PATH, OPERATOR_LISTENER_PATHS))
  if (values.ORDER_REFERENCE_PATTERN !== undefined) {
    try {
      wholeReferencePattern(values.ORDER_REFERENCE_PATTERN)
    } catch (error) {
      problems.push(`ORDER_REFERENCE_PATTERN: is not a regular expression (${(error as Error).message})`)
    }
  }
  problems.push(...allowedHostProblems(values.ADMIN_ALLOWED_HOSTS))
  problems.push(...eventListProblems('FORWARD_EVENTS', values.FORWARD_EVENTS))
  problems.push(...eventListProblems('AMQP_EVENTS', values.AMQP_EVENTS))
  // A handler is aborted shortly before its lease ends: a call allowed longer than that was cut off as
  // "stopped (lease ended or shutting down)" every time, counted as a failed attempt, and its event, answered
  // well within the call's timeout, ended failed (REACTION_LEASE_S=10 with FORWARD_TIMEOUT_MS=120000 and a
  // receiver answering in 12 s)
  const marginMs = leaseMarginMs(values.REACTION_LEASE_S * 1000)
  const handlerMs = values.REACTION_LEASE_S * 1000 - marginMs
  for (const [name, timeoutMs, used] of [
    ['FORWARD_TIMEOUT_MS', values.FORWARD_TIMEOUT_MS, values.FORWARD_URL !== undefined],
    ['AMQP_TIMEOUT_MS', values.AMQP_TIMEOUT_MS, values.AMQP_URL !== undefined],
  ] as const) {
    if (used && timeoutMs > handlerMs) {
      problems.push(
        `${name}: must be at most ${handlerMs} (REACTION_LEASE_S=${values.REACTION_LEASE_S} less the ${marginMs} ms ` +
          'before its end at which a call still running is stopped): a longer call is cut off every time and its event ends failed',
      )
    }
  }
  const pollLease = pollLeaseS(values)
  if ('problem' in pollLease) problems.push(pollLease.problem)
  if (values.FORWARD_URL !== undefined && values.FORWARD_SECRET === undefined) {
    problems.push('FORWARD_SECRET: required when FORWARD_URL is set')
  }
  if (values.FORWARD_SECRET !== undefined && values.FORWARD_URL === undefined) {
    // refused rather than ignored: a secret nobody uses is also one the log redaction would not know
    problems.push('FORWARD_SECRET: is set but FORWARD_URL is not (set both to forward, or neither)')
  }
  if (mode === 'remote') {
    if (!values.WEBHOOK_SECRETS?.length)
      problems.push('WEBHOOK_SECRETS: required when PARTNER_API_BASE_URL is set')
    if (values.PARTNER_API_KEY_ID === undefined && halfPair.length === 0) {
      problems.push('PARTNER_API_KEY_ID: required when PARTNER_API_BASE_URL is set')
    }
    // a half pair is said above, by the variable missing from it
    if (values.PARTNER_API_SECRET === undefined && halfPair.length === 0) {
      problems.push('PARTNER_API_SECRET: required when PARTNER_API_BASE_URL is set')
    }
  }
  // and a space where no later check named the variable (a FORWARD_URL refused for what it holds)
  problems.push(...spaced.filter((name) => !problems.some((problem) => problem.startsWith(`${name}:`))).map(spacedProblem))
  if (problems.length > 0) throw new ConfigError(problems)

  // memory:// keeps an embedded database in memory (tests); anything else is a directory
  const dataDir = values.DATA_DIR.startsWith('memory://') ? values.DATA_DIR : path.resolve(values.DATA_DIR)
  const needsLocalSecrets =
    mode === 'local' &&
    (!values.WEBHOOK_SECRETS?.length || !values.PARTNER_API_KEY_ID || !values.PARTNER_API_SECRET)
  // an in-memory database keeps no file: its secrets are this process's alone (a `memory:` directory was made for them)
  const inMemory = dataDir.startsWith('memory://')
  const generated = needsLocalSecrets ? (inMemory ? newLocalSecrets() : localSecrets(dataDir)) : undefined

  const config: Config = {
    port: values.PORT,
    host: values.HOST,
    admin: {
      port: values.ADMIN_PORT,
      host: values.ADMIN_HOST,
      allowedHosts: [...new Set(values.ADMIN_ALLOWED_HOSTS.map((name) => name.toLowerCase()))],
    },
    limits: {
      maxConnections: values.MAX_CONNECTIONS,
      maxInflightBodyBytes: values.MAX_INFLIGHT_BODY_BYTES,
      slowBodyMs: values.SLOW_BODY_MS,
    },
    databaseUrl: values.DATABASE_URL,
    databaseEmbedded: values.DATABASE_EMBEDDED,
    databaseListenUrl: values.DATABASE_LISTEN_URL,
    databasePoolSize: values.DATABASE_POOL_SIZE,
    databaseStatementTimeoutMs: values.DATABASE_STATEMENT_TIMEOUT_MS,
    dataDir,
    dataDirMinFreeBytes: values.DATA_DIR_MIN_FREE,
    dataDirMaxWalBytes: values.DATA_DIR_MAX_WAL,
    logLevel: values.LOG_LEVEL,
    logPretty: values.LOG_PRETTY,
    logBufferLimitBytes: values.LOG_BUFFER_LIMIT,
    shutdownTimeoutMs: values.SHUTDOWN_TIMEOUT_MS,
    shutdownDrainDelayMs: values.SHUTDOWN_DRAIN_DELAY_MS,
    webhook: {
      path: values.WEBHOOK_PATH,
      secrets: values.WEBHOOK_SECRETS?.length ? values.WEBHOOK_SECRETS : [generated!.webhookSecret],
      bodyLimitBytes: values.WEBHOOK_BODY_LIMIT,
      batchMax: values.WEBHOOK_BATCH_MAX,
      seenCacheSize: values.WEBHOOK_SEEN_CACHE,
      // two by default: one statement runs while the other commits, and the deliveries arriving meanwhile make
      // the next one's batch. More statements at once compete for the database's cores and make smaller batches,
      // and on Postgres each statement has a fixed cost (its commit's flush, the executor's start) that its batch
      // shares (README, "Group commit");
      // embedded PGlite runs one statement at a time on its own thread, where the second waits while this thread
      // answers the first one's deliveries. Never more than the pool's connections: the rest wait for a slot
      batchStatements: values.DATABASE_URL ? Math.min(values.WEBHOOK_BATCH_STATEMENTS, values.DATABASE_POOL_SIZE) : values.WEBHOOK_BATCH_STATEMENTS,
    },
    partner: {
      mode,
      env: values.PARTNER_ENV,
      kind: values.PARTNER_KIND,
      baseUrl: values.PARTNER_API_BASE_URL,
      keyId: values.PARTNER_API_KEY_ID ?? generated!.apiKeyId,
      secret: values.PARTNER_API_SECRET ?? generated!.apiSecret,
      timeoutMs: values.PARTNER_API_TIMEOUT_MS,
      maxAnswerBytes: values.PARTNER_API_ANSWER_LIMIT,
      proxy,
    },
    poll: {
      enabled: values.POLL_ENABLED,
      intervalS: values.POLL_INTERVAL_S,
      concurrency: values.POLL_CONCURRENCY,
      batchSize: values.POLL_BATCH_SIZE,
      leaseS: 'leaseS' in pollLease ? pollLease.leaseS : DEFAULT_POLL_LEASE_S,
      expectedWebhookS: values.EXPECTED_WEBHOOK_S,
      staleAfterS: values.STALE_AFTER_S,
    },
    metrics: { enabled: values.METRICS_ENABLED, path: values.METRICS_PATH },
    orders: {
      referencePattern: values.ORDER_REFERENCE_PATTERN === undefined ? undefined : wholeReferencePattern(values.ORDER_REFERENCE_PATTERN),
    },
    sandbox: {
      port: values.SANDBOX_PORT,
      // local mode with its secrets given: a token per process (set SANDBOX_CONTROL_TOKEN to call them)
      controlToken:
        values.SANDBOX_CONTROL_TOKEN ??
        generated?.sandboxControlToken ??
        (mode === 'local' ? randomBytes(32).toString('hex') : undefined),
      milestoneAnswer: values.SANDBOX_MILESTONE_ANSWER,
    },
    reactions: {
      maxAttempts: values.REACTION_MAX_ATTEMPTS,
      concurrency: values.REACTION_CONCURRENCY,
      leaseS: values.REACTION_LEASE_S,
      backoff: { baseS: values.REACTION_BACKOFF_BASE_S, capS: values.REACTION_BACKOFF_CAP_S },
      heldBackWarnS: values.REACTION_HELD_BACK_WARN_S,
    },
    forward:
      values.FORWARD_URL === undefined
        ? undefined
        : {
            url: values.FORWARD_URL,
            secret: values.FORWARD_SECRET!,
            timeoutMs: values.FORWARD_TIMEOUT_MS,
            events: values.FORWARD_EVENTS,
          },
    // local mode with its secrets given: a token per process, shown in the start-up banner
    ...adminTokenOf(values.ADMIN_TOKEN, inMemory ? undefined : generated, mode),
    amqp:
      values.AMQP_URL === undefined
        ? undefined
        : {
            url: values.AMQP_URL,
            exchange: values.AMQP_EXCHANGE,
            timeoutMs: values.AMQP_TIMEOUT_MS,
            events: values.AMQP_EVENTS,
          },
    retention: {
      bodyDays: values.RETENTION_DAYS,
      deliveryDays: values.DELIVERY_RETENTION_DAYS,
      intervalS: values.PRUNE_INTERVAL_S,
      batchSize: values.PRUNE_BATCH_SIZE,
    },
    localSecretsFile: generated && !inMemory ? localSecretsPath(dataDir) : undefined,
    unreadVariables: unread,
  }
  return deepFreeze(config)
}

/**
 * Where the database is, said outright. PARTNER_ENV=live without DATABASE_URL ran on an embedded database in DATA_DIR
 * that nobody chose (a DATABASE_URL forgotten, or misspelled: then that is said instead), each replica on its own:
 * refused unless DATABASE_EMBEDDED=true. DATA_DIR=memory://, a throwaway database, is named as such already.
 */
function embeddedDatabaseProblems(values: z.infer<typeof EnvSchema>, misspelledSaid: boolean): string[] {
  if (values.DATABASE_URL !== undefined) {
    return values.DATABASE_EMBEDDED === true ? ['DATABASE_EMBEDDED: is true but DATABASE_URL is set: set one or the other'] : []
  }
  if (values.DATABASE_EMBEDDED === false) return ['DATABASE_URL: required when DATABASE_EMBEDDED=false']
  if (values.PARTNER_ENV !== 'live' || values.DATABASE_EMBEDDED === true || misspelledSaid || values.DATA_DIR.startsWith('memory://')) return []
  return [
    'DATABASE_URL: required when PARTNER_ENV=live: without it the service runs on an embedded database of its own in DATA_DIR, ' +
      'and several replicas each on their own (deduplication, claims and exactly-once hold per database); set DATABASE_URL ' +
      '(the same for every replica), or DATABASE_EMBEDDED=true to run one instance on the embedded database on purpose',
  ]
}

/**
 * A key pair half given under the PARTNER_ENV prefix: its other half was taken from PARTNER_API_*, another key's
 * (PARTNER_LIVE_API_KEY_ID with the sandbox's PARTNER_API_SECRET), and every call was refused 401. Both or neither.
 */
function halfKeyPairProblems(rawEnv: Env, env: PartnerEnv): string[] {
  const prefix = env === 'live' ? 'PARTNER_LIVE_' : 'PARTNER_SANDBOX_'
  const [keyId, secret] = [`${prefix}API_KEY_ID`, `${prefix}API_SECRET`]
  const given = (name: string) => rawEnv[name] !== undefined && rawEnv[name] !== ''
  if (given(keyId) === given(secret)) return []
  const [missing, present] = given(keyId) ? [secret, keyId] : [keyId, secret]
  return [
    `${missing}: required when ${present} is set: PARTNER_ENV=${env} takes the key id and the secret from the same prefix, ` +
      `never one of them from ${missing.replace(prefix, 'PARTNER_')} (another key's: the platform would refuse every call 401)`,
  ]
}

/**
 * The secrets this repository publishes, refused where they would guard anything: a real platform (PARTNER_ENV=live,
 * or a base URL other than a local sandbox's). Under compose a misspelled secret variable in .env (WEBHOOK_SECRET=)
 * left compose.yaml's placeholder in force, and a live service took deliveries signed with it. Named, never shown.
 */
function publishedSecretProblems(values: z.infer<typeof EnvSchema>, apiSecretName: string): string[] {
  const published = (value: string | undefined) => value !== undefined && PUBLISHED_SECRETS.includes(value)
  const why =
    "is a placeholder this repository publishes (compose.yaml's, the demo's), which anyone can sign with; give the platform's own " +
    "(under docker compose, a misspelled variable name in .env leaves compose.yaml's placeholder in force)"
  const webhookSecrets = values.WEBHOOK_SECRETS ?? []
  return [
    ...webhookSecrets.flatMap((secret, index) =>
      published(secret) ? [`WEBHOOK_SECRETS: ${webhookSecrets.length > 1 ? `secret #${index + 1} ` : ''}${why}`] : [],
    ),
    ...(published(values.PARTNER_API_SECRET) ? [`${apiSecretName}: ${why}`] : []),
    ...(published(values.ADMIN_TOKEN) ? [`ADMIN_TOKEN: ${why}`] : []),
    ...(published(values.SANDBOX_CONTROL_TOKEN) ? [`SANDBOX_CONTROL_TOKEN: ${why}`] : []),
  ]
}

/**
 * POLL_LEASE_S, or why it is refused. A lease must outlast the longest one claimed order's poll can take (its GET with
 * PARTNER_API_TIMEOUT_MS for each attempt and the Retry-After waits between them, then its write-back), and leave a
 * window to start polls in: a cycle starts no poll with less than the longest poll left of its lease (a poll started
 * later could outlast it, another replica claim the order and poll it again, and the first answer be thrown away).
 * Unset, it is 300 s, or the shortest allowed where that is longer: 465 s where PARTNER_API_TIMEOUT_MS=60000.
 */
function pollLeaseS(values: z.infer<typeof EnvSchema>): { leaseS: number } | { problem: string } {
  const shortest = shortestPollLeaseS(values.PARTNER_API_TIMEOUT_MS, values.DATABASE_STATEMENT_TIMEOUT_MS)
  if (values.POLL_LEASE_S === undefined) return { leaseS: Math.max(DEFAULT_POLL_LEASE_S, shortest) }
  if (values.POLL_LEASE_S >= shortest) return { leaseS: values.POLL_LEASE_S }
  return {
    problem:
      `POLL_LEASE_S: must be at least ${shortest}: the longest one claimed order's poll can last (its GET's ${DEFAULT_RETRY.maxAttempts} attempts of ` +
      `PARTNER_API_TIMEOUT_MS=${values.PARTNER_API_TIMEOUT_MS} with a Retry-After of up to ${DEFAULT_RETRY.maxRetryAfterMs / 1000} s waited out between them, then its write-back ` +
      `under DATABASE_STATEMENT_TIMEOUT_MS=${values.DATABASE_STATEMENT_TIMEOUT_MS}), and ${POLL_START_WINDOW_S} s to start polls in: ` +
      'a cycle starts no poll with less than the longest poll left of its lease, which could otherwise run out under it ' +
      '(another replica claims the order and polls it again, and the first answer is thrown away)',
  }
}

/**
 * Reads process.env: the only place in the service that does. A DATA_DIR the service will write (the embedded
 * database's, or local mode's secrets and sandbox state) is created here, or refused with its reason.
 */
export function loadConfig(): Config {
  // a value whose bytes are not UTF-8 was taken as Node decoded it, U+FFFD in it (not-utf8.ts); its value is
  // not shown: it may be a secret
  const notUtf8 = variablesNotUtf8([...CONFIG_VARIABLES, ...SECRET_FILE_NAMES])
  if (notUtf8.length > 0) {
    throw new ConfigError(notUtf8.map((name) => `${name}: is not UTF-8 text (Node read its bytes that are not as U+FFFD); give it in UTF-8`))
  }
  const config = parseConfig(process.env)
  if (!config.dataDir.startsWith('memory://') && (!config.databaseUrl || config.partner.mode === 'local')) usableDataDir(config.dataDir)
  return config
}

function usableDataDir(dataDir: string): void {
  const problem = dataDirProblem(dataDir)
  if (problem) throw new ConfigError([`DATA_DIR: ${problem}; set DATA_DIR to a directory this user can write`])
}

// The console's token is typed into browsers and kept by operators: one that is also a secret of another role gave
// whoever could log in that role too (with a webhook secret, signing deliveries the receiver takes as the
// platform's), and a token seen over a shoulder gave both. Said by name, never by value.
function sharedTokenProblems(token: string, values: { WEBHOOK_SECRETS?: string[] | undefined; PARTNER_API_SECRET?: string | undefined; SANDBOX_CONTROL_TOKEN?: string | undefined; FORWARD_SECRET?: string | undefined }, apiSecretName: string): string[] {
  const webhookSecrets = values.WEBHOOK_SECRETS ?? []
  const others: [string, boolean][] = [
    ...webhookSecrets.map((secret, index): [string, boolean] => [webhookSecrets.length > 1 ? `WEBHOOK_SECRETS (secret #${index + 1})` : 'WEBHOOK_SECRETS', secret === token]),
    [apiSecretName, values.PARTNER_API_SECRET === token],
    ['SANDBOX_CONTROL_TOKEN', values.SANDBOX_CONTROL_TOKEN === token],
    ['FORWARD_SECRET', values.FORWARD_SECRET !== undefined && forwardSecrets(values.FORWARD_SECRET).includes(token)],
  ]
  return others
    .filter(([, same]) => same)
    .map(([name]) => `ADMIN_TOKEN: is the same as ${name}; the console's token must be a secret of its own (whoever logs in would hold that one too)`)
}

// The console's token and where it came from: ADMIN_TOKEN, else local mode's generated secrets, else (local mode
// with its other secrets given) one made for this process, shown in the start-up banner
function adminTokenOf(
  given: string | undefined,
  generated: LocalSecrets | undefined,
  mode: 'local' | 'remote',
): Pick<Config, 'adminToken' | 'adminTokenFrom'> {
  if (given !== undefined) return { adminToken: given, adminTokenFrom: 'ADMIN_TOKEN' }
  if (generated) return { adminToken: generated.adminToken, adminTokenFrom: 'local-secrets' }
  if (mode === 'local') return { adminToken: randomBytes(32).toString('hex'), adminTokenFrom: 'this-process' }
  return { adminToken: undefined, adminTokenFrom: undefined }
}

export function localSecretsPath(dataDir: string): string {
  return path.join(dataDir, 'local-secrets.json')
}

/** Reads the local-mode secrets from DATA_DIR, generating them on first use (file mode 0600). */
export function readLocalSecrets(dataDir: string): LocalSecrets {
  usableDataDir(dataDir)
  const file = localSecretsPath(dataDir)
  // read first: a command on a full disk wrote (and failed to write) a file it did not need, and exited on a bare ENOSPC
  const written = existsSync(file) ? undefined : writingIntoDataDir(dataDir, () => writeLocalSecretsOnce(dataDir, file))
  if (written) return written
  let stored: Partial<LocalSecrets> = {}
  try {
    stored = JSON.parse(readFileSync(file, 'utf8')) as Partial<LocalSecrets>
    if (
      stored.webhookSecret &&
      stored.apiKeyId &&
      stored.apiSecret &&
      stored.sandboxControlToken &&
      stored.adminToken
    )
      return stored as LocalSecrets
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'EACCES' || code === 'EPERM') {
      throw new ConfigError([`DATA_DIR: its local secrets file ${file} cannot be read by this user (owned by ${ownerOf(file)}): ${leftByAnotherUser(dataDir, 1)}`])
    }
    if (code !== 'ENOENT') {
      throw new Error(`Cannot read the local secrets file ${file}; delete it to generate new secrets`, {
        cause: error,
      })
    }
  }
  // a file written before a secret existed keeps the secrets it has (the receiver's data was signed with them)
  const complete = stored.webhookSecret && stored.apiKeyId && stored.apiSecret
  const secrets: LocalSecrets = {
    webhookSecret: complete ? stored.webhookSecret! : randomBytes(32).toString('hex'),
    apiKeyId: complete ? stored.apiKeyId! : `pk_sandbox_${randomBytes(6).toString('hex')}`,
    apiSecret: complete ? stored.apiSecret! : randomBytes(32).toString('hex'),
    sandboxControlToken: stored.sandboxControlToken ?? randomBytes(32).toString('hex'),
    adminToken: randomBytes(32).toString('hex'),
  }
  // an older file missing a newer secret: replace it whole (rename), never leave it half-written
  const temporary = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`
  writingIntoDataDir(dataDir, () => {
    try {
      writeFileSync(temporary, `${JSON.stringify(secrets, null, 2)}\n`, { mode: 0o600 })
      renameSync(temporary, file)
    } finally {
      removeIfThere(temporary)
    }
  })
  return secrets
}

function newLocalSecrets(): LocalSecrets {
  return {
    webhookSecret: randomBytes(32).toString('hex'),
    apiKeyId: `pk_sandbox_${randomBytes(6).toString('hex')}`,
    apiSecret: randomBytes(32).toString('hex'),
    sandboxControlToken: randomBytes(32).toString('hex'),
    adminToken: randomBytes(32).toString('hex'),
  }
}

// First use: two commands started at once (or a command beside `serve`) must agree on one set of secrets
// and never read a half-written file. The file is written whole under a temporary name, then linked into
// place, which fails if another process got there first: then its file is the one, and is read instead.
function writeLocalSecretsOnce(dataDir: string, file: string): LocalSecrets | undefined {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 })
  const secrets = newLocalSecrets()
  return writeWholeUnlessThere(file, `${JSON.stringify(secrets, null, 2)}\n`) ? secrets : undefined
}

/** Every configured secret, for the log redaction and the tests that prove no log line holds one. */
export function configSecrets(config: Config): string[] {
  // the forward secret's base64 part is the key itself, and censoring it censors the whsec_ form too
  const forwardKeys = config.forward ? forwardSecrets(config.forward.secret).map((secret) => secret.slice(WEBHOOK_SECRET_PREFIX.length)) : []
  return [
    ...config.webhook.secrets,
    config.partner.secret,
    ...(config.sandbox.controlToken ? [config.sandbox.controlToken] : []),
    ...forwardKeys,
    ...(config.adminToken ? [config.adminToken] : []),
    ...(config.amqp ? urlPasswords(config.amqp.url) : []),
    ...(config.forward ? urlPasswords(config.forward.url) : []),
    ...[config.partner.proxy?.httpProxy, config.partner.proxy?.httpsProxy].flatMap((url) => (url ? urlPasswords(url) : [])),
  ]
}

/**
 * The shortest URL password censored wherever it appears. A shorter one is censored where a URL holds it
 * (`:partner@`): everywhere, compose's `partner` blanked every line's `partner-escrow` and `/webhooks/partner`, and
 * so told whoever read the log what it was.
 */
const MIN_BARE_URL_PASSWORD = 8

// the password as written in the URL (percent-encoded) and as sent to the broker or the forward receiver
function urlPasswords(url: string): string[] {
  const { password } = new URL(url)
  if (!password) return []
  let decoded = password
  try {
    decoded = decodeURIComponent(password)
  } catch {
    // a malformed escape: the written form is the one to censor
  }
  const forms = decoded === password ? [password] : [password, decoded]
  return forms.map((form) => (form.length >= MIN_BARE_URL_PASSWORD ? form : `:${form}@`))
}

function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object') {
    for (const inner of Object.values(value)) deepFreeze(inner)
    Object.freeze(value)
  }
  return value
}
