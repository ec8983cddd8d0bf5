// The poller inside `serve`: started after the server listens, fed to /metrics, stopped first.
import { afterEach, describe, expect, it } from 'vitest'
import type { RunningService } from '../src/service.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { eventually, pollerSleeps, SERVICE_POLL_INTERVAL_MS } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { startTestService } from './helpers/test-service.js'

/** 20 s behind the machine's (and the database's) time, on a whole second: an advance of the interval stays within the clock guard's bound. */
const nearDatabaseTime = () => Math.floor(Date.now() / 1000) * 1000 - 20_000

describe('the poller in the service', () => {
  let service: RunningService | undefined
  let platform: RecordingServer | undefined
  afterEach(async () => {
    await service?.stop()
    await platform?.close()
    service = undefined
    platform = undefined
  })

  it('polls due orders on its interval, counts the results in /metrics, and stops with the service', async () => {
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({ status: 200, body: tradeRecord({ trade_id: 'tr_svc-1', status: 'delivered', external_reference: 'svc-1' }) }),
    })
    // a whole second 20 s behind the database's clock: one advance of the interval leaves it within the 30 s the
    // clock guard allows (src/db/clock-guard.ts), as a service's clock far from its database's takes no claim
    const clock = new FakeClock(nearDatabaseTime())
    const logger = testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])
    const config = testConfig({ PARTNER_API_BASE_URL: platform.url, PORT: '0', POLL_INTERVAL_S: String(SERVICE_POLL_INTERVAL_MS / 1000) })
    service = await startTestService({ config, logger, clock })
    await service.ready
    expect(service.poller?.running).toBe(true)
    // the first cycle found nothing and the poller sleeps its interval
    await eventually(() => pollerSleeps(clock) === 1, 'the poller sleeps')
    expect(platform.requests).toHaveLength(0)

    await insertOrders(service.database.db, [
      { externalReference: 'svc-1', nextPollAt: new Date(clock.now() - 90_000) },
    ])
    // a gauge read from the database is left out of a scrape its read does not answer in time (metrics.ts,
    // tolerantRead; database_up is 0 then): at a load of 20 on PGlite `webhook_parked_deliveries` was missing, so scrape
    // until all are read
    const databaseGauges = [/^poller_orders_due /m, /^poller_oldest_due_age_seconds /m, /^database_up 1$/m, /^webhook_parked_deliveries /m]
    let metrics = ''
    await eventually(async () => {
      metrics = await (await fetch(`${service!.adminUrl}/metrics`)).text()
      return databaseGauges.every((gauge) => gauge.test(metrics))
    }, 'a scrape with the gauges read from the database')
    expect(metrics).toMatch(/^poller_orders_due 1$/m)
    expect(metrics).toMatch(/^poller_oldest_due_age_seconds 90$/m)
    // the first cycle finished at the clock's start; the database gauges are wired
    expect(metrics).toMatch(new RegExp(`^poller_last_cycle_timestamp_seconds ${clock.now() / 1000}$`, 'm'))
    expect(metrics).toMatch(/^database_up 1$/m)
    expect(metrics).toMatch(/^webhook_parked_deliveries 0$/m)
    // the stalled-poller alert allows three of it, and the longest a cycle lasts: 580 s with the default settings
    expect(metrics).toMatch(new RegExp(`^poller_interval_seconds ${SERVICE_POLL_INTERVAL_MS / 1000}$`, 'm'))
    expect(metrics).toMatch(/^poller_longest_cycle_seconds 580$/m)

    await clock.advance(SERVICE_POLL_INTERVAL_MS)
    await eventually(
      async () => (await orderByReference(service!.database.db, 'svc-1')).tradeStatus === 'delivered',
      'the order is polled',
    )
    expect(
      platform.requests.map((request) => [request.method, request.path, request.signatureValid]),
    ).toEqual([['GET', '/api/partner/v1/trades/tr_svc-1/', true]])
    // the order moves before its cycle ends: the cycle's time is set once the cycle is over
    const lastCycle = new RegExp(`^poller_last_cycle_timestamp_seconds ${clock.now() / 1000}$`, 'm')
    await eventually(async () => lastCycle.test(await (await fetch(`${service!.adminUrl}/metrics`)).text()), 'the cycle ends')
    metrics = await (await fetch(`${service.adminUrl}/metrics`)).text()
    expect(metrics).toMatch(/^poller_polls_total\{result="applied"\} 1$/m)
    expect(metrics).toMatch(/^poller_orders_due 0$/m)
    expect(metrics).toMatch(lastCycle)

    const running = service
    service = undefined
    await running.stop()
    const messages = logEntries().map((entry) => entry.msg)
    expect(messages).toContain('poller stopped')
    expect(running.poller?.running).toBe(false)
  })

  it('backs an order off, storing nothing, when the platform answers a status no webhook could carry', async () => {
    // 3,000 characters: more than an index entry holds (orders_status_idx), and more than a webhook may carry
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({ status: 200, body: tradeRecord({ trade_id: 'tr_svc-long', status: 'x'.repeat(3_000), external_reference: 'svc-long' }) }),
    })
    const clock = new FakeClock(nearDatabaseTime())
    const config = testConfig({ PARTNER_API_BASE_URL: platform.url, PORT: '0', POLL_INTERVAL_S: String(SERVICE_POLL_INTERVAL_MS / 1000) })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]), clock })
    await service.ready
    await eventually(() => pollerSleeps(clock) === 1, 'the poller sleeps')
    await insertOrders(service.database.db, [{ externalReference: 'svc-long', nextPollAt: new Date(clock.now() - 1_000) }])

    await clock.advance(SERVICE_POLL_INTERVAL_MS)
    // (a lease token of null alone is also the order before the cycle claims it)
    await eventually(async () => {
      const polled = await orderByReference(service!.database.db, 'svc-long')
      return polled.pollLeaseToken === null && polled.pollAttempts === 1
    }, 'the poll is written back')
    const order = await orderByReference(service.database.db, 'svc-long')
    // unchanged, its lease given up, and due again after the first backoff (15 to 30 s), not at once
    expect(order).toMatchObject({ tradeStatus: 'funded', pollAttempts: 1 })
    const dueInMs = new Date(order.nextPollAt!).getTime() - clock.now()
    expect(dueInMs).toBeGreaterThanOrEqual(15_000)
    expect(dueInMs).toBeLessThanOrEqual(30_000)
    const metrics = await (await fetch(`${service.adminUrl}/metrics`)).text()
    expect(metrics).toMatch(/^poller_polls_total\{result="error"\} 1$/m)
    const failure = logEntries().find((entry) => entry.msg === 'reconcile cycle done with errors: those orders back off')
    expect(JSON.stringify(failure)).toContain('(status must be at most 200 characters)')
  })

  // found from outside: a cycle run from the console was built without the metrics' hooks, so its polls (a 401 among
  // them, which PartnerEscrowPartnerApiUnauthorized reads) never reached poller_polls_total
  it("counts the polls of a cycle run from the console in /metrics, without standing in for the poller's own cycle", async () => {
    platform = await startRecordingServer({ secret: TEST_API_SECRET, answer: () => ({ status: 401, body: { error: { code: 'invalid_signature', message: 'no' } } }) })
    const token = 'console-token-of-this-test-0123456789'
    const config = testConfig({ PARTNER_API_BASE_URL: platform.url, PORT: '0', POLL_ENABLED: 'false', ADMIN_TOKEN: token })
    const clock = new FakeClock(nearDatabaseTime())
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET, token]), clock })
    await service.ready
    await insertOrders(service.database.db, [{ externalReference: 'svc-console', nextPollAt: new Date(clock.now() - 1_000) }])
    const bearer = { Authorization: `Bearer ${token}` }
    // the fake clock stands still: brought back near the database's, however long the start took on a loaded machine
    // (30 s past it and the clock guard refuses the cycle)
    await clock.advance(Math.max(0, nearDatabaseTime() - clock.now()))
    const page = await (await fetch(`${service.adminUrl}/console/reconcile`, { headers: bearer })).text()
    const fields = Object.fromEntries([...page.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((match) => [match[1]!, match[2]!]))
    const run = await fetch(`${service.adminUrl}/console/reconcile/run`, {
      method: 'POST',
      headers: { ...bearer, 'Content-Type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams(fields).toString(),
    })
    expect(run.status, await run.clone().text()).toBe(200)
    expect(await run.text()).toMatch(/claimed 1, polled 1/)
    expect(platform.requests.map((request) => request.path)).toEqual(['/api/partner/v1/trades/tr_svc-console/'])
    const metrics = await (await fetch(`${service.adminUrl}/metrics`)).text()
    expect(metrics).toMatch(/^poller_polls_total\{result="unauthorized"\} 1$/m)
    // a replica without a poller still has no cycle time of its own: the stalled-poller alert is the poller's
    expect(metrics).not.toMatch(/^poller_last_cycle_timestamp_seconds /m)
  })

  it("exports the longest its cycles can last for the stalled-poller alert, from the lease and the timeouts", async () => {
    // with PARTNER_API_TIMEOUT_MS=60000 a healthy cycle may outlast the alert's 10 minutes
    const config = testConfig({
      PORT: '0',
      POLL_INTERVAL_S: String(SERVICE_POLL_INTERVAL_MS / 1000),
      PARTNER_API_TIMEOUT_MS: '60000',
      POLL_LEASE_S: '600',
      DATABASE_STATEMENT_TIMEOUT_MS: '4000',
    })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]), clock: new FakeClock() })
    await service.ready
    const metrics = await (await fetch(`${service.adminUrl}/metrics`)).text()
    // the lease's 600 s, 4 × 60 s attempts and 3 × 60 s Retry-After waits of the last GET, 4 × (4 + 1) s of statements
    expect(metrics).toMatch(/^poller_longest_cycle_seconds 1040$/m)
    expect(metrics).toContain('# HELP poller_longest_cycle_seconds The longest one of this replica\'s poll cycles can last')
  })

  it('does not start the poller when POLL_ENABLED=false', async () => {
    const config = testConfig({ PORT: '0', POLL_ENABLED: 'false' })
    service = await startTestService({ config, logger: testLogger(), clock: new FakeClock() })
    await service.ready
    expect(service.poller).toBeUndefined()
    // no poller, no cycle time: this replica must not look like a stalled poller to the alert
    const metrics = await (await fetch(`${service.adminUrl}/metrics`)).text()
    expect(metrics).toContain('# TYPE poller_last_cycle_timestamp_seconds gauge')
    expect(metrics).not.toMatch(/^poller_last_cycle_timestamp_seconds /m)
    expect(metrics).toContain('# TYPE poller_last_cycle_age_seconds gauge')
    expect(metrics).not.toMatch(/^poller_last_cycle_age_seconds /m)
    expect(metrics).not.toMatch(/^poller_interval_seconds /m)
    expect(metrics).not.toMatch(/^poller_longest_cycle_seconds /m)
  })
})
