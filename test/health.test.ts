import request from 'supertest'
import { describe, expect, it } from 'vitest'
import { sql } from 'kysely'
import { systemClock } from '../src/clock.js'
import { DISK_FULL_HOLD_MS } from '../src/db/disk-full-note.js'
import { errorBody } from '../src/http/app-error.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { createApp } from '../src/http/app.js'
import { testLogger } from './helpers/log-sink.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { testConfig } from './helpers/test-config.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'
import { createTestDatabase, describePostgres, useTestDatabase } from './helpers/test-database.js'

const config = testConfig()
const logger = testLogger()

describe('health and the error contract', () => {
  const database = useTestDatabase()

  const app = () => createApp({ config, db: database.db, logger, clock: systemClock })

  it('answers /healthz while the process is up', async () => {
    const response = await request(app()).get('/healthz')
    expect(response.status).toBe(200)
    expect(response.body).toEqual({ status: 'ok' })
  })

  it('answers /readyz 200 when the database answers and migrations are current', async () => {
    const response = await request(app()).get('/readyz')
    expect(response.status).toBe(200)
    expect(response.body).toEqual({ status: 'ready' })
  })

  it('answers /readyz 503 once draining, while other requests are still served, each closing its connection', async () => {
    let draining = false
    const drainable = createApp({ config, db: database.db, logger, clock: systemClock, isDraining: () => draining })
    const before = await request(drainable).get('/readyz')
    expect(before.status).toBe(200)
    draining = true
    const during = await request(drainable).get('/readyz')
    expect(during.status).toBe(503)
    expect(during.body.error.code).toBe('not_ready')
    expect(during.body.error.message).toMatch(/shutting down/i)
    const health = await request(drainable).get('/healthz')
    expect(health.status).toBe(200)
    expect(health.headers.connection).toBe('close')
  })

  it('answers /readyz and deliveries 503 while the data directory is almost full, and takes them again after', async () => {
    let low = true
    const guarded = createApp({ config, db: database.db, logger, clock: systemClock, storageLow: () => low })
    const ready = await request(guarded).get('/readyz')
    expect(ready.status).toBe(503)
    expect(ready.body.error).toMatchObject({ code: 'not_ready', message: expect.stringContaining('DATA_DIR_MIN_FREE') })
    const body = JSON.stringify(tradePayload('storage-low-1', 'funded'))
    const post = () =>
      request(guarded)
        .post(config.webhook.path)
        .set('content-type', 'application/json')
        .set('x-partner-delivery-id', 'storage-low-1')
        .set('x-partner-signature', signBody(body))
        .send(body)
    const refused = await post()
    expect(refused.status).toBe(503)
    expect(refused.body.error.code).toBe('storage_low')
    low = false
    expect((await request(guarded).get('/readyz')).status).toBe(200)
    const taken = await post()
    expect(taken.status).toBe(200)
    // the refused one was not stored: this is its first time in
    expect(taken.body).toEqual({ received: true })
  })

  // found from outside: with the embedded database's guard off (DATA_DIR_MIN_FREE=0) and its disk full, every
  // delivery was answered 503 (53100) while /readyz answered 200
  it('answers /readyz 503 once a delivery was refused for a full disk, until one is stored or the hold passes', async () => {
    let now = Date.now()
    // the wall clock apart: the hold is timed on the monotonic one
    let wall = Date.now()
    const clock = { now: () => wall, monotonicNow: () => now, sleep: systemClock.sleep }
    const full = createApp({ config, db: database.db, logger, clock })
    // the database's own refusal, as a table that cannot grow gives it
    await sql`create function refuse_for_full_disk() returns trigger language plpgsql as $$
      begin raise exception 'could not extend file: No space left on device' using errcode = 'disk_full'; end $$`.execute(database.db)
    await sql`create trigger full_disk before insert on webhook_deliveries for each row execute function refuse_for_full_disk()`.execute(database.db)
    const post = (id: string) => {
      const body = JSON.stringify(tradePayload(id, 'funded'))
      return request(full)
        .post(config.webhook.path)
        .set('content-type', 'application/json')
        .set('x-partner-delivery-id', id)
        .set('x-partner-signature', signBody(body))
        .send(body)
    }
    try {
      expect((await request(full).get('/readyz')).status).toBe(200)
      const refused = await post('disk-full-1')
      expect({ status: refused.status, code: refused.body.error?.code }).toEqual({ status: 503, code: 'database_unavailable' })
      now += 2_500
      const ready = await request(full).get('/readyz')
      expect({ status: ready.status, body: ready.body }).toEqual({
        status: 503,
        body: errorBody('not_ready', 'The database refused to store a delivery 2.5 s ago: its disk is full (53100); deliveries are answered 503 until it has room'),
      })
      // the wall clock stepped back an hour changes nothing (by it, /readyz stayed unready for that hour)
      wall -= 3_600_000
      // with no delivery coming, the hold passes and the next delivery finds out
      now += DISK_FULL_HOLD_MS
      expect((await request(full).get('/readyz')).status).toBe(200)
      expect((await post('disk-full-2')).status).toBe(503)
      expect((await request(full).get('/readyz')).status).toBe(503)
    } finally {
      await sql`drop trigger full_disk on webhook_deliveries`.execute(database.db)
      await sql`drop function refuse_for_full_disk()`.execute(database.db)
    }
    // room again: a stored delivery ends it at once
    expect((await post('disk-full-3')).body).toEqual({ received: true })
    expect((await request(full).get('/readyz')).status).toBe(200)
  })

  it('shares one look at the database among the /readyz requests that come while it runs', async () => {
    // each statement is counted, and its answer held until `answer` is called
    let statements = 0
    let answer = () => {}
    const answered = new Promise<void>((resolve) => (answer = resolve))
    const held = database.db.withPlugin({
      transformQuery: (args) => {
        statements += 1
        return args.node
      },
      transformResult: async (args) => {
        await answered
        return args.result
      },
    })
    const probed = createApp({ config, db: held, logger, clock: systemClock })
    // each is answered at its own 2 s timeout, so all of them were waiting on the database together
    const waiting = await Promise.all(Array.from({ length: 20 }, () => request(probed).get('/readyz')))
    expect(waiting.map((response) => response.status)).toEqual(Array(20).fill(503))
    expect(statements).toBe(1)
    answer()
    // the held look ends; a request after it looks again, not at the old answer
    await expect.poll(async () => (await request(probed).get('/readyz')).status).toBe(200)
    const before = statements
    expect((await request(probed).get('/readyz')).status).toBe(200)
    // one look, and each reads the tables again (a restore takes them away): the ping and the catalog's tables
    // through the plugins (the migrator's names are read past them, as the migrator reads them)
    expect(statements).toBe(before + 2)
  })

  it('answers unknown routes 404 in the error shape', async () => {
    const response = await request(app()).post('/no/such/route').send({ a: 1 })
    expect(response.status).toBe(404)
    expect(response.body).toEqual({
      error: { code: 'not_found', message: 'No route for POST /no/such/route' },
    })
  })
})

describe('readiness with pending migrations', () => {
  it('answers /readyz 503 until the migrations are applied', async () => {
    const database = await createTestDatabase({ migrate: false })
    try {
      const app = createApp({ config, db: database.db, logger, clock: systemClock })
      const before = await request(app).get('/readyz')
      expect(before.status).toBe(503)
      expect(before.body.error.code).toBe('not_ready')
      await migrateToLatest(database.db)
      expect((await request(app).get('/readyz')).status).toBe(200)
    } finally {
      await database.close()
    }
  })
})

describePostgres('readiness when the database goes away (Postgres)', () => {
  it('answers /readyz 503 while Postgres is unreachable and 200 again once it is back', async () => {
    const database = await createTestDatabase()
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const throughProxy = openDatabase({ databaseUrl: proxy.rewrite(database.url!), logger })
    try {
      const app = createApp({ config, db: throughProxy.db, logger, clock: systemClock })
      expect((await request(app).get('/readyz')).status).toBe(200)

      proxy.cut()
      const down = await request(app).get('/readyz')
      expect(down.status).toBe(503)
      expect(down.body).toEqual({ error: { code: 'not_ready', message: 'The database does not answer' } })
      expect((await request(app).get('/healthz')).status).toBe(200)

      proxy.restore()
      expect((await request(app).get('/readyz')).status).toBe(200)
    } finally {
      await throughProxy.close()
      await proxy.close()
      await database.close()
    }
  })
})
