// A database whose sessions a DBA set up for their own applications. Transactions REPEATABLE READ (or
// SERIALIZABLE) by default, dates written as 'SQL, DMY': the service's own connections still run READ COMMITTED
// and read every timestamp, and the start-up look says what to set for a pooler in transaction mode. Idle
// transactions ended after a while: the lock a prune pass holds in one stays held. Lock waits ended after a
// while: a delivery held up past that is answered 503.
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { checkSessionDefaults } from '../src/db/session-defaults.js'
import { createApp } from '../src/http/app.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { taggedLogger, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, postgresUrl, type TestDatabase, type TestDatabaseOptions } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

// The start-up look run on `database`, and the lines it logged: those of the logger it is given, not every line in the
// sink (the files of a worker share its process, and another file's line lands there meanwhile: log-sink.ts,
// taggedLogger), and all of them, whatever their message
const runCheck = async (database: TestDatabase) => {
  const { logger, entries } = taggedLogger()
  await checkSessionDefaults(database, logger)
  return entries()
}

const warningsOn = async (options: TestDatabaseOptions) => {
  const database = await createTestDatabase({ ...options, migrate: false, poolSize: 3 })
  try {
    const lines = await runCheck(database)
    // every connection the pool opens, three at once
    const isolations = await Promise.all(
      [0, 1, 2].map(async () => database.db.transaction().execute(async (trx) => {
        const { rows } = await sql<{ isolation: string }>`select current_setting('transaction_isolation') as isolation, pg_sleep(0.05)`.execute(trx)
        return rows[0]?.isolation
      })),
    )
    const warnings = lines.map((entry) => ({ level: entry.level, sessionDefaults: entry.sessionDefaults }))
    return { warnings, isolations }
  } finally {
    await database.close()
  }
}

describePostgres('the default transaction isolation (Postgres)', () => {
  it('is READ COMMITTED on every connection of the pool, and the start-up look warns, where the database says otherwise', async () => {
    expect(await warningsOn({ sessionDefaults: { default_transaction_isolation: 'repeatable read' } })).toEqual({
      warnings: [{ level: 40, sessionDefaults: { default_transaction_isolation: 'repeatable read' } }],
      isolations: ['read committed', 'read committed', 'read committed'],
    })
    expect(await warningsOn({ sessionDefaults: { default_transaction_isolation: 'serializable' } })).toEqual({
      warnings: [{ level: 40, sessionDefaults: { default_transaction_isolation: 'serializable' } }],
      isolations: ['read committed', 'read committed', 'read committed'],
    })
  })

  it("reads timestamps whatever DateStyle and IntervalStyle the database's sessions start with", async () => {
    const database = await createTestDatabase({ sessionDefaults: { DateStyle: 'SQL, DMY', IntervalStyle: 'sql_standard' } })
    try {
      expect((await runCheck(database)).map((entry) => entry.sessionDefaults)).toEqual([{ DateStyle: 'SQL, DMY', IntervalStyle: 'sql_standard' }])
      const reference = `dates-${randomBytes(4).toString('hex')}`
      const stored = new Date('2026-11-03T04:05:06.789Z')
      await database.db.insertInto('orders').values({ externalReference: reference, createdAt: stored }).execute()
      const order = await findOrderByExternalReference(database.db, reference)
      expect(order?.createdAt).toEqual(stored)
    } finally {
      await database.close()
    }
  })

  it('is quiet where the database starts its sessions in READ COMMITTED', async () => {
    expect(await warningsOn({})).toEqual({ warnings: [], isolations: ['read committed', 'read committed', 'read committed'] })
  })
})

// a commit under `off` returns before its WAL is on disk: a delivery answered 200 so was lost in a crash of Postgres
describePostgres('synchronous_commit (Postgres)', () => {
  it("is on for every connection of the pool where the database's sessions start with it off, other values left as they are", async () => {
    const seen = async (synchronousCommit: string) => {
      const database = await createTestDatabase({ migrate: false, poolSize: 2, sessionDefaults: { synchronous_commit: synchronousCommit } })
      try {
        const lines = await runCheck(database)
        const settings = await Promise.all(
          [0, 1].map(async () => {
            const { rows } = await sql<{ value: string }>`select current_setting('synchronous_commit') as value, pg_sleep(0.05)`.execute(database.db)
            return rows[0]?.value
          }),
        )
        return { settings, warned: lines.map((entry) => entry.sessionDefaults) }
      } finally {
        await database.close()
      }
    }
    expect(await seen('off')).toEqual({ settings: ['on', 'on'], warned: [{ synchronous_commit: 'off' }] })
    // a local flush at the least, as `on`
    expect(await seen('local')).toEqual({ settings: ['local', 'local'], warned: [] })
    expect(await seen('remote_apply')).toEqual({ settings: ['remote_apply', 'remote_apply'], warned: [] })
  })
})

describe('the default transaction isolation (PGlite)', () => {
  it('is not looked at: one connection of our own, no pooler', async () => {
    const database = await createTestDatabase({ kind: 'pglite', migrate: false })
    try {
      expect(await runCheck(database)).toEqual([])
    } finally {
      await database.close()
    }
  })
})

describePostgres('a lock held for a pass, where the database ends idle transactions (Postgres)', () => {
  it('stays held past idle_in_transaction_session_timeout, and no other session takes it meanwhile', async () => {
    const database = await createTestDatabase({ migrate: false, sessionDefaults: { idle_in_transaction_session_timeout: '200ms' } })
    const KEY = 0x74657374
    try {
      const release = await database.holdLock(KEY)
      expect(release).toBeDefined()
      // a pass of batches with pauses between them: the lock's transaction idles meanwhile
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      expect(await database.holdLock(KEY)).toBeUndefined()
      await release!()
      const again = await database.holdLock(KEY)
      expect(again).toBeDefined()
      await again!()
    } finally {
      await database.close()
    }
  })
})

describePostgres("a statement held up past the database's lock_timeout (Postgres)", () => {
  it('is answered 503, try again later, and the delivery sent again once the lock goes is applied', async () => {
    const database = await createTestDatabase({ sessionDefaults: { lock_timeout: '200ms' } })
    const config = testConfig({ LOG_LEVEL: 'warn' })
    const app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
    const holder = new pg.Client({ connectionString: postgresUrl })
    await holder.connect()
    try {
      const reference = `held-${randomBytes(4).toString('hex')}`
      const { order } = await createOrder(database.db, { externalReference: reference })
      // an operator's open transaction keeps the order locked
      await holder.query('begin')
      await holder.query(`select id from ${schemaOf(database.url!)}.orders where id = $1 for update`, [order.id])
      const body = JSON.stringify(tradePayload(reference, 'funded'))
      const held = await sendWebhook(app, { body, deliveryId: 'dlv-held' })
      expect([held.status, held.body.error?.code]).toEqual([503, 'database_unavailable'])
      await holder.query('commit')
      const again = await sendWebhook(app, { body, deliveryId: 'dlv-held' })
      expect([again.status, again.body]).toEqual([200, { received: true }])
      expect((await findOrderByExternalReference(database.db, reference))?.tradeStatus).toBe('funded')
    } finally {
      await holder.query('rollback').catch(() => undefined)
      await holder.end()
      await database.close()
    }
  })
})

// the schema a test database's URL names on its search_path
const schemaOf = (url: string) => /search_path=(\w+)/.exec(new URL(url).searchParams.get('options') ?? '')![1]!

describePostgres('connections idle past the database\'s idle_session_timeout (Postgres)', () => {
  it('are not ended: the listener hears a notification sent after the idle time, and nothing is lost or logged', async () => {
    // the database's own lines: a line another file's work logs in the second it waits is not its (log-sink.ts,
    // taggedLogger)
    const { logger, entries } = taggedLogger()
    const database = await createTestDatabase({ migrate: false, logger, sessionDefaults: { idle_session_timeout: '300ms' } })
    const before = entries().length
    try {
      const heard: (string | undefined)[] = []
      const stop = await database.listen('idle_session_test', (payload) => heard.push(payload))
      // the pool's connections, and the listener's, idle for three times the timeout
      await Promise.all([0, 1].map(() => sql`select pg_sleep(0.05)`.execute(database.db)))
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      // a warning of another logger in the window, as another file's work writes one: not the database's
      testLogger().warn('another file\'s line')
      await sql`select pg_notify('idle_session_test', 'after the idle time')`.execute(database.db)
      await expect.poll(() => heard, { timeout: 10_000 }).toContain('after the idle time')
      await stop()
      const warnings = entries().slice(before).filter((entry) => entry.level === 40).map((entry) => entry.msg)
      expect(warnings).toEqual([])
    } finally {
      await database.close()
    }
  })
})
