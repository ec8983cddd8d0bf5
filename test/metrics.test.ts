import request from 'supertest'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { type Kysely, sql } from 'kysely'
import type { Database } from '../src/db/database.js'
import { systemClock } from '../src/clock.js'
import { openDatabase } from '../src/db/open-database.js'
import { SERVICE_TABLES } from '../src/db/migrate.js'
import { pingDatabase } from '../src/db/ping-database.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { createApp } from '../src/http/app.js'
import { createMetrics, TABLE_SIZES_READ_MS } from '../src/metrics/metrics.js'
import type { RunningService } from '../src/service.js'
import { countOrdersNeedingAttention } from '../src/orders/order.repository.js'
import { requeueOrders } from '../src/orders/poll-schedule.repository.js'
import { createOrder, moveNewOrder } from './helpers/orders.js'
import { dueOrderStats } from '../src/reconcile/poller.js'
import { countParkedDeliveries } from '../src/webhooks/delivery.repository.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { PACKAGE_VERSION } from './helpers/package-version.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { countingFetcher, insertOrders, platformError } from './helpers/reconcile-orders.js'
import { eventually, pollerSleeps, SERVICE_POLL_INTERVAL_MS, testPoller } from './helpers/reconcile-poller.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase, useTestDatabase } from './helpers/test-database.js'
import { scrapeMetrics, startTestService } from './helpers/test-service.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

describe('GET /metrics, on the operator listener', () => {
  const database = useTestDatabase()

  it('counts deliveries by outcome, signature failures and ingest latency, and reads the due orders', async () => {
    const config = testConfig()
    const metrics = createMetrics(
      { poolStats: database.poolStats, dueOrders: async () => ({ ordersDue: 3, oldestDueAgeS: 42 }) },
      { defaultMetrics: false },
    )
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock, metrics })
    const admin = createAdminApp({ config, db: database.db, logger: testLogger(), metrics })
    await createOrder(database.db, { externalReference: 'm-1' })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded') })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded') })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded'), signature: 'sha256=00' })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded'), signature: `sha256=${'ab'.repeat(32)}` })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded'), signature: `sha256=${'cd'.repeat(32)}` })

    // the public app (what the platform reaches) does not serve it
    expect((await request(app).get('/metrics')).status).toBe(404)
    const response = await request(admin).get('/metrics')
    expect(response.status).toBe(200)
    expect(response.headers['content-type']).toContain('text/plain')
    expect(response.text).toContain('webhook_deliveries_total{outcome="applied"} 1')
    expect(response.text).toContain('webhook_deliveries_total{outcome="duplicate_effect"} 1')
    // counted by how the signature failed: a scanner's malformed one apart from a well-formed one no secret matches
    expect(response.text).toContain('webhook_signature_failures_total{signature="malformed"} 1')
    expect(response.text).toContain('webhook_signature_failures_total{signature="mismatch"} 2')
    expect(response.text).toContain('webhook_signature_failures_total{signature="missing"} 0')
    expect(response.text).toContain('webhook_ingest_duration_seconds_count{outcome="applied"} 1')
    // a 15-ms objective at the 99th percentile is a bucket's edge
    expect(response.text).toMatch(/webhook_ingest_duration_seconds_bucket\{le="0.015",outcome="applied"\} \d+\n/)
    expect(response.text).toContain('poller_orders_due 3')
    expect(response.text).toContain('poller_oldest_due_age_seconds 42')
    expect(response.text).toMatch(/database_pool_connections\{state="idle"\} \d+/)
    // which build answers: package.json's version, read from the file itself here
    expect(response.text).toContain(`partner_escrow_build_info{version="${PACKAGE_VERSION}"} 1`)
  })

  // What tells the platform's deliveries signed with a secret not listed from an outsider's wrong signatures while the
  // platform sends nothing (PartnerEscrowWebhookSignatureFailures pages on the first, PartnerEscrowWebhookSignaturesWhileQuiet
  // warns of the second): the platform tries a refused delivery again, the same id and body
  it('counts a signature matching no secret on a delivery id and body refused so before as sent again, and nothing else', async () => {
    const config = testConfig()
    const metrics = createMetrics({}, { defaultMetrics: false })
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock, metrics })
    const admin = createAdminApp({ config, db: database.db, logger: testLogger(), metrics })
    const wrong = (deliveryId: string, body: object, signature = `sha256=${'ab'.repeat(32)}`) => sendWebhook(app, { deliveryId, body, signature })
    const resent = async () => /^webhook_signature_mismatches_resent_total (\d+)$/m.exec((await request(admin).get('/metrics')).text)?.[1]

    // an outsider's: a fresh id each time, the same id with another body, a malformed or missing signature twice
    expect((await wrong('outsider-1', tradePayload('r-1', 'funded'))).status).toBe(401)
    expect((await wrong('outsider-2', tradePayload('r-1', 'funded'))).status).toBe(401)
    expect((await wrong('outsider-2', tradePayload('r-2', 'funded'))).status).toBe(401)
    expect((await wrong('outsider-3', tradePayload('r-1', 'funded'), 'sha256=00')).status).toBe(401)
    expect((await wrong('outsider-3', tradePayload('r-1', 'funded'), 'sha256=00')).status).toBe(401)
    expect(await resent()).toBe('0')

    // the platform's, signed with a secret not listed: its retries come under the same id with the same body
    expect((await wrong('platform-1', tradePayload('r-3', 'funded'))).status).toBe(401)
    expect((await wrong('platform-1', tradePayload('r-3', 'funded'), `sha256=${'cd'.repeat(32)}`)).status).toBe(401)
    expect((await wrong('platform-1', tradePayload('r-3', 'funded'))).status).toBe(401)
    expect(await resent()).toBe('2')
  })

  // 503 says "try again later", which does not mend a fault; and the fault was logged nowhere
  it('answers a scrape that fails for another reason than the database 500, and logs it', async () => {
    const metrics = createMetrics(
      {
        poolStats: () => {
          throw new Error('pool stats broke')
        },
      },
      { defaultMetrics: false },
    )
    const admin = createAdminApp({ config: testConfig(), db: database.db, logger: testLogger(), metrics })
    const response = await request(admin).get('/metrics')
    expect([response.status, response.body.error?.code]).toEqual([500, 'internal_error'])
    expect(logEntries().filter((entry) => entry.msg === 'unhandled error' && entry.path === '/metrics')).toHaveLength(1)
  })

  it('is not served when metrics are switched off', async () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const config = testConfig({ METRICS_ENABLED: 'false' })
    const admin = createAdminApp({ config, db: database.db, logger: testLogger(), metrics })
    expect((await request(admin).get('/metrics')).status).toBe(404)
  })

  it('reports parked deliveries and the age of the oldest from the database, and 0 once their order exists', async () => {
    const clock = new FakeClock()
    const metrics = createMetrics(databaseSources(database.db, clock), { defaultMetrics: false })
    const app = createApp({ config: testConfig(), db: database.db, logger: testLogger(), clock, metrics })
    const admin = createAdminApp({ config: testConfig(), db: database.db, logger: testLogger(), metrics })
    let scrape = await (await request(admin).get('/metrics')).text
    expect(scrape).toMatch(/^webhook_parked_deliveries 0$/m)
    expect(scrape).toMatch(/^webhook_oldest_parked_age_seconds 0$/m)
    expect(scrape).toMatch(/^database_up 1$/m)
    expect(scrape).toMatch(/^database_read_only 0$/m)

    expect((await sendWebhook(app, { body: tradePayload('parked-1', 'funded') })).status).toBe(200)
    await clock.advance(60_000)
    expect((await sendWebhook(app, { body: tradePayload('parked-2', 'funded') })).status).toBe(200)
    await clock.advance(30_000)
    scrape = (await request(admin).get('/metrics')).text
    expect(scrape).toMatch(/^webhook_parked_deliveries 2$/m)
    expect(scrape).toMatch(/^webhook_oldest_parked_age_seconds 90$/m)

    // creating the orders applies what was parked for them
    await createOrder(database.db, { externalReference: 'parked-1' })
    await createOrder(database.db, { externalReference: 'parked-2' })
    scrape = (await request(admin).get('/metrics')).text
    expect(scrape).toMatch(/^webhook_parked_deliveries 0$/m)
    expect(scrape).toMatch(/^webhook_oldest_parked_age_seconds 0$/m)
  })

  it('reports the orders flagged for an operator by flag, and 0 for each once they are requeued', async () => {
    const clock = new FakeClock()
    const metrics = createMetrics(databaseSources(database.db, clock), { defaultMetrics: false })
    const admin = createAdminApp({ config: testConfig(), db: database.db, logger: testLogger(), metrics })
    let scrape = (await request(admin).get('/metrics')).text
    // both flags have a sample before any order has one, so an alert on them can resolve
    expect(scrape).toMatch(/^orders_needing_attention\{flag="trade_not_found"\} 0$/m)
    expect(scrape).toMatch(/^orders_needing_attention\{flag="trade_mismatch"\} 0$/m)

    // flagged the way the poller flags them: a 404 for one trade, another order's record for the other
    await insertOrders(database.db, [
      { externalReference: 'flag-gone', nextPollAt: new Date(clock.now() - 1_000) },
      { externalReference: 'flag-crossed', nextPollAt: new Date(clock.now() - 1_000) },
    ])
    const fetcher = countingFetcher((tradeId) =>
      tradeId === 'tr_flag-gone'
        ? platformError(404, 'not_found')
        : tradeRecord({ trade_id: tradeId, reference: 'REF-x', status: 'released', external_reference: 'someone-else' }),
    )
    const summary = await testPoller({ db: database.db, fetcher, clock }).runOnce()
    expect(summary.results).toMatchObject({ not_found: 1, trade_mismatch: 1 })
    scrape = (await request(admin).get('/metrics')).text
    expect(scrape).toMatch(/^orders_needing_attention\{flag="trade_not_found"\} 1$/m)
    expect(scrape).toMatch(/^orders_needing_attention\{flag="trade_mismatch"\} 1$/m)

    const requeued = await requeueOrders(database.db, { now: new Date(clock.now()) })
    expect(requeued.map((order) => order.previousAttention).sort()).toEqual(['trade_mismatch', 'trade_not_found'])
    scrape = (await request(admin).get('/metrics')).text
    expect(scrape).toMatch(/^orders_needing_attention\{flag="trade_not_found"\} 0$/m)
    expect(scrape).toMatch(/^orders_needing_attention\{flag="trade_mismatch"\} 0$/m)
  })

  it('keeps answering with database_up 0 and no database gauges when the database is gone', async () => {
    const spare = await createTestDatabase()
    const metrics = createMetrics(databaseSources(spare.db, systemClock), { defaultMetrics: false })
    const admin = createAdminApp({ config: testConfig(), db: spare.db, logger: testLogger(), metrics })
    expect((await request(admin).get('/metrics')).text).toMatch(/^database_up 1$/m)
    await spare.close()

    const response = await request(admin).get('/metrics')
    expect(response.status).toBe(200)
    expect(response.text).toMatch(/^database_up 0$/m)
    expectNoSample(response.text, ['database_read_only', 'poller_orders_due', 'poller_oldest_due_age_seconds', 'webhook_parked_deliveries', 'webhook_oldest_parked_age_seconds', 'orders_needing_attention'])
    // the families stay declared: a scrape without the database is the same shape, minus the unknown values
    expect(response.text).toContain('# TYPE webhook_oldest_parked_age_seconds gauge')
    expect(response.text).toContain('# TYPE orders_needing_attention gauge')
  })

  it('answers within the read timeout when a database read hangs, and does not start a second read meanwhile', async () => {
    let reads = 0
    const hanging = () => {
      reads++
      return new Promise<never>(() => {})
    }
    const metrics = createMetrics(
      { databaseUp: hanging, parkedDeliveries: hanging, dueOrders: hanging, ordersNeedingAttention: hanging },
      { defaultMetrics: false, readTimeoutMs: 200 },
    )
    const admin = createAdminApp({ config: testConfig(), db: database.db, logger: testLogger(), metrics })
    for (let scrape = 0; scrape < 3; scrape++) {
      const response = await request(admin).get('/metrics')
      expect(response.status).toBe(200)
      expect(response.text).toMatch(/^database_up 0$/m)
      expectNoSample(response.text, ['poller_orders_due', 'webhook_parked_deliveries', 'orders_needing_attention'])
    }
    // one read per source, still hanging, shared by every later scrape
    expect(reads).toBe(4)
  })

  it('has no poller cycle sample until a poller reports, then the time its last cycle finished and its age', async () => {
    const clock = new FakeClock()
    const metrics = createMetrics({}, { defaultMetrics: false, clock })
    expectNoSample(await metrics.registry.metrics(), ['poller_last_cycle_timestamp_seconds', 'poller_last_cycle_age_seconds'])
    const hooks = metrics.pollerHooks(clock)
    const started = clock.now() / 1000
    expect(await metrics.registry.metrics()).toMatch(new RegExp(`^poller_last_cycle_timestamp_seconds ${started}$`, 'm'))
    // before its first cycle ends, the age counts from the poller's start: a first cycle that never ends is seen
    await clock.advance(20_000)
    expect(await metrics.registry.metrics()).toMatch(/^poller_last_cycle_age_seconds 20$/m)
    hooks.onPollResult({ result: 'applied', orderId: 1, externalReference: 'o-1', tradeId: 't-1', fromStatus: null, toStatus: 'funded' })
    await clock.advance(25_000)
    hooks.onCycle({ finishedAt: new Date(clock.now()) } as Parameters<typeof hooks.onCycle>[0])
    const scrape = await metrics.registry.metrics()
    expect(scrape).toMatch(new RegExp(`^poller_last_cycle_timestamp_seconds ${started + 45}$`, 'm'))
    expect(scrape).toMatch(/^poller_last_cycle_age_seconds 0$/m)
    expect(scrape).toMatch(/^poller_polls_total\{result="applied"\} 1$/m)
    // every result is there from the start, so a rate over a quiet poller is 0 rather than absent
    expect(scrape).toMatch(/^poller_polls_total\{result="unauthorized"\} 0$/m)
    expect(scrape).toMatch(/^webhook_deliveries_total\{outcome="rejected"\} 0$/m)
  })
})

describePostgres('GET /metrics while Postgres is cut off (Postgres)', () => {
  it('answers 200 with database_up 0, and 1 again once the database is back', async () => {
    const database = await createTestDatabase()
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const viaProxy = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 2 })
    try {
      const metrics = createMetrics(databaseSources(viaProxy.db, systemClock), { defaultMetrics: false })
      const admin = createAdminApp({ config: testConfig(), db: viaProxy.db, logger: testLogger(), metrics })
      expect((await request(admin).get('/metrics')).text).toMatch(/^webhook_parked_deliveries 0$/m)

      proxy.cut()
      const down = await request(admin).get('/metrics')
      expect(down.status).toBe(200)
      expect(down.text).toMatch(/^database_up 0$/m)
      expectNoSample(down.text, ['poller_orders_due', 'webhook_parked_deliveries'])

      proxy.restore()
      const back = await request(admin).get('/metrics')
      expect(back.text).toMatch(/^database_up 1$/m)
      expect(back.text).toMatch(/^webhook_parked_deliveries 0$/m)
    } finally {
      await viaProxy.close()
      await proxy.close()
      await database.close()
    }
  })
})

describe("database_clock_offset_seconds: the database's clock against this replica's", () => {
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    service = undefined
  })

  describePostgres('on Postgres (Postgres)', () => {
    let database: TestDatabase
    beforeAll(async () => {
      database = await createTestDatabase({ kind: 'postgres' })
    })
    afterAll(async () => {
      await database.close()
    })

    it('reads the offset at every scrape: negative when this replica runs ahead', async () => {
      // this replica's clock 2 minutes ahead of the machine's, which the database shares
      const ahead = new FakeClock(Date.now() + 120_000)
      service = await startTestService({ config: testConfig({ PORT: '0', DATABASE_URL: database.url! }), logger: testLogger(), clock: ahead })
      await service.ready
      const offsetOf = (scrape: string) => Number(/^database_clock_offset_seconds (\S+)$/m.exec(scrape)?.[1])
      const first = offsetOf(await scrapeMetrics(service))
      // the fake clock stands still while real time goes on: each scrape reads the database's later time
      expect(first).toBeLessThan(-100)
      expect(first).toBeGreaterThan(-120.5)
      await ahead.advance(60_000)
      const second = offsetOf(await scrapeMetrics(service))
      expect(second).toBeLessThan(first - 50)
    })
  })

  it('has no sample on the embedded database, which runs on this machine\'s clock', async () => {
    service = await startTestService({ config: testConfig({ PORT: '0', DATA_DIR: 'memory://' }), logger: testLogger(), clock: new FakeClock(Date.now() + 120_000) })
    await service.ready
    const scrape = await scrapeMetrics(service)
    expect(scrape).toMatch(/^database_up 1$/m)
    expectNoSample(scrape, ['database_clock_offset_seconds'])
  })
})

// Retention keeps webhook_deliveries, done reaction jobs and reconcile runs bounded; order_status_history and orders are
// never pruned and grow with every transition. The gauges show each table's growth: the planner's row estimate and
// the bytes on disk, read from the catalog at most once a minute (a scrape between reads answers the last one).
describe('database_table_rows and database_table_bytes: the growth of every table, retention or not', () => {
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    service = undefined
  })
  const samples = (scrape: string, name: string) =>
    Object.fromEntries([...scrape.matchAll(new RegExp(`^${name}\\{table="([a-z_]+)"\\} (\\S+)$`, 'gm'))].map((match) => [match[1]!, Number(match[2])]))

  const checkGrowth = async (databaseUrl?: string) => {
    const clock = new FakeClock()
    const config = testConfig({ PORT: '0', POLL_ENABLED: 'false', ...(databaseUrl ? { DATABASE_URL: databaseUrl } : { DATA_DIR: 'memory://' }) })
    service = await startTestService({ config, logger: testLogger(), clock })
    await service.ready
    const { db } = service.database
    const before = await scrapeMetrics(service)
    // every table of the service has its bytes (its indexes' pages at the least)
    expect(Object.keys(samples(before, 'database_table_bytes')).sort()).toEqual([...SERVICE_TABLES].sort())
    const bytesBefore = samples(before, 'database_table_bytes')

    for (let index = 0; index < 20; index++) {
      await moveNewOrder(db, { externalReference: `grow-${index}`, statuses: ['created', 'funded'], handlersFor: () => [], now: () => new Date(clock.now()) })
    }
    await sql`analyze orders, order_status_history`.execute(db)
    // read within the minute: the last reading still
    const within = await scrapeMetrics(service)
    expect(samples(within, 'database_table_bytes')).toEqual(bytesBefore)
    expect(samples(within, 'database_table_rows')).toEqual(samples(before, 'database_table_rows'))

    await clock.advance(TABLE_SIZES_READ_MS)
    const after = await scrapeMetrics(service)
    expect(samples(after, 'database_table_rows')).toMatchObject({ orders: 20, order_status_history: 40 })
    const bytesAfter = samples(after, 'database_table_bytes')
    expect(bytesAfter.order_status_history).toBeGreaterThan(bytesBefore.order_status_history!)
    expect(bytesAfter.orders).toBeGreaterThan(bytesBefore.orders!)
  }

  onBothDatabases('reports each table\'s estimated rows and bytes, read again once a minute has passed', checkGrowth)
})

// Prometheus' time() minus a time the replica wrote by its own clock is off by as much as that clock is: a stuck
// poller on a clock 10 minutes ahead looked fresh 10 minutes longer. The ages the alerts read are the replica's own
describe('the ages the alerts read, measured by the replica on its monotonic clock', () => {
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    service = undefined
  })
  const ages = (scrape: string) =>
    Object.fromEntries(
      ['poller_last_cycle_age_seconds', 'retention_last_pass_age_seconds', 'partner_escrow_uptime_seconds'].map((name) => [
        name,
        new RegExp(`^${name} (\\S+)$`, 'm').exec(scrape)?.[1],
      ]),
    )

  const checkAges = async (databaseUrl?: string) => {
    // on a whole second near the database's time: the clock guard lets the poller's first cycle claim
    const clock = new FakeClock(Math.floor(Date.now() / 1000) * 1000)
    // the pruner's first pass comes after min(PRUNE_INTERVAL_S, 60 s), 30 s here, before the poller's second cycle
    const config = testConfig({
      PORT: '0',
      POLL_INTERVAL_S: String(SERVICE_POLL_INTERVAL_MS / 1000),
      PRUNE_INTERVAL_S: '30',
      ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}),
    })
    service = await startTestService({ config, logger: testLogger(), clock })
    await service.ready
    await eventually(() => pollerSleeps(clock) === 1, 'the first poll cycle ends')
    let scrape = await scrapeMetrics(service)
    // no pruning pass yet: no age for it (the alert counts from the uptime then)
    expect(ages(scrape)).toEqual({
      poller_last_cycle_age_seconds: '0',
      retention_last_pass_age_seconds: undefined,
      partner_escrow_uptime_seconds: '0',
    })
    const cycleTimestamp = /^poller_last_cycle_timestamp_seconds (\S+)$/m.exec(scrape)?.[1]
    expect(cycleTimestamp).toBe(String(clock.now() / 1000))

    await clock.advance(30_000)
    const running = service
    await eventually(async () => ages(await scrapeMetrics(running)).retention_last_pass_age_seconds === '0', 'the first pruning pass ends')
    expect(ages(await scrapeMetrics(service))).toEqual({
      poller_last_cycle_age_seconds: '30',
      retention_last_pass_age_seconds: '0',
      partner_escrow_uptime_seconds: '30',
    })

    // NTP, an operator or a VM resumed sets the wall clock 10 minutes forward: no age moves
    clock.stepWallClock(600_000)
    expect(ages(await scrapeMetrics(service))).toEqual({
      poller_last_cycle_age_seconds: '30',
      retention_last_pass_age_seconds: '0',
      partner_escrow_uptime_seconds: '30',
    })
    await clock.advance(10_000)
    // and 20 minutes back: still only the 10 s that passed
    clock.stepWallClock(-1_200_000)
    scrape = await scrapeMetrics(service)
    expect(ages(scrape)).toEqual({
      poller_last_cycle_age_seconds: '40',
      retention_last_pass_age_seconds: '10',
      partner_escrow_uptime_seconds: '40',
    })
    // the time of the last cycle is still exported, as it was written
    expect(/^poller_last_cycle_timestamp_seconds (\S+)$/m.exec(scrape)?.[1]).toBe(cycleTimestamp)
  }

  onBothDatabases("grow with the time that passes, and stay where they are when the machine's clock is set forward or back", checkAges)
})

/** The scrape-time sources as src/service.ts wires them. */
function databaseSources(db: Kysely<Database>, clock: { now(): number }) {
  return {
    databaseUp: () => pingDatabase(db),
    dueOrders: () => dueOrderStats(db, { now: () => clock.now(), sleep: async () => {} }),
    parkedDeliveries: () => countParkedDeliveries(db, new Date(clock.now())),
    ordersNeedingAttention: () => countOrdersNeedingAttention(db),
  }
}

function expectNoSample(scrape: string, names: string[]): void {
  for (const name of names) expect(scrape, name).not.toMatch(new RegExp(`^${name}(\\{| )`, 'm'))
}

/** `check` on PGlite, and on a Postgres database of its own where TEST_DATABASE_URL is set. */
function onBothDatabases(behaviour: string, check: (databaseUrl?: string) => Promise<void>): void {
  it(`${behaviour} (PGlite)`, () => check())
  describePostgres('on Postgres (Postgres)', () => {
    let database: TestDatabase
    beforeAll(async () => {
      database = await createTestDatabase({ kind: 'postgres' })
    })
    afterAll(async () => {
      await database.close()
    })
    it(`${behaviour} (Postgres)`, () => check(database.url!))
  })
}
