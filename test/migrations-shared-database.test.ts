// A partner's database is often shared: other applications keep their own schemas beside ours, change them
// while we start, and a DBA may make every transaction REPEATABLE READ by default.
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import pg from 'pg'
import { expect, it } from 'vitest'
import { migrations } from '../migrations/index.js'
import { createApp } from '../src/http/app.js'
import { MIGRATION_LOCK_KEY, migrateToLatest, migrationsAreCurrent } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, postgresUrl } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const allMigrations = Object.keys(migrations)

// the test's own connection to the database, outside any schema of ours
async function adminClient(): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: postgresUrl })
  await client.connect()
  return client
}

// resolves once the backend named `applicationName` waits on an advisory lock; rejects once `migrating` has
// settled without that (it failed, or did not wait)
async function waitingOnAdvisoryLock(client: pg.Client, applicationName: string, migrating: Promise<unknown>): Promise<void> {
  let settled = false
  void migrating.finally(() => {
    settled = true
  })
  for (;;) {
    const { rows } = await client.query(
      `select 1 from pg_locks l join pg_stat_activity a on a.pid = l.pid
        where l.locktype = 'advisory' and not l.granted and a.application_name = $1`,
      [applicationName],
    )
    if (rows.length > 0) return
    if (settled) throw new Error(`the migration ended without waiting for the lock: ${String(Object.values(await migrating as object)[0])}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}


// `admin` holds the migration lock as another replica migrating would, while our process (a handle on `url`)
// migrates; `during` runs meanwhile with a watcher's connection and `waiting()`, which resolves once ours waits
// on the lock. Then `admin` commits, and ours goes on.
async function migrateBehindAnotherReplica(
  url: string,
  admin: pg.Client,
  during: (watcher: pg.Client, waiting: () => Promise<void>) => Promise<void>,
): Promise<{ outcome: { report: unknown } | { error: unknown }; current: boolean }> {
  const applicationName = `migrate-${randomBytes(4).toString('hex')}`
  await admin.query('begin')
  await admin.query('select pg_advisory_xact_lock($1::bigint)', [MIGRATION_LOCK_KEY])
  const named = new URL(url)
  named.searchParams.set('application_name', applicationName)
  const ours = openDatabase({ databaseUrl: named.toString(), poolSize: 2 })
  try {
    const migrating = migrateToLatest(ours.db).then((report) => ({ report }), (error: unknown) => ({ error }))
    const watcher = await adminClient()
    try {
      await during(watcher, () => waitingOnAdvisoryLock(watcher, applicationName, migrating))
    } finally {
      await watcher.end()
    }
    await admin.query('commit')
    const outcome = await migrating
    return { outcome, current: await migrationsAreCurrent(ours.db) }
  } finally {
    await ours.close()
  }
}
describePostgres('migrations in a database other applications share (Postgres)', () => {
  it("are not failed by another application dropping its schema while we wait for the migration lock", async () => {
    const database = await createTestDatabase({ migrate: false, sessionDefaults: { default_transaction_isolation: 'repeatable read' } })
    const admin = await adminClient()
    const other = `other_${randomBytes(4).toString('hex')}`
    try {
      await admin.query(`create schema ${other}`)
      await admin.query(`create table ${other}.invoices (id serial primary key, amount int)`)
      const { outcome, current } = await migrateBehindAnotherReplica(database.url!, admin, async (watcher, waiting) => {
        await waiting()
        // meanwhile the other application drops its schema
        await watcher.query(`drop schema ${other} cascade`)
      })
      expect(outcome).toEqual({ report: { applied: allMigrations } })
      expect(current).toBe(true)
    } finally {
      await admin.query('rollback').catch(() => undefined)
      await admin.query(`drop schema if exists ${other} cascade`)
      await admin.end()
      await database.close()
    }
  })

  it("wait for another replica's migrations however short the database's lock_timeout", async () => {
    const database = await createTestDatabase({ migrate: false, sessionDefaults: { lock_timeout: '200ms' } })
    const admin = await adminClient()
    try {
      // another replica migrating, for longer than the lock_timeout
      const { outcome } = await migrateBehindAnotherReplica(database.url!, admin, async (_watcher, waiting) => {
        await waiting()
        // still waiting, well past the lock_timeout
        await new Promise((resolve) => setTimeout(resolve, 1_000))
        await waiting()
      })
      expect(outcome).toEqual({ report: { applied: allMigrations } })
    } finally {
      await admin.query('rollback').catch(() => undefined)
      await admin.end()
      await database.close()
    }
  })

  it("are refused in words that say so when no schema of the connection's search_path exists", async () => {
    const url = new URL(postgresUrl!)
    url.searchParams.set('options', `-c search_path=missing_${randomBytes(4).toString('hex')}`)
    const nowhere = openDatabase({ databaseUrl: url.toString(), poolSize: 1 })
    try {
      await expect(migrateToLatest(nowhere.db)).rejects.toThrow(
        "Migration (before any migration ran) failed: no schema of the connection's search_path exists to create the tables in",
      )
    } finally {
      await nowhere.close()
    }
  })

  it("read only our schema's catalog: another application's schema dropped after the read began does not fail it", async () => {
    const database = await createTestDatabase()
    const admin = await adminClient()
    const other = `other_${randomBytes(4).toString('hex')}`
    try {
      await admin.query(`create schema ${other}`)
      await admin.query(`create table ${other}.invoices (id serial primary key, amount int)`)
      // a snapshot that still holds the other schema, as a statement's does when the drop commits during it
      const current = await database.db.transaction().setIsolationLevel('repeatable read').execute(async (trx) => {
        await sql`select 1`.execute(trx)
        await admin.query(`drop schema ${other} cascade`)
        return migrationsAreCurrent(trx)
      })
      expect(current).toBe(true)
    } finally {
      await admin.query(`drop schema if exists ${other} cascade`)
      await admin.end()
      await database.close()
    }
  })

  it('are applied once by two processes at the same moment when transactions are REPEATABLE READ by default', async () => {
    const database = await createTestDatabase({ migrate: false, sessionDefaults: { default_transaction_isolation: 'repeatable read' } })
    const first = database.openAnother()
    const second = database.openAnother()
    try {
      const reports = await Promise.all([migrateToLatest(first.db), migrateToLatest(second.db)])
      expect(reports.flatMap((report) => report.applied).sort()).toEqual([...allMigrations].sort())
      expect(await migrationsAreCurrent(first.db)).toBe(true)
    } finally {
      await first.close()
      await second.close()
      await database.close()
    }
  })

  // A table of another application's in our schema (a schema shared with it): the migrator reported the 25P02 of
  // the statement it ran after the failure, under "(before any migration ran)"
  it('are refused under the name of the migration that met a table of ours already there, made by another', async () => {
    const database = await createTestDatabase({ migrate: false })
    try {
      await sql`create table orders (id int primary key, customer text)`.execute(database.db)
      await expect(migrateToLatest(database.db)).rejects.toThrow(
        `Migration 0001_initial failed: "orders", which it creates, is already in the connection's schema, made by something other than this service's migrations (42P07): give the service a schema of its own`,
      )
      // the other application's table as it was, and nothing of ours
      const { rows } = await sql<{ name: string }>`select tablename as name from pg_tables where schemaname = current_schema()`.execute(database.db)
      expect(rows).toEqual([{ name: 'orders' }])
    } finally {
      await database.close()
    }
  })

  // Postgres 15 and later give PUBLIC no CREATE on the public schema, and a DBA may give the service's role only
  // the rights to read and write: the migrator's first table failed, and it reported only 25P02
  it('are refused, naming the GRANT, for a role that may not create tables in its schema, which runs once another migrated', async () => {
    const database = await createTestDatabase({ migrate: false })
    const admin = await adminClient()
    const role = `limited_${randomBytes(4).toString('hex')}`
    const { rows: [{ schema }] } = await sql<{ schema: string }>`select current_schema() as schema`.execute(database.db) as { rows: [{ schema: string }] }
    const url = new URL(database.url!)
    url.username = role
    const limited = openDatabase({ databaseUrl: url.toString(), poolSize: 2 })
    try {
      await admin.query(`create role ${role} login`)
      await admin.query(`grant usage on schema ${schema} to ${role}`)
      await expect(migrateToLatest(limited.db)).rejects.toThrow(
        `Migration (before any migration ran) failed: the role ${role} may not create tables in the schema ${schema}, and ${allMigrations.length} migrations wait (0001_initial and on): GRANT CREATE ON SCHEMA ${schema} TO ${role}`,
      )
      const { rows } = await sql`select tablename from pg_tables where schemaname = current_schema()`.execute(database.db)
      expect(rows).toEqual([])

      // migrated by a role that may, and the tables' rights given: the limited role has nothing to migrate, and
      // stores and applies a delivery
      expect((await migrateToLatest(database.db)).applied).toEqual(allMigrations)
      await admin.query(`grant select, insert, update, delete on all tables in schema ${schema} to ${role}`)
      await admin.query(`grant usage, select on all sequences in schema ${schema} to ${role}`)
      expect(await migrateToLatest(limited.db)).toEqual({ applied: [] })
      const config = testConfig()
      const app = createApp({ config, db: limited.db, logger: testLogger(config.webhook.secrets), clock: new FakeClock() })
      await createOrder(limited.db, { externalReference: 'limited-1' })
      expect((await sendWebhook(app, { body: tradePayload('limited-1', 'funded') })).status).toBe(200)
      expect(await findOrderByExternalReference(limited.db, 'limited-1')).toMatchObject({ tradeStatus: 'funded' })
    } finally {
      await limited.close()
      await database.close()
      await admin.query(`drop owned by ${role}`).catch(() => undefined)
      await admin.query(`drop role if exists ${role}`)
      await admin.end()
    }
  })

  // a delivery with a character LATIN1 lacks was answered 400 invalid_payload however often it was sent
  it("are refused, at every start, in a database whose encoding is not UTF8", async () => {
    const admin = await adminClient()
    const name = `latin1_${randomBytes(4).toString('hex')}`
    await admin.query(`create database ${name} encoding 'LATIN1' lc_collate 'C' lc_ctype 'C' template template0`)
    const url = new URL(postgresUrl!)
    url.pathname = `/${name}`
    const latin1 = openDatabase({ databaseUrl: url.toString(), poolSize: 1 })
    try {
      const refused = "Migration (before any migration ran) failed: the database's encoding is LATIN1, where the platform's deliveries are UTF-8"
      await expect(migrateToLatest(latin1.db)).rejects.toThrow(refused)
      const { rows } = await sql`select tablename from pg_tables where schemaname = current_schema()`.execute(latin1.db)
      expect(rows).toEqual([])
      // one whose every migration was applied before this check: its next start is refused too
      await sql`create table kysely_migration (name varchar(255) primary key, timestamp varchar(255) not null)`.execute(latin1.db)
      for (const migration of allMigrations) await sql`insert into kysely_migration values (${migration}, now()::text)`.execute(latin1.db)
      await expect(migrateToLatest(latin1.db)).rejects.toThrow(refused)
    } finally {
      await latin1.close()
      await admin.query(`drop database if exists ${name}`)
      await admin.end()
    }
  })
})
