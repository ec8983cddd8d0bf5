// One Kysely instance for the whole process: real Postgres through a pg Pool when a URL is given,
// otherwise embedded PGlite persisted in a directory (or in memory for tests). PGlite is a single
// connection; Kysely's PGliteDialect queues transactions on it, so they never interleave.
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, rmSync } from 'node:fs'
import path from 'node:path'
import { CamelCasePlugin, Kysely, PGliteDialect, PostgresDialect, sql } from 'kysely'
import type pg from 'pg'
import { writingIntoDataDir } from '../data-dir.js'
import { pgDriver } from '../lazy-packages.js'
import type { Logger } from '../logger.js'
import { writeWholeUnlessThere } from '../write-whole.js'
import { ABANDONED_TAKEOVER_MS, lockOwner, lockOwnerRuns, ownLockContent, readIfThere, removeStaleLock, sleepSync } from '../lock-file.js'
import { answerBoundNow, AnswerBoundError } from './answer-bound.js'
import { commitSent, isCommit } from './commit-in-flight.js'
import { asConnectTimeout, CONNECT_TIMEOUT_MS, describeDatabaseError, errorCode, isPoolWaitTimeout, READ_ONLY } from './database-errors.js'
import { closeSocket, endWithin } from './end-within.js'
import type { Database, DatabaseKind } from './database.js'
import { PgliteThread } from './pglite-thread.js'
import { DEFAULT_MAX_WAL_BYTES, walStartParams } from './pglite-wal.js'
import { LISTENER_PROBE_MS, listenerName, listenOnPostgres } from './postgres-listener.js'
import { holdPrivateUmask, makeDirectoryPrivate } from './private-directory.js'
import { freeBytesOf } from './storage-guard.js'
import { SESSION_SETTINGS } from './session-defaults.js'
import { DEFAULT_STATEMENT_TIMEOUT_MS, STATEMENT_ANSWER_GRACE_MS } from './statement-timeout.js'
import { LONE_SURROGATE } from '../partner-api/field-rules.js'

/**
 * Stops a listener. On Postgres its session is ended politely, the server given `withinMs` at most (and a second at
 * most, LISTENER_END_MS) to see it out before the socket is closed: a stop gives it what is left of its share of
 * the shutdown bound, since over a path gone silent that answer never comes.
 */
export type Unlisten = (withinMs?: number) => Promise<void>

export interface DatabaseHandle {
  readonly db: Kysely<Database>
  readonly kind: DatabaseKind
  /** Pool use for metrics; PGlite reports its one connection. */
  poolStats(): { total: number; idle: number; waiting: number }
  close(): Promise<void>
  /** PGlite only: the whole data directory as a gzipped tarball, which `pgliteTemplate` starts from. */
  dumpDataDir?(): Promise<Blob>
  /** PGlite only: a full garbage collection on its thread, which frees what the database's start left there. */
  collectGarbage?(): Promise<void>
  /**
   * PGlite only: a VACUUM of the whole database, which makes the space of deleted and updated rows reusable.
   * PGlite runs Postgres as one process, without the autovacuum that does this on Postgres: without it, rows
   * pruned by retention keep their place on disk and the tables grow with every row ever written. On disk, not
   * started where the log it may write would not fit on DATA_DIR's disk (vacuumRoom): a warning [vacuum_deferred]
   * says so, and the next pass tries again.
   */
  vacuum?(): Promise<void>
  /**
   * Calls `onNotify` for every NOTIFY on `channel` (delivered on the notifier's commit), and also after a
   * lost connection is back (notifications sent meanwhile are gone: the caller should look). Postgres:
   * a dedicated connection outside the pool that reconnects with backoff and never throws; PGlite: its
   * own listen. Resolves to the function that stops listening (Unlisten). `payload` is the NOTIFY's; undefined
   * after a reconnect.
   */
  listen(channel: string, onNotify: (payload?: string) => void): Promise<Unlisten>
  /**
   * How many sessions of other processes listen on `channel` (this handle's own listeners not counted):
   * Postgres: the listener connections of every handle name themselves (application_name); undefined
   * when that cannot tell (this handle's own listener is not connected, or is not found under that name,
   * e.g. DATABASE_URL sets application_name). PGlite: 0, no other process can open its data directory.
   */
  otherListeners(channel: string): Promise<number | undefined>
  /**
   * Postgres: whether the listener hears what is sent through the pool. Each time a listener (re)connects, it
   * sends itself a NOTIFY through the pool and waits LISTENER_PROBE_MS for it: true once it came, false when it
   * did not (a connection pooler in transaction mode lends the LISTEN's session to others, and no notification
   * reaches it: DATABASE_LISTEN_URL), undefined before the first answer or when the NOTIFY could not be sent.
   * PGlite: absent (its own listen, in its one process).
   */
  notificationsHeard?(): boolean | undefined
  /**
   * Postgres: the statement_timeout the database applies to the pool's statements (ms, 0: none), beside the one
   * asked for. They differ behind a connection pooler that refuses or drops the startup parameter: there the
   * role's own setting (ALTER ROLE … SET statement_timeout) is what bounds a statement. PGlite: absent.
   */
  statementTimeoutInEffect?(): Promise<{ ms: number; wanted: number }>
  /**
   * Takes the advisory lock `key` if no other session holds it, in a transaction of its own on a connection
   * outside the pool, open until the returned release is called: resolves to that release, or to undefined when
   * another session holds the lock. The open transaction keeps one server session behind a pooler in transaction
   * mode, where a session's lock taken and given back as two statements stayed with a pooled session. The
   * connection's end gives the lock back too (a crash, a terminated backend). Postgres: the lock is the pair
   * (`key`, hashtext(current_schema())), so a service in another schema of the same database never holds this
   * one's; `key` fits a 32-bit integer. `onLost` is called once if the lock's connection is lost before the release
   * (a backend terminated by a DBA's script, a network cut): the lock is gone with it, and another session may
   * take it. PGlite: always granted, nothing else can open its data directory, never lost.
   */
  holdLock(key: number, onLost?: () => void): Promise<(() => Promise<void>) | undefined>
  /**
   * Runs `work` where no timeout of the service's ends a statement, for the migrations, which may rewrite or index
   * a large table for minutes: on Postgres a connection of its own, opened for it and closed after, without the
   * pool's statement_timeout and its wait for an answer. PGlite: on `db`, where no statement is bounded.
   */
  withoutTimeouts<T>(work: (db: Kysely<Database>) => Promise<T>): Promise<T>
}

export interface OpenDatabaseOptions {
  /** postgres:// URL; when absent, embedded PGlite is used. */
  databaseUrl?: string | undefined
  /**
   * Postgres: the URL of the LISTEN connection (DATABASE_LISTEN_URL), a direct one where databaseUrl goes
   * through a connection pooler in transaction mode; databaseUrl when absent.
   */
  listenUrl?: string | undefined
  /** PGlite's data directory; 'memory://' for a throwaway database. */
  dataDir?: string
  /** A `dumpDataDir()` tarball for PGlite to start from instead of initialising an empty cluster (tests). */
  pgliteTemplate?: Blob | undefined
  poolSize?: number
  /**
   * Postgres: the database cancels a statement of the pool's that runs longer than this (statement_timeout,
   * sent when each connection starts), and the client stops waiting for an answer STATEMENT_ANSWER_GRACE_MS
   * later. Default DEFAULT_STATEMENT_TIMEOUT_MS.
   */
  statementTimeoutMs?: number
  /** Postgres: how often the listener probes a connection that heard its first probe (LISTENER_CHECK_MS; tests). */
  listenerCheckMs?: number
  /**
   * PGlite: how long to wait for the embedded database's lock while a running process holds it (`serve`: a command
   * typed in a second terminal while the service started had opened it for a second, and the service exited 1).
   * Absent: refused at once.
   */
  lockWaitMs?: number
  /** PGlite: opened for one short command, not for the service (pglite-thread.ts, compileForShortRuns). */
  shortRun?: boolean
  /** PGlite: its max_wal_size (DATA_DIR_MAX_WAL), in bytes; DEFAULT_MAX_WAL_BYTES when absent. */
  maxWalBytes?: number | undefined
  /**
   * PGlite on disk: the free space a VACUUM leaves on DATA_DIR's disk, at least (DATA_DIR_MIN_FREE, the storage
   * guard's minimum); 0 when absent.
   */
  minFreeBytes?: number | undefined
  /** PGlite on disk: the free space of DATA_DIR's file system, in bytes (tests give their own). */
  readFreeBytes?: ((directory: string) => Promise<number>) | undefined
  logger?: Logger
}

export function openDatabase(options: OpenDatabaseOptions): DatabaseHandle {
  return options.databaseUrl ? openPostgres(options.databaseUrl, options) : openPglite(options)
}

/** A statement starting with this comment is sent as a named prepared statement on Postgres. */
export const PREPARED = '/* prepared */'

// The hot-path statements (the webhook ingest) are large; preparing them once per connection saves
// their planning on every delivery. The name is a hash of the text, so each distinct text gets its own.
//
// Behind a connection pooler in transaction mode (PgBouncer before 1.21, or without max_prepared_statements)
// a client's statements run on whichever server session the pooler lends it for each transaction, and a
// session never has the statements another one prepared: Postgres answers 42P05 (already exists) or 26000 (does
// not exist), before running anything. Every delivery was answered 500 there. The first such answer turns
// preparing off for the pool's clients (one warning says why), and its statement is sent again unnamed when no
// transaction was open (a transaction the error aborted fails as any failed statement does).
//
// Every client listens for 'error' from the moment it exists. pg's pool listens only while a client is
// idle; a checked-out client whose connection drops (pg_terminate_backend, a failover, a proxy cutting
// it) emits 'error' with nobody listening, and Node ends the process on an unhandled 'error' event. The
// statement running on it fails on its own (the caller answers 503) and the pool discards the client
// on release, so the listener only has to record what happened.
const NAMED_STATEMENT_LOST = new Set(['42P05', '26000'])

// A write refused as read-only (25006) on a connection: the session may have begun while the database was made
// read-only for maintenance (ALTER DATABASE or ALTER ROLE … SET default_transaction_read_only = on), and keeps that
// default when the DBA turns it off again. Such connections answered every delivery 503 for as long as they were
// in use, which under a steady load is for good (the pool closes a connection only once idle for 30 s). Given
// back, one is closed, not handed out again: the next is a new session with the defaults of now. On a standby
// (a failover under way) that makes one new connection per refused write, which ends when the writes do.
//
// A connection whose answer the client stopped waiting for (pg's `Query read timeout`, STATEMENT_ANSWER_GRACE_MS
// after the statement timeout: the database did not even answer its cancellation) is closed when given back too.
// pg leaves the unanswered statement on it, so it used to go back to the pool idle and be handed out again: every
// later statement given it queued behind the one that never ends, waited its 15 s and failed, and each delivery
// was answered 503 until the operating system gave up on the connection, hours later, while a new connection
// would have worked at once.
type PreparingClientInstance = pg.PoolClient & { refusedWrite?: boolean; answerLost?: boolean; sessionSet?: boolean }

// the pool's connection, closed on its release when a write was refused on it as read-only or an answer never came
function readOnlyGoesAway(client: pg.PoolClient): pg.PoolClient {
  const release = client.release.bind(client)
  client.release = (destroy?: Error | boolean) => {
    const { refusedWrite, answerLost } = client as PreparingClientInstance
    // its socket is closed here: ending the session politely would queue behind what never got through
    if (answerLost === true) closeSocket(client)
    release(destroy || refusedWrite === true || answerLost === true)
  }
  return client
}

// pg's error when query_timeout ended the wait for an answer (the statement is still on the connection)
const ANSWER_LOST = 'Query read timeout'

interface PreparingHooks {
  onConnectionError: (error: Error) => void
  /** Once: named statements failed as through a pooler in transaction mode; none is prepared from now on. */
  onPreparingOff: (code: string) => void
  /** The startup parameters each new connection sends besides the pool's own (statement_timeout). */
  startupParameters: () => pg.ClientConfig
}

type AnswerBound = NonNullable<ReturnType<typeof answerBoundNow>>

/** A statement's query config, with what is left of the deadline asked for around it (answer-bound.ts) when there is one. */
function boundBy<T extends object>(config: T, bound: AnswerBound | undefined): T & { query_timeout?: number } {
  if (bound !== undefined) (config as T & { query_timeout?: number }).query_timeout = bound.leftMs
  return config
}

function preparingClient({ onConnectionError, onPreparingOff, startupParameters }: PreparingHooks): typeof pg.Client {
  let preparing = true
  return class PreparingClient extends pgDriver().Client {
    constructor(config?: string | pg.ClientConfig) {
      super(typeof config === 'object' ? { ...config, ...startupParameters() } : config)
      this.on('error', onConnectionError)
    }

    /** A write was refused on this connection as read-only (25006): it is not handed out again (readOnlyGoesAway). */
    refusedWrite = false

    /** The client stopped waiting for an answer on this connection: it is not handed out again (readOnlyGoesAway). */
    answerLost = false

    override query(...args: unknown[]): never {
      const [text, values] = args
      const query = super.query as (...a: unknown[]) => never
      const plain = args.length <= 2 && typeof text === 'string' && (values === undefined || Array.isArray(values))
      // a shorter wait for the answer asked for around this statement (answer-bound.ts: a console page's)
      const bound = plain ? this.boundNow() : undefined
      // its deadline past already (the page's earlier waits took it all): not sent, the connection left as it is (in a
      // transaction, its ROLLBACK is refused so too, and Kysely discards a connection whose ROLLBACK failed)
      if (bound?.leftMs === 0) return Promise.reject(new AnswerBoundError(bound.boundMs)) as never
      if (preparing && plain && (text as string).startsWith(PREPARED)) {
        const outsideTransaction = this.getTransactionStatus() !== 'T'
        const named = query.call(this, boundBy({ name: preparedName(text as string), text, values }, bound)) as Promise<unknown>
        return named.catch((error: unknown) => {
          const code = (error as { code?: unknown }).code
          if (typeof code !== 'string' || !NAMED_STATEMENT_LOST.has(code)) throw this.noted(error, bound)
          if (preparing) {
            preparing = false
            onPreparingOff(code)
          }
          if (!outsideTransaction) throw error
          return (query.call(this, boundBy({ text, values }, bound)) as Promise<unknown>).catch((again: unknown) => {
            throw this.noted(again, bound)
          })
        }) as never
      }
      const result = (bound === undefined ? query.call(this, ...args) : query.call(this, boundBy({ text, values }, bound))) as unknown
      // Kysely's calls return a promise (no callback given); pg's own (a callback, a Submittable) pass through
      if (!(result instanceof Promise)) return result as never
      // a COMMIT in flight leaves its transaction's outcome unknown until it is answered (commit-in-flight.ts)
      const answered = isCommit(text) ? commitSent() : undefined
      return result.then(
        (value: unknown) => {
          answered?.()
          return value
        },
        (error: unknown) => {
          answered?.()
          throw this.noted(error, bound)
        },
      ) as never
    }

    /** The deadline asked for around the statement being sent, when what is left of it is shorter than the pool's own wait. */
    private boundNow(): AnswerBound | undefined {
      const asked = answerBoundNow()
      const own = (this as unknown as { connectionParameters: { query_timeout?: number } }).connectionParameters.query_timeout
      return asked !== undefined && (!own || asked.leftMs < own) ? asked : undefined
    }

    private noted(error: unknown, bound?: AnswerBound): unknown {
      if (errorCode(error) === READ_ONLY) this.refusedWrite = true
      if (error instanceof Error && error.message === ANSWER_LOST) {
        this.answerLost = true
        // the bound asked for ended the wait, not the pool's: said as such (database-errors.ts)
        if (bound !== undefined) return new AnswerBoundError(bound.boundMs, 'answer', error)
      }
      return error
    }
  }
}

/**
 * A connection from `connect`, waited for until the deadline asked for around the caller (answer-bound.ts: a console
 * page's), if any: the wait for a connection is one of the page's waits, and ends with them. A connection had after the
 * deadline is given back.
 *
 * The pool's own wait for a connection (`poolWaitMs`, its connect timeout) runs beside it. When it is no shorter than
 * what is left of the deadline, the deadline ended the wait, whichever of the two timers Node runs first, and the
 * error says so (AnswerBoundError, the pool's as its cause); when it is shorter, the pool's own wait ended it, in its
 * own words. The console's deadline is as long as the pool's wait, and its timer, set first with the time left rounded
 * down, falls due first, but that did not make it run first: Node keeps one list of timers per length and runs, in
 * each list it gets to, every timer due by then, the lists in the order of their first timer's time. A list keeps the
 * time of a first timer cleared since (the pool's wait of the statement before, handed the idle connection) and takes
 * that of any earlier 5-s timer of the process: a loop that woke late (a CI machine at a load of 20) found both waits
 * due and could run the 5,000-ms list first, and the pool's wait with it. A page whose statements raced for a pool of
 * one then logged the pool's words (`the database connection was lost or timed out`) for a wait its deadline had ended.
 */
async function connectWithinBound(connect: () => Promise<pg.PoolClient>, poolWaitMs: number): Promise<pg.PoolClient> {
  const asked = answerBoundNow()
  if (asked === undefined) return connect()
  if (asked.leftMs === 0) throw new AnswerBoundError(asked.boundMs, 'connection')
  let timer: NodeJS.Timeout | undefined
  const ended = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new AnswerBoundError(asked.boundMs, 'connection')), asked.leftMs)
  })
  const connecting = connect()
  try {
    return await Promise.race([connecting, ended])
  } catch (error) {
    if (error instanceof AnswerBoundError) connecting.then((client) => client.release(), () => {})
    // the pool's wait ran out no sooner than the deadline: the deadline's, its timer run later
    else if (poolWaitMs >= asked.leftMs && isPoolWaitTimeout(error)) throw new AnswerBoundError(asked.boundMs, 'connection', error as Error)
    throw error
  } finally {
    clearTimeout(timer)
  }
}

// The names of the texts prepared lately. The ingest's text is one string compiled once (apply-observation.ts), so its
// name is found here without hashing its 6 kB again at every statement; the cap bounds the memory for texts that differ
// (a few kinds of statement are prepared; a text made anew each time is hashed again, as before)
const preparedNames = new Map<string, string>()
const PREPARED_NAMES_KEPT = 64

function preparedName(text: string): string {
  let name = preparedNames.get(text)
  if (name === undefined) {
    name = `p_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`
    if (preparedNames.size >= PREPARED_NAMES_KEPT) preparedNames.clear()
    preparedNames.set(text, name)
  }
  return name
}

/**
 * PGlite with the PREPARED statements prepared once in its one session: `PREPARE` the text, then `EXECUTE`
 * it. Parsing and planning the ingest statement took 1.3 ms of the embedded database's time on every group
 * (bench/results/latest.md). EXECUTE takes no bound parameters, so the values go in as dollar-quoted
 * literals, which no character can end early (a value holding the tag gets a longer one). A statement with
 * a value of another kind than text, number, boolean, date or null, with a text holding a NUL or a lone
 * surrogate, or one that cannot be prepared, runs as before. Statements inside a transaction go through
 * PGlite's transaction object, unprepared. Kysely runs one statement at a time on PGlite's one connection,
 * so a text is never prepared twice at once.
 */
function preparingPglite(pglite: PgliteThread): PgliteThread {
  // text → its prepared name; null: not preparable, sent as it is
  const names = new Map<string, string | null>()
  const query: PgliteThread['query'] = async (text, params, options) => {
    const values = params ?? []
    const literals = text.startsWith(PREPARED) ? values.map(literalOf) : undefined
    if (!literals || literals.includes(undefined)) return pglite.query(text, params, options)
    let name = names.get(text)
    if (name === undefined) {
      name = preparedName(text)
      try {
        await pglite.query(`prepare ${name} as ${text}`)
      } catch {
        name = null
      }
      names.set(text, name)
    }
    if (name === null) return pglite.query(text, params, options)
    return pglite.query(literals.length > 0 ? `execute ${name}(${literals.join(', ')})` : `execute ${name}`, [], options)
  }
  return new Proxy(pglite, {
    get(target, property) {
      if (property === 'query') return query
      const value: unknown = Reflect.get(target, property, target)
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value
    },
  })
}


/** Whether the tag occurs across the text's end and the closing tag (only the text's last characters are copied). */
function endsInTagStart(text: string, tag: string): boolean {
  const tail = text.slice(-(tag.length - 1))
  return `${tail}${tag}`.indexOf(tag) !== tail.length
}

/** A value as an SQL literal of unknown type (the prepared statement's parameter types it); undefined: not one of ours. */
function literalOf(value: unknown): string | undefined {
  if (value === null || value === undefined) return 'null'
  let text: string
  // a NUL would end the statement's text early, and a lone surrogate would be re-encoded without a word:
  // such a value goes as a bound parameter, and meets the database's own refusal
  if (typeof value === 'string') {
    if (value.includes('\u0000') || LONE_SURROGATE.test(value)) return undefined
    text = value
  } else if (typeof value === 'number' || typeof value === 'bigint' || typeof value === 'boolean') text = String(value)
  else if (value instanceof Date) text = value.toISOString()
  else return undefined
  // the literal ends at the tag's first occurrence after the opening one: not in the text, nor made of its last
  // characters and the closing tag (a text ending in `$v` ended `$v$…$v$v$` three characters early)
  let tag = '$v$'
  for (let n = 1; text.includes(tag) || endsInTagStart(text, tag); n++) tag = `$v${n}$`
  return `${tag}${text}${tag}`
}

// A statement that outlives the client's wait used to run on after its caller had answered 503: a delivery
// held up by a lock another session kept (an operator's open transaction) was written once the lock went, after
// the platform had been told to send it again, and the pool's connection stayed behind the statement, so the
// next statements given that connection waited and failed too. The database now cancels the statement itself
// (statement_timeout, a startup parameter of every connection), so a 503 leaves nothing behind, and the
// connection is free again at once.
//
// A connection pooler may refuse that startup parameter (PgBouncer: 08P01 "unsupported startup parameter"); the
// pool's connections then start without it, and the service says so at start-up (statementTimeoutInEffect).
const refusesStartupTimeout = (error: unknown) =>
  (error as { code?: unknown }).code === '08P01' && /statement_timeout/.test((error as Error).message)

function openPostgres(
  databaseUrl: string,
  { poolSize = 10, logger, listenUrl, statementTimeoutMs = DEFAULT_STATEMENT_TIMEOUT_MS, listenerCheckMs }: OpenDatabaseOptions,
): DatabaseHandle {
  let timeoutOnConnect = true
  const connectionLost = (error: Error) => {
    logger?.warn({ err: describeDatabaseError(error) }, 'database connection lost')
  }
  const preparingOff = (code: string) => {
    logger?.warn(
      { code },
      'named prepared statements fail on this database connection (a pooler in transaction mode?): statements are no longer prepared',
    )
  }
  const Client = preparingClient({
    onConnectionError: connectionLost,
    onPreparingOff: preparingOff,
    startupParameters: () => (timeoutOnConnect ? { statement_timeout: statementTimeoutMs } : {}),
  })
  const pool = new (pgDriver().Pool)({
    Client,
    connectionString: databaseUrl,
    max: poolSize,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    idleTimeoutMillis: 30_000,
    // a statement stuck behind a dead connection must fail fast so the caller can answer 503
    query_timeout: statementTimeoutMs + STATEMENT_ANSWER_GRACE_MS,
    keepAlive: true,
  })
  // an idle client that loses its connection is removed and reported on the pool as well; its own
  // listener above has logged it already, and without a listener here the pool's 'error' would be fatal
  pool.on('error', () => {})
  // a connection refused for its statement_timeout is made again without it, and so is every later one
  const capped = connectionCap(pool, poolSize, logger)
  const connect = async (): Promise<pg.PoolClient> => {
    try {
      return readOnlyGoesAway(await withSessionSettings(await pool.connect()))
    } catch (error) {
      if (refusesStartupTimeout(error)) {
        timeoutOnConnect = false
        return connect()
      }
      // past the server's cap, with connections of our own to wait for: wait for one of them
      if (capped(error)) return connect()
      throw error
    }
  }
  const db = new Kysely<Database>({
    dialect: new PostgresDialect({ pool: { connect: () => connectWithinBound(connect, pool.options.connectionTimeoutMillis ?? 0), end: () => pool.end(), options: pool.options, Client } }),
    plugins: [new CamelCasePlugin()],
  })
  // the backend pids of this handle's listener connections
  const ownListeners = new Set<number>()
  // the last probe's answer (notificationsHeard), and whether the warning of a deaf listener was written
  let hearing: boolean | undefined
  let warnedDeaf = false
  return {
    db,
    kind: 'postgres',
    poolStats: () => ({ total: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount }),
    listen: async (channel, onNotify) =>
      listenOnPostgres({
        url: listenUrl ?? databaseUrl,
        setting: listenUrl === undefined ? 'DATABASE_URL' : 'DATABASE_LISTEN_URL',
        channel,
        onNotify,
        logger,
        ownListeners,
        ...(listenerCheckMs !== undefined ? { checkMs: listenerCheckMs } : {}),
        sendProbe: async (payload) => {
          await sql`select pg_notify(${channel}, ${payload})`.execute(db)
        },
        onProbe: (heard) => {
          hearing = heard
          if (!heard && !warnedDeaf) {
            warnedDeaf = true
            logger?.warn(
              { probeMs: LISTENER_PROBE_MS, direct: listenUrl !== undefined },
              listenUrl === undefined
                ? "notifications sent through DATABASE_URL do not reach this replica's listener (a connection pooler in transaction mode?): other replicas' commits wake it only at its next look, 30 s at most; set DATABASE_LISTEN_URL to a direct connection"
                : "notifications sent through DATABASE_URL do not reach the listener on DATABASE_LISTEN_URL: are the two URLs the same database? other replicas' commits wake this one only at its next look, 30 s at most",
            )
          }
        },
      }),
    notificationsHeard: () => hearing,
    statementTimeoutInEffect: async () => {
      const { rows } = await sql<{ ms: number }>`select setting::int as ms from pg_settings where name = 'statement_timeout'`.execute(db)
      return { ms: rows[0]?.ms ?? 0, wanted: statementTimeoutMs }
    },
    otherListeners: async (channel) => {
      if (ownListeners.size === 0) return undefined
      const { rows } = await pool.query<{ own: number; others: number }>(
        `select count(*) filter (where pid = any($2::int[]))::int as own,
           count(*) filter (where not (pid = any($2::int[])))::int as others
         from pg_stat_activity where datname = current_database() and application_name = $1`,
        [listenerName(channel), [...ownListeners]],
      )
      const [row] = rows
      return row && row.own > 0 ? row.others : undefined
    },
    holdLock: (key, onLost) => holdLockOnPostgres(databaseUrl, key, logger, statementTimeoutMs + STATEMENT_ANSWER_GRACE_MS, onLost),
    withoutTimeouts: async (work) => {
      const single = new (pgDriver().Pool)({
        Client: preparingClient({ onConnectionError: connectionLost, onPreparingOff: preparingOff, startupParameters: () => ({}) }),
        connectionString: databaseUrl,
        max: 1,
        connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
        keepAlive: true,
      })
      single.on('error', () => {})
      const settled = { connect: async () => withSessionSettings(await single.connect()), end: () => single.end(), options: single.options }
      const unbounded = new Kysely<Database>({ dialect: new PostgresDialect({ pool: settled }), plugins: [new CamelCasePlugin()] })
      try {
        return await work(unbounded)
      } finally {
        await unbounded.destroy()
      }
    },
    close: () => db.destroy(),
  }
}

// Each connection of the service's own pools starts with the session settings its statements and the driver
// are written for (session-defaults.ts: READ COMMITTED, ISO dates), whatever a DBA made the database's or the
// role's defaults: the first time the pool hands a connection out, they are set, and the caller's first statement
// waits for them. They used to be sent from the pool's 'connect' event without waiting, so the caller's statement
// queued behind them on the connection: pg deprecates a query sent while one is running, and pg 9 removes it.
// A connection whose settings fail is closed, and the caller gets the error (a lost connection: 503).
async function withSessionSettings(client: pg.PoolClient): Promise<pg.PoolClient> {
  const connection = client as PreparingClientInstance
  if (connection.sessionSet === true) return client
  try {
    await client.query(SESSION_SETTINGS)
  } catch (error) {
    client.release(true)
    throw error
  }
  connection.sessionSet = true
  return client
}

// 53300: the server opens no more sessions for this role (ALTER ROLE … CONNECTION LIMIT), this database (its
// CONNECTION LIMIT) or anyone (max_connections, other applications' sessions counted). A pool allowed more than that
// failed each statement that waited for a connection past the cap, answered 503, though the connections it held
// were given back moments later. Refused so, the pool keeps the connections it has as its size, and a statement
// waits for one of them; a minute later it may try to open more again, in case the cap was raised or the other
// applications' sessions went. Said in a warning each time the size is lowered.
const TOO_MANY_CONNECTIONS = '53300'
const CONNECTION_CAP_RETRY_MS = 60_000

/** Whether `error` lowered the pool's size to the connections it has (true: connect again and wait for one). */
function connectionCap(pool: pg.Pool, poolSize: number, logger: Logger | undefined): (error: unknown) => boolean {
  const options = pool.options as { max: number }
  let restore: NodeJS.Timeout | undefined
  return (error) => {
    if (errorCode(error) !== TOO_MANY_CONNECTIONS || pool.totalCount === 0) return false
    // connections still being opened count too: each that fails after lowers the size again, said once a minute
    options.max = Math.min(options.max, pool.totalCount)
    if (restore) return true
    logger?.warn(
      { code: TOO_MANY_CONNECTIONS, poolSize, keeps: options.max },
      `the database refused a connection past ${options.max} (the role's or the database's connection limit, or max_connections): ` +
        `this pool keeps at most ${options.max} of its DATABASE_POOL_SIZE ${poolSize} for a minute, statements waiting for one; ` +
        'lower DATABASE_POOL_SIZE (for every replica together) or raise the limit',
    )
    restore = setTimeout(() => {
      options.max = poolSize
      restore = undefined
    }, CONNECTION_CAP_RETRY_MS).unref()
    return true
  }
}

// How long giving a lock back waits for the server to see its session out before closing the socket itself.
const LOCK_END_MS = 1_000

async function holdLockOnPostgres(
  databaseUrl: string,
  key: number,
  logger: Logger | undefined,
  answerTimeoutMs: number,
  onLost: (() => void) | undefined,
): Promise<(() => Promise<void>) | undefined> {
  // the key is written into the statement (below): one of our constants, an integer
  if (!Number.isInteger(key) || key < -0x80000000 || key > 0x7fffffff) throw new RangeError(`lock key must be a 32-bit integer, not ${key}`)
  // its statements are short; one with no answer by the pool's own wait is on a connection that died silently: the
  // lock goes with the session, and giving it back must not wait on it (a prune pass's release held a stop)
  const client = new (pgDriver().Client)({ connectionString: databaseUrl, keepAlive: true, connectionTimeoutMillis: CONNECT_TIMEOUT_MS, query_timeout: answerTimeoutMs })
  // a connection lost while the lock is held gives the lock back with it; its release then has nothing to do, and
  // its holder is told (onLost), for another session may take the lock now
  let held = false
  const lost = () => {
    if (!held) return
    held = false
    onLost?.()
  }
  client.on('error', (error) => {
    logger?.warn({ err: describeDatabaseError(error) }, 'lock connection lost')
    lost()
  })
  client.on('end', lost)
  try {
    // given up on at the connect timeout, said in the words of the pool's (database-errors.ts): its own were a bare
    // `timeout expired`, where every other connection to a database that took it and never answered names the wait
    await client.connect().catch((error: unknown) => {
      throw asConnectTimeout(error)
    })
    // One message, sent without parameters, so the session holds no snapshot while it idles in its transaction for
    // the pass (batches and pauses). A statement sent with parameters (the extended protocol) leaves its portal open
    // until the next statement, and with it the statement's snapshot: the session's backend_xmin stayed set for the
    // whole pass, and no VACUUM anywhere in the database could remove a row deleted meanwhile (a 33-s pass of
    // 300,000 rows kept 10,000 dead rows of an unrelated table). For the same reason the transaction is READ
    // COMMITTED whatever the role's or the database's default: under REPEATABLE READ its first statement's snapshot
    // is the transaction's. The key is a constant of ours (an integer, written inline); the schema comes from
    // current_schema().
    // idle_in_transaction_session_timeout: the transaction idles for as long as the lock is held, and a timeout of
    // the role or the database ended the session, and with it the lock, in the middle of the pass, while another
    // replica's pass could start beside it. SET LOCAL, in the same message as the BEGIN: no moment idle in the
    // transaction before it (a `set` sent after `begin` on a loaded machine lost the session there), and behind a
    // pooler in transaction mode it does not stay with a server session that other clients are given next.
    // The lock is this schema's service's: advisory locks are the whole database's, and a service in another schema
    // beside ours (a shared database, README) that held `key` alone made every pass here do nothing meanwhile.
    const answers = (await client.query(
      'begin isolation level read committed; set local idle_in_transaction_session_timeout = 0; ' +
        `select pg_try_advisory_xact_lock(${key}, hashtext(current_schema())) as locked`,
    )) as unknown as pg.QueryResult<{ locked: boolean }>[]
    const rows = answers.at(-1)?.rows ?? []
    if (rows[0]?.locked !== true) {
      await client.end()
      return undefined
    }
    held = true
  } catch (error) {
    await client.end().catch(() => {})
    throw error
  }
  return async () => {
    held = false
    await client.query('commit').catch(() => {})
    await endWithin(client, LOCK_END_MS)
  }
}

/** False until PGlite initialised DATA_DIR (its first start, which takes seconds). */
export function embeddedDatabaseExists(dataDir: string): boolean {
  return dataDir.startsWith('memory://') || existsSync(path.join(dataDir, 'pglite', 'PG_VERSION'))
}

const PGLITE_SHARED_BUFFERS = '32MB'
function openPglite({
  dataDir = 'memory://',
  logger,
  pgliteTemplate,
  lockWaitMs = 0,
  shortRun = false,
  maxWalBytes = DEFAULT_MAX_WAL_BYTES,
  minFreeBytes = 0,
  readFreeBytes = freeBytesOf,
}: OpenDatabaseOptions): DatabaseHandle {
  const inMemory = dataDir.startsWith('memory://')
  const location = inMemory ? dataDir : path.join(dataDir, 'pglite')
  let unlock = () => {}
  if (!inMemory) {
    // the data directory holds the database and local mode's secrets: 0700, files 0600, whatever the umask
    // a full disk or a directory turned read-only since the last start: said as DATA_DIR's (exit 2), not a bare ENOSPC
    const releaseUmask = holdPrivateUmask()
    try {
      const release = writingIntoDataDir(dataDir, () => {
        makeDirectoryPrivate(dataDir)
        mkdirSync(location, { recursive: true })
        return lockDataDirectory(location, lockWaitMs)
      })
      unlock = () => {
        release()
        releaseUmask()
      }
    } catch (error) {
      releaseUmask()
      throw error
    }
  }
  // on a thread of its own, so the database's work does not hold up the requests (pglite-thread.ts)
  const pglite = new PgliteThread({
    location,
    template: pgliteTemplate,
    // Postgres's default cache (128 MB) becomes resident in this process as it fills; the embedded
    // database is local mode's and the tests', with data measured in megabytes (bench/local-memory.ts)
    startParams: ['-c', `shared_buffers=${PGLITE_SHARED_BUFFERS}`, ...walStartParams(maxWalBytes)],
    shortRun,
    logger,
  })
  // PGlite unpacks a new database with its own modes (0666), past the umask: tighten once it is ready
  // (until then the 0700 directory keeps others out)
  if (!inMemory) {
    pglite.waitReady
      .then(() => makeDirectoryPrivate(dataDir))
      .catch((error: unknown) =>
        logger?.warn({ err: error, dataDir }, 'cannot make the embedded database files private'),
      )
  }
  const db = new Kysely<Database>({
    dialect: new PGliteDialect({ pglite: preparingPglite(pglite) }),
    plugins: [new CamelCasePlugin()],
  })
  return {
    db,
    kind: 'pglite',
    poolStats: () => ({ total: 1, idle: 1, waiting: 0 }),
    collectGarbage: () => pglite.collectGarbage(),
    vacuum: async () => {
      if (!inMemory) {
        const room = await vacuumRoom(db, dataDir, minFreeBytes, readFreeBytes)
        if (room.neededBytes > room.spareBytes) {
          logger?.warn(
            { neededMb: mbUp(room.neededBytes), freeMb: mbDown(room.freeBytes), minFreeMb: mbUp(minFreeBytes), dataDir },
            `VACUUM deferred: it may write up to ${mbUp(room.neededBytes)} MB of write-ahead log, and DATA_DIR's disk has ` +
              `${mbDown(room.freeBytes)} MB free, ${mbUp(minFreeBytes)} MB of which it keeps (DATA_DIR_MIN_FREE); the next ` +
              'pruning pass tries again [vacuum_deferred]',
          )
          return
        }
      }
      await sql`vacuum`.execute(db)
    },
    dumpDataDir: async () => {
      await pglite.waitReady
      return pglite.dumpDataDir()
    },
    // one process, one connection: the statement's NOTIFY reaches this same session on commit
    otherListeners: async () => 0,
    holdLock: async () => async () => {},
    withoutTimeouts: (work) => work(db),
    listen: async (channel, onNotify) => {
      const unlisten = await pglite.listen(channel, (payload) => onNotify(payload))
      return async () => {
        if (!pglite.closed) await unlisten()
      }
    },
    close: async () => {
      await db.destroy()
      if (!pglite.closed) await pglite.close()
      unlock()
    },
  }
}

/**
 * What a VACUUM of the embedded database may write to its log, and the room DATA_DIR's disk has for it. The log a
 * VACUUM writes is at most a full-page image and a record for each page it changes (heap, index, visibility and free
 * space maps): the database's size bounds it. It is one statement, during which no checkpoint runs (PGlite has one
 * session: the checkpoints come between statements, pglite-worker.mjs), so all of it stays in pg_wal until the next
 * checkpoint. A log that fills the disk stops the database (pglite-thread.ts): a VACUUM that may not fit is not
 * started. `spareBytes`: the free space less what the storage guard keeps.
 */
async function vacuumRoom(
  db: Kysely<Database>,
  dataDir: string,
  minFreeBytes: number,
  readFreeBytes: (directory: string) => Promise<number>,
): Promise<{ neededBytes: number; freeBytes: number; spareBytes: number }> {
  const { rows } = await sql<{ bytes: string }>`select pg_database_size(current_database())::text as bytes`.execute(db)
  const neededBytes = Number(rows[0]!.bytes)
  const freeBytes = await readFreeBytes(dataDir)
  return { neededBytes, freeBytes, spareBytes: freeBytes - minFreeBytes }
}

const mbUp = (count: number) => Math.ceil(count / 1024 / 1024)
const mbDown = (count: number) => Math.floor(count / 1024 / 1024)

export class DatabaseInUseError extends Error {
  override name = 'DatabaseInUseError'
}

// PGlite is one process's database: a second process opening the same directory would corrupt it.
// A lock file holding the owner's pid refuses that with a clear message; a dead owner's lock is taken over.
// A lock holding this process's own pid, and not taken here, was left by a dead owner that had the same pid:
// a container's pid 1 restarted after a crash. Beside the pid, the owner's start time where the system tells it
// (Linux's /proc): a pid given since to another process (a `sleep`, a shell) is not the owner, whose lock was
// otherwise blamed on it for good.
const locksTakenHere = new Set<string>()

// how often a wait for the lock (lockWaitMs) looks again
const LOCK_WAIT_STEP_MS = 50

function lockDataDirectory(location: string, waitMs: number): () => void {
  const lockFile = path.join(location, 'partner-escrow.lock')
  const mine = ownLockContent()
  const waitUntil = Date.now() + waitMs
  // a try ends in the lock, a refusal, or a stale lock removed (or being removed by another process): then again;
  // a wait for a running owner adds its own tries
  for (let attempt = 0; attempt < 200; attempt++) {
    if (writeWholeUnlessThere(lockFile, mine)) {
      locksTakenHere.add(lockFile)
      return () => {
        locksTakenHere.delete(lockFile)
        rmSync(lockFile, { force: true })
      }
    }
    const seen = readIfThere(lockFile)
    if (seen === undefined) continue
    const { pid: owner, started: ownerStarted } = lockOwner(seen)
    const alive = owner === process.pid ? locksTakenHere.has(lockFile) : lockOwnerRuns(owner, ownerStarted)
    if (Number.isInteger(owner) && owner > 0 && alive) {
      if (owner !== process.pid && Date.now() < waitUntil) {
        sleepSync(LOCK_WAIT_STEP_MS)
        attempt--
        continue
      }
      throw new DatabaseInUseError(
        `The embedded database in ${location} is in use by process ${owner} (a running \`npm start\`, or a command). ` +
          'Embedded PGlite serves one process: stop that process first, or set DATABASE_URL to share a Postgres. ' +
          '[data_dir_in_use]',
      )
    }
    if (!removeStaleLock(lockFile, seen, mine)) sleepSync(5)
  }
  // the tries ran out with a stale lock still there, its take-over marked by another process all along
  throw new DatabaseInUseError(
    `Cannot lock the embedded database in ${location}: its lock is stale and another process is taking it over ` +
      `(a ${path.basename(lockFile)}.….takeover file there, left by a process that died in the take-over, counts as ` +
      `abandoned after ${ABANDONED_TAKEOVER_MS / 1_000} s); try again [data_dir_in_use]`,
  )
}

