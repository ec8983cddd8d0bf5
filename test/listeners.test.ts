// The two listeners of `serve`: the public one (what the platform reaches) serves the webhook path,
// /healthz and /readyz and nothing else; the operator one serves metrics, also while the database is down.
import { afterEach, describe, expect, it } from 'vitest'
import type { RunningService } from '../src/service.js'
import { testLogger } from './helpers/log-sink.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { startTestService } from './helpers/test-service.js'

const logger = () => testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])

describe('the public and the operator listener', () => {
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    service = undefined
  })

  it('serves the webhook path and health publicly, metrics only on the operator listener bound to 127.0.0.1', async () => {
    service = await startTestService({ config: testConfig({ PORT: '0', POLL_ENABLED: 'false' }), logger: logger() })
    await service.ready
    expect(service.adminUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/)
    expect(service.adminUrl).not.toBe(service.url)

    expect((await fetch(`${service.url}/healthz`)).status).toBe(200)
    expect((await fetch(`${service.url}/readyz`)).status).toBe(200)
    // unsigned: refused, but the route is there
    expect((await fetch(`${service.url}/webhooks/partner`, { method: 'POST', body: '{}' })).status).toBe(401)
    const publicMetrics = await fetch(`${service.url}/metrics`)
    expect(publicMetrics.status).toBe(404)
    expect(await publicMetrics.text()).not.toContain('webhook_deliveries_total')

    const metrics = await fetch(`${service.adminUrl}/metrics`)
    expect(metrics.status).toBe(200)
    expect(await metrics.text()).toContain('# TYPE webhook_deliveries_total counter')
    // the operator listener is not a second webhook endpoint
    expect((await fetch(`${service.adminUrl}/webhooks/partner`, { method: 'POST', body: '{}' })).status).toBe(404)
  })
})

describePostgres('metrics while the database is down (Postgres)', () => {
  let database: TestDatabase | undefined
  let proxy: TcpProxy | undefined
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    await proxy?.close()
    await database?.close()
    service = undefined
    proxy = undefined
    database = undefined
  })

  it('keeps answering /metrics on the operator port from what it has, and still 404 on the public port', async () => {
    database = await createTestDatabase()
    await insertOrders(database.db, [{ externalReference: 'down-1', nextPollAt: new Date(Date.now() - 60_000) }])
    const upstream = new URL(database.url!)
    proxy = await startTcpProxy({ host: upstream.hostname, port: Number(upstream.port || 5432) })
    service = await startTestService({
      config: testConfig({ PORT: '0', POLL_ENABLED: 'false', DATABASE_URL: proxy.rewrite(database.url!) }),
      logger: logger(),
    })
    await service.ready
    let scrape = await (await fetch(`${service.adminUrl}/metrics`)).text()
    expect(scrape).toMatch(/^poller_orders_due 1$/m)
    expect(scrape).toMatch(/^database_up 1$/m)

    proxy.cut()
    expect((await fetch(`${service.url}/readyz`)).status).toBe(503)
    const response = await fetch(`${service.adminUrl}/metrics`)
    expect(response.status).toBe(200)
    scrape = await response.text()
    expect(scrape).toContain('# TYPE webhook_deliveries_total counter')
    expect(scrape).toMatch(/^process_resident_memory_bytes \d+/m)
    // what needs the database says it is down; the rest is there
    expect(scrape).toMatch(/^database_up 0$/m)
    expect(scrape).not.toMatch(/^poller_orders_due /m)
    expect((await fetch(`${service.url}/metrics`)).status).toBe(404)

    proxy.restore()
  })
})
