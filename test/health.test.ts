import request from 'supertest'
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
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
    expect(statements).toBe(before + 1)
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
