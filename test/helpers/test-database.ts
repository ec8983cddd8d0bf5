// A fresh, migrated database for one test file: in-memory PGlite by default, or a throwaway schema in
// the Postgres named by TEST_DATABASE_URL (the CI runs the suite both ways).
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import pg from 'pg'
import { afterAll, beforeAll, describe, inject } from 'vitest'
import { MIGRATION_LOCK_KEY, migrateToLatest } from '../../src/db/migrate.js'
import { type DatabaseHandle, openDatabase } from '../../src/db/open-database.js'
import type { Logger } from '../../src/logger.js'

export const postgresUrl = process.env.TEST_DATABASE_URL || undefined

if (!postgresUrl && !process.env.QUIET_POSTGRES_SKIP) {
  process.env.QUIET_POSTGRES_SKIP = '1'
  console.warn('TEST_DATABASE_URL is not set: tests named "(Postgres)" are SKIPPED; CI runs them.')
}

/** describe() for tests that need real Postgres (concurrency, SKIP LOCKED, unique keys under races). */
export const describePostgres: typeof describe = postgresUrl ? describe : (describe.skip as typeof describe)

/** Runs `run` with a client of the server at `url` (TEST_DATABASE_URL by default), ended after it whatever it did. */
export async function withPostgresClient<T>(run: (client: pg.Client) => Promise<T>, url: string = postgresUrl!): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    return await run(client)
  } finally {
    await client.end()
  }
}

export interface TestDatabase extends DatabaseHandle {
  /** The connection URL of this test's schema (Postgres only), for child processes. */
  readonly url: string | undefined
  /** Opens another handle on the same database, as a second replica would. */
  openAnother(): DatabaseHandle
}

export interface TestDatabaseOptions {
  kind?: 'postgres' | 'pglite'
  logger?: Logger
  migrate?: boolean
  poolSize?: number
  /**
   * Postgres: settings every connection of the URL starts with, as a database's or a role's a DBA set would
   * (`{ default_transaction_isolation: 'repeatable read', lock_timeout: '1s' }`).
   */
  sessionDefaults?: Partial<
    Record<
      'default_transaction_isolation' | 'lock_timeout' | 'idle_in_transaction_session_timeout' | 'DateStyle' | 'IntervalStyle' | 'idle_session_timeout' | 'synchronous_commit',
      string
    >
  >
  /** Postgres: the server's database to make the schema in, where not TEST_DATABASE_URL's (a server of the test's own). */
  serverUrl?: string
}

/**
 * The database of the enclosing describe() (or file): created before its tests, closed after them.
 * The returned object stands for it from inside tests and hooks.
 */
export function useTestDatabase(options: TestDatabaseOptions = {}): TestDatabase {
  let current: TestDatabase | undefined
  beforeAll(async () => {
    current = await createTestDatabase(options)
  })
  afterAll(async () => {
    await current?.close()
    current = undefined
  })
  const database = (): TestDatabase => {
    if (!current) throw new Error('useTestDatabase(): the database exists only inside tests and their hooks')
    return current
  }
  return {
    get db() {
      return database().db
    },
    get kind() {
      return database().kind
    },
    get url() {
      return database().url
    },
    poolStats: () => database().poolStats(),
    listen: (channel, onNotify) => database().listen(channel, onNotify),
    otherListeners: (channel) => database().otherListeners(channel),
    holdLock: (key, onLost) => database().holdLock(key, onLost),
    withoutTimeouts: (work) => database().withoutTimeouts(work),
    openAnother: () => database().openAnother(),
    close: () => database().close(),
  }
}

export async function createTestDatabase({
  kind = postgresUrl ? 'postgres' : 'pglite',
  logger,
  migrate = true,
  poolSize = 10,
  sessionDefaults = {},
  serverUrl = postgresUrl,
}: TestDatabaseOptions = {}): Promise<TestDatabase> {
  if (kind === 'pglite') {
    const handle = openDatabase({ dataDir: 'memory://', pgliteTemplate: pgliteTemplate(migrate) })
    // the template holds every migration (or none); the migrator is still asked, and finds nothing to do
    if (migrate) await migrateToLatest(handle.db)
    return {
      ...handle,
      url: undefined,
      openAnother: () => {
        throw new Error('PGlite is one in-process connection: a second replica needs Postgres')
      },
    }
  }
  if (!serverUrl) throw new Error('TEST_DATABASE_URL is required for a Postgres test database')
  const schema = `t_${randomBytes(6).toString('hex')}`
  const admin = new pg.Client({ connectionString: serverUrl })
  await admin.connect()
  await admin.query(`create schema ${schema}`)
  await admin.end()
  const url = withSessionOptions(serverUrl, { search_path: schema, ...sessionDefaults })
  const handle = openDatabase({ databaseUrl: url, poolSize, ...(logger ? { logger } : {}) })
  if (migrate) await migrateToLatest(handle.db)
  return {
    ...handle,
    url,
    openAnother: () => openDatabase({ databaseUrl: url, poolSize }),
    close: async () => {
      await handle.close()
      const cleanup = new pg.Client({ connectionString: serverUrl })
      await cleanup.connect()
      // under the migration lock, not in the middle of another test file's migration (which, before it read
      // only its own schema's catalog, failed with "schema … does not exist", 3F000, when one was dropped)
      await cleanup.query('begin')
      await cleanup.query('select pg_advisory_xact_lock($1::bigint)', [MIGRATION_LOCK_KEY])
      // every test file's migration waits while this holds the lock: a drop held up by a session still in the
      // schema (a child process or a connection the test left open) says so, with whom it waits on
      const slow = setTimeout(() => void tellWhoHoldsUp(serverUrl, schema), 10_000)
      try {
        await cleanup.query(`drop schema if exists ${schema} cascade`)
      } finally {
        clearTimeout(slow)
      }
      await cleanup.query('commit')
      await cleanup.end()
    },
  }
}

/** Says on stderr which sessions the drop of `schema` waits on (the test suite's log, when a drop is slow). */
async function tellWhoHoldsUp(serverUrl: string, schema: string): Promise<void> {
  const look = new pg.Client({ connectionString: serverUrl })
  try {
    await look.connect()
    const { rows } = await look.query(
      `select a.pid, a.application_name, a.state, a.xact_start, left(a.query, 200) as query
         from pg_stat_activity a
        where a.pid in (select unnest(pg_blocking_pids(w.pid)) from pg_stat_activity w where w.query like $1)`,
      [`drop schema if exists ${schema} cascade`],
    )
    console.warn(`test database: dropping schema ${schema} has waited 10 s on ${JSON.stringify(rows)}`)
  } catch (error) {
    console.warn(`test database: dropping schema ${schema} has waited 10 s (who holds it up could not be read: ${String(error)})`)
  } finally {
    await look.end().catch(() => {})
  }
}

// read once per test file; the tarballs are made by helpers/pglite-template.ts (globalSetup)
const templates = new Map<boolean, Blob>()
/**
 * The suite's initialised PGlite cluster (`migrated`: with every migration applied), for a test that opens
 * PGlite itself: loading it costs a fraction of an initdb, 6-15 s of a core.
 */
export function pgliteTemplate(migrated: boolean): Blob {
  let template = templates.get(migrated)
  if (!template) {
    const paths = inject('pgliteTemplates')
    template = new Blob([readFileSync(migrated ? paths.migrated : paths.empty)])
    templates.set(migrated, template)
  }
  return template
}

// the URL with `options` that start each of its connections with these settings (those given)
function withSessionOptions(url: string, settings: Record<string, string | undefined>): string {
  const parsed = new URL(url)
  const options = Object.entries(settings)
    .filter(([, value]) => value !== undefined)
    .map(([name, value]) => `-c ${name}=${value!.replaceAll(' ', '\\ ')}`)
  parsed.searchParams.set('options', options.join(' '))
  return parsed.toString()
}
