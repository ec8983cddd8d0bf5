// Found from outside (a database restore review): between createdb and the end of pg_restore, or with the service
// pointed at a new, empty database while it ran, a signed delivery was answered 500 `internal_error` and logged
// `unhandled error` (42P01), while /readyz answered 200 "ready". A restore under way is "try again later": 503 with
// a Retry-After, and /readyz not ready until the tables are back, which the service does not make itself.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import request from 'supertest'
import { describe, expect, it } from 'vitest'
import * as pollDueSinceOfOlderPollers from '../migrations/0021_poll_due_since_of_older_pollers.js'
import { systemClock } from '../src/clock.js'
import { migrateToLatest, SERVICE_COLUMNS, SERVICE_TABLES } from '../src/db/migrate.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { createApp } from '../src/http/app.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { startForwardReceiver } from './helpers/forward-receiver.js'
import { rememberSecret, taggedLogger, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { reactionRecords } from './helpers/reaction-jobs.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { describePostgres, postgresUrl, useTestDatabase } from './helpers/test-database.js'
import { scrapeMetrics, startTestService } from './helpers/test-service.js'
import { signBody, sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const TOKEN = 'schema-missing-token-0123456789abcdef'
const config = testConfig({ ADMIN_TOKEN: TOKEN })
// the apps' own lines: another file's in the same worker are not theirs (log-sink.ts, taggedLogger)
const own = taggedLogger([TOKEN])
const logger = own.logger

describe('a database whose tables are missing (a restore under way, a database replaced)', () => {
  const database = useTestDatabase()

  const refusedSchemaMissing = async (metrics: ReturnType<typeof createMetrics>) =>
    (await metrics.requestsRefused.get()).values.find((value) => value.labels.reason === 'schema_missing')?.value

  it('answers deliveries and console pages 503 schema_missing with a Retry-After and /readyz 503, never 500, and both again once the tables are back', async () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const app = createApp({ config, db: database.db, logger, clock: systemClock, metrics })
    const admin = createAdminApp({ config, db: database.db, logger })
    const reference = `restored-${Date.now()}`
    await createOrder(database.db, { externalReference: reference })
    expect((await request(app).get('/readyz')).status).toBe(200)
    expect((await sendWebhook(app, { body: tradePayload(reference, 'funded') })).status).toBe(200)

    // the restore's first step: the service's schema gone (dropdb and createdb, as the service sees it)
    const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(database.db)
    const schema = rows[0]!.schema
    await sql`drop schema ${sql.id(schema)} cascade`.execute(database.db)
    const before = own.entries().length

    const ready = await request(app).get('/readyz')
    expect(ready.status).toBe(503)
    expect(ready.body.error.code).toBe('not_ready')
    expect(ready.body.error.message).toContain("The database has none of the service's tables: the database was replaced or is being restored")

    const statuses: number[] = []
    for (let attempt = 0; attempt < 5; attempt++) {
      const response = await sendWebhook(app, { body: tradePayload(reference, 'delivered') })
      statuses.push(response.status)
      expect(response.body.error.code).toBe('schema_missing')
      expect(response.headers['retry-after']).toBe('30')
    }
    expect(statuses).toEqual([503, 503, 503, 503, 503])
    expect(await refusedSchemaMissing(metrics)).toBe(5)

    const page = await request(admin).get('/console/deliveries').set('Authorization', `Bearer ${TOKEN}`)
    expect(page.status).toBe(503)
    expect(page.headers['retry-after']).toBe('30')
    expect(page.text).toContain('<title>Try again shortly')
    expect(page.text).toContain('(schema_missing)')

    const lines = own.entries().slice(before)
    expect(lines.filter((line) => line.msg === 'unhandled error')).toEqual([])
    const refusedLines = lines.filter((line) => String(line.msg).includes("the service's tables are missing"))
    expect(refusedLines.length).toBeGreaterThan(0)
    for (const line of refusedLines) {
      const err = line.err as Record<string, unknown>
      expect(err.kind).toBe('schema_missing')
      expect(err.code).toBe('42P01')
      expect(err.message).toContain('the database was replaced or is being restored; finish the restore, or run `migrate`')
      expect(err.stack).toBeUndefined()
    }

    // the restore done (here: the schema made again and migrated, as `migrate` does on an empty database)
    await sql`create schema ${sql.id(schema)}`.execute(database.db)
    await migrateToLatest(database.db)
    await createOrder(database.db, { externalReference: reference })
    expect((await request(app).get('/readyz')).status).toBe(200)
    const taken = await sendWebhook(app, { body: tradePayload(reference, 'funded') })
    expect(taken.status).toBe(200)
    expect((await findOrderByExternalReference(database.db, reference))?.tradeStatus).toBe('funded')
    expect((await request(admin).get('/console/deliveries').set('Authorization', `Bearer ${TOKEN}`)).status).toBe(200)
  })

  it('names the one table missing in /readyz and answers deliveries 503 while it is, ready again once it is back', async () => {
    const app = createApp({ config, db: database.db, logger, clock: systemClock })
    const reference = `one-table-${Date.now()}`
    await createOrder(database.db, { externalReference: reference })
    expect((await request(app).get('/readyz')).status).toBe(200)
    await sql`alter table webhook_deliveries rename to webhook_deliveries_aside`.execute(database.db)
    try {
      const ready = await request(app).get('/readyz')
      expect(ready.status).toBe(503)
      expect(ready.body.error.message).toContain("The service's tables webhook_deliveries are missing")
      const refused = await sendWebhook(app, { body: tradePayload(reference, 'funded') })
      expect([refused.status, refused.body.error?.code, refused.headers['retry-after']]).toEqual([503, 'schema_missing', '30'])
    } finally {
      await sql`alter table webhook_deliveries_aside rename to webhook_deliveries`.execute(database.db)
    }
    expect((await request(app).get('/readyz')).status).toBe(200)
    expect((await sendWebhook(app, { body: tradePayload(reference, 'funded') })).status).toBe(200)
  })

  it('is not ready while a migration of this build is not applied (a dump of an older build restored), ready once it is', async () => {
    const app = createApp({ config, db: database.db, logger, clock: systemClock })
    const { rows } = await sql<{ name: string; timestamp: string }>`select name, timestamp from kysely_migration order by name desc limit 1`.execute(database.db)
    const last = rows[0]!
    expect((await request(app).get('/readyz')).status).toBe(200)
    await sql`delete from kysely_migration where name = ${last.name}`.execute(database.db)
    try {
      const ready = await request(app).get('/readyz')
      expect(ready.status).toBe(503)
      expect(ready.body.error.message).toBe(`Migrations are pending (${last.name}); run \`npm run cli -- migrate\``)
    } finally {
      await sql`insert into kysely_migration (name, timestamp) values (${last.name}, ${last.timestamp})`.execute(database.db)
    }
    expect((await request(app).get('/readyz')).status).toBe(200)
  })

  it('answers a delivery 503 schema_missing while a column the ingest writes is missing, never 500, writes nothing of it, and takes it whole once the column is back', async () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const app = createApp({ config, db: database.db, logger, clock: systemClock, metrics })
    const reference = `column-${Date.now()}`
    const { order } = await createOrder(database.db, { externalReference: reference })
    expect((await request(app).get('/readyz')).status).toBe(200)
    const history = () => database.db.selectFrom('orderStatusHistory').select('toStatus').where('orderId', '=', order.id).execute()
    const stored = (deliveryId: string) =>
      database.db.selectFrom('webhookDeliveries').select(['deliveryId', 'outcome']).where('deliveryId', '=', deliveryId).execute()

    // a database restored in part (or from a dump before migration 0019) with 0019 recorded as applied: the column the
    // ingest statement writes is not there
    await sql`alter table webhook_deliveries drop column order_version`.execute(database.db)
    const before = own.entries().length
    const deliveryId = `dlv_column_${Date.now()}`
    try {
      const ready = await request(app).get('/readyz')
      expect(ready.status).toBe(503)
      expect(ready.body.error.code).toBe('not_ready')
      expect(ready.body.error.message).toContain(
        "The database's schema is behind this build: column webhook_deliveries.order_version is missing, though every migration is recorded as applied",
      )
      for (let attempt = 0; attempt < 3; attempt++) {
        const refused = await sendWebhook(app, { body: tradePayload(reference, 'funded'), deliveryId })
        expect([refused.status, refused.body.error?.code, refused.headers['retry-after']]).toEqual([503, 'schema_missing', '30'])
        expect(refused.body.error.message).toContain("The database's schema is behind this build: a column of the service's tables is missing")
      }
      expect(await refusedSchemaMissing(metrics)).toBe(3)
      // nothing of it written: no delivery, no move, no event
      expect(await stored(deliveryId)).toEqual([])
      expect((await findOrderByExternalReference(database.db, reference))?.tradeStatus).toBeNull()
      expect(await history()).toEqual([])

      const lines = own.entries().slice(before)
      expect(lines.filter((line) => line.msg === 'unhandled error')).toEqual([])
      const refusedLines = lines.filter((line) => line.msg === "webhook not stored: the database's schema is behind this build (a column is missing)")
      expect(refusedLines.length).toBeGreaterThan(0)
      for (const line of refusedLines) {
        expect(line.err).toMatchObject({ kind: 'schema_missing', code: '42703' })
        expect((line.err as { message: string }).message).toContain("a column of the service's tables is missing: the database's schema is behind this build")
        expect((line.err as { stack?: unknown }).stack).toBeUndefined()
      }
    } finally {
      await sql`alter table webhook_deliveries add column if not exists order_version integer`.execute(database.db)
    }

    expect((await request(app).get('/readyz')).status).toBe(200)
    // the same delivery, sent again as the platform retries it: stored and applied, not a duplicate
    const taken = await sendWebhook(app, { body: tradePayload(reference, 'funded'), deliveryId })
    expect([taken.status, taken.body]).toEqual([200, { received: true }])
    expect(await stored(deliveryId)).toEqual([{ deliveryId, outcome: 'applied' }])
    expect((await findOrderByExternalReference(database.db, reference))?.tradeStatus).toBe('funded')
    expect((await history()).map((row) => row.toStatus)).toEqual(['funded'])
  })

  it('names the pending migration in /readyz for a dump from before it (its column and its record gone), and takes deliveries once `migrate` ran from outside', async () => {
    const app = createApp({ config, db: database.db, logger, clock: systemClock })
    const reference = `older-dump-${Date.now()}`
    await createOrder(database.db, { externalReference: reference })
    // a dump from before 0019_delivery_order_version, whose column the ingest names, and so before the later ones
    const later = ['0019_delivery_order_version', '0020_poll_due_since', '0021_poll_due_since_of_older_pollers', '0022_reaction_job_outcome_token']
    const { rows } = await sql<{ name: string; timestamp: string }>`select name, timestamp from kysely_migration
      where name in (${sql.join(later)}) order by name`.execute(database.db)
    expect(rows.map((row) => row.name)).toEqual(later)
    await sql`alter table webhook_deliveries drop column order_version`.execute(database.db)
    await pollDueSinceOfOlderPollers.down(database.db as never)
    await sql`drop index orders_poll_due_since_idx`.execute(database.db)
    await sql`alter table orders drop column poll_due_since, drop column poll_retry_at`.execute(database.db)
    await sql`alter table reaction_jobs drop column outcome_token`.execute(database.db)
    await sql`delete from kysely_migration where name in (${sql.join(later)})`.execute(database.db)
    try {
      const ready = await request(app).get('/readyz')
      expect([ready.status, ready.body.error.message]).toEqual([
        503,
        'Migrations are pending (0019_delivery_order_version and 3 more); run `npm run cli -- migrate`',
      ])
      const refused = await sendWebhook(app, { body: tradePayload(reference, 'funded') })
      expect([refused.status, refused.body.error?.code, refused.headers['retry-after']]).toEqual([503, 'schema_missing', '30'])
      // the operator's `migrate`: the service itself changes nothing while it runs
      await migrateToLatest(database.db)
    } finally {
      await sql`alter table webhook_deliveries add column if not exists order_version integer`.execute(database.db)
      await sql`alter table orders add column if not exists poll_due_since timestamptz, add column if not exists poll_retry_at timestamptz`.execute(database.db)
      await sql`alter table reaction_jobs add column if not exists outcome_token text`.execute(database.db)
      await sql`create index if not exists orders_poll_due_since_idx on orders (poll_due_since)
        where poll_due_since is not null and next_poll_at is not null`.execute(database.db)
      const { rows: trigger } = await sql`select 1 from pg_catalog.pg_trigger t join pg_catalog.pg_class c on c.oid = t.tgrelid
        where t.tgname = 'orders_poll_due_since_of_older_pollers' and c.relnamespace = current_schema()::regnamespace`.execute(database.db)
      if (trigger.length === 0) await pollDueSinceOfOlderPollers.up(database.db as never)
      for (const row of rows) {
        await sql`insert into kysely_migration (name, timestamp) select ${row.name}, ${row.timestamp}
          where not exists (select 1 from kysely_migration where name = ${row.name})`.execute(database.db)
      }
    }
    expect((await request(app).get('/readyz')).status).toBe(200)
    expect((await sendWebhook(app, { body: tradePayload(reference, 'funded') })).status).toBe(200)
    expect((await findOrderByExternalReference(database.db, reference))?.tradeStatus).toBe('funded')
  })

  it('looks for every table the migrations make', async () => {
    const { rows } = await sql<{ name: string }>`
      select c.relname as name from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
       where n.nspname = current_schema() and c.relkind in ('r', 'p') and c.relname not like 'kysely_migration%'`.execute(database.db)
    expect(rows.map((row) => row.name).sort()).toEqual([...SERVICE_TABLES].sort())
  })

  it('looks for every column the migrations make', async () => {
    const { rows } = await sql<{ name: string }>`
      select c.relname || '.' || a.attname as name
        from pg_catalog.pg_attribute a join pg_catalog.pg_class c on c.oid = a.attrelid
        join pg_catalog.pg_namespace n on n.oid = c.relnamespace
       where n.nspname = current_schema() and c.relkind in ('r', 'p') and c.relname not like 'kysely_migration%'
         and a.attnum > 0 and not a.attisdropped`.execute(database.db)
    const expected = Object.entries(SERVICE_COLUMNS).flatMap(([table, columns]) => columns.map((column) => `${table}.${column}`))
    expect(rows.map((row) => row.name).sort()).toEqual(expected.sort())
  })
})

describePostgres('a column dropped under the running service (Postgres)', () => {
  const database = useTestDatabase()

  it('answers 503 schema_missing and is not ready while a column the ingest writes is dropped under it, then takes the same delivery whole and forwards it', async () => {
    const receiver = await startForwardReceiver()
    const forwardSecret = `whsec_${randomBytes(32).toString('base64')}`
    rememberSecret(forwardSecret.slice('whsec_'.length))
    const config = testConfig({ DATABASE_URL: database.url!, PORT: '0', POLL_ENABLED: 'false', FORWARD_URL: receiver.url, FORWARD_SECRET: forwardSecret })
    // the service's own lines (log-sink.ts, taggedLogger)
    const served = taggedLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])
    const service = await startTestService({ config, logger: served.logger })
    try {
      await service.ready
      const body = JSON.stringify(tradePayload('column-dropped', 'funded'))
      const deliveryId = `dlv-column-dropped-${randomBytes(4).toString('hex')}`
      const deliver = async () => {
        const headers = { 'content-type': 'application/json', 'x-partner-delivery-id': deliveryId, 'x-partner-signature': signBody(body) }
        const response = await fetch(`${service.url}${config.webhook.path}`, { method: 'POST', headers, body })
        const answer = (await response.json()) as { error?: { code: string }; duplicate?: boolean }
        return { status: response.status, retryAfter: response.headers.get('retry-after'), code: answer.error?.code, duplicate: answer.duplicate }
      }
      const readyz = async () => {
        const response = await fetch(`${service.url}/readyz`)
        return { status: response.status, message: ((await response.json()) as { error?: { message: string } }).error?.message }
      }
      await createOrder(database.db, { externalReference: 'column-dropped' })
      const before = served.entries().length

      await sql`alter table webhook_deliveries drop column order_version`.execute(database.db)
      try {
        expect(await deliver()).toEqual({ status: 503, retryAfter: '30', code: 'schema_missing', duplicate: undefined })
        const ready = await readyz()
        expect(ready.status).toBe(503)
        expect(ready.message).toContain("The database's schema is behind this build: column webhook_deliveries.order_version is missing")
        expect(await scrapeMetrics(service)).toContain('http_requests_refused_total{reason="schema_missing"} 1')
        expect(await database.db.selectFrom('webhookDeliveries').select('deliveryId').execute()).toEqual([])
      } finally {
        await sql`alter table webhook_deliveries add column if not exists order_version integer`.execute(database.db)
      }
      expect(await readyz()).toEqual({ status: 200, message: undefined })
      // the platform's retry of the same delivery: stored and applied, not taken for a duplicate
      expect(await deliver()).toEqual({ status: 200, retryAfter: null, code: undefined, duplicate: undefined })
      expect((await findOrderByExternalReference(database.db, 'column-dropped'))?.tradeStatus).toBe('funded')
      await receiver.waitFor(1)
      expect(receiver.received.map((forwarded) => JSON.parse(forwarded.rawBody).type)).toEqual(['trade.funded'])
      expect(served.entries().slice(before).filter((line) => line.msg === 'unhandled error')).toEqual([])
    } finally {
      await service.stop()
      await receiver.close()
    }
  })
})

describePostgres('a pg_dump and pg_restore under the running service (Postgres)', () => {
  const database = useTestDatabase()

  it('is not ready and answers 503 schema_missing from the schema dropped to the end of pg_restore, then takes and forwards deliveries', async () => {
    const schema = new URL(database.url!).searchParams.get('options')!.replace('-c search_path=', '')
    const server = new URL(postgresUrl!)
    server.search = ''
    const receiver = await startForwardReceiver()
    const forwardSecret = `whsec_${randomBytes(32).toString('base64')}`
    rememberSecret(forwardSecret.slice('whsec_'.length))
    const config = testConfig({ DATABASE_URL: database.url!, PORT: '0', POLL_ENABLED: 'false', FORWARD_URL: receiver.url, FORWARD_SECRET: forwardSecret })
    const service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]) })
    const directory = mkdtempSync(path.join(tmpdir(), 'schema-missing-'))
    try {
      await service.ready
      const deliver = async (reference: string) => {
        const body = JSON.stringify(tradePayload(reference, 'funded'))
        const headers = { 'content-type': 'application/json', 'x-partner-delivery-id': `dlv-${reference}-${randomBytes(4).toString('hex')}`, 'x-partner-signature': signBody(body) }
        const response = await fetch(`${service.url}${config.webhook.path}`, { method: 'POST', headers, body })
        const answer = (await response.json()) as { error?: { code: string } }
        return { status: response.status, retryAfter: response.headers.get('retry-after'), code: answer.error?.code }
      }
      const readyz = async () => (await fetch(`${service.url}/readyz`)).status
      await createOrder(database.db, { externalReference: 'dumped' })
      await createOrder(database.db, { externalReference: 'after-restore' })
      expect(await deliver('dumped')).toEqual({ status: 200, retryAfter: null, code: undefined })
      await receiver.waitFor(1)
      // the stream's place written back past it before the dump (else the restore's stream forwards it again: at least once)
      await expect.poll(async () => (await reactionRecords(database.db)).map(({ state }) => state), { timeout: 10_000 }).toEqual(['done'])
      const dump = path.join(directory, 'service.dump')
      execFileSync('pg_dump', ['--format=custom', `--schema=${schema}`, `--file=${dump}`, server.toString()])

      await sql`drop schema ${sql.id(schema)} cascade`.execute(database.db)
      expect(await readyz()).toBe(503)
      expect(await deliver('after-restore')).toEqual({ status: 503, retryAfter: '30', code: 'schema_missing' })

      execFileSync('pg_restore', [`--dbname=${server.toString()}`, dump])
      expect(await readyz()).toBe(200)
      expect(await deliver('after-restore')).toEqual({ status: 200, retryAfter: null, code: undefined })
      // the dispatcher reads its restored stream again (woken by the new transition's commit)
      await receiver.waitFor(2)
      expect(receiver.received.map((forwarded) => JSON.parse(forwarded.rawBody).data.external_reference)).toEqual(['dumped', 'after-restore'])
    } finally {
      await service.stop()
      await receiver.close()
      rmSync(directory, { recursive: true, force: true })
    }
  })
})
