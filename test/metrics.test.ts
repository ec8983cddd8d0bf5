import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { createOrder } from '../src/orders/order.repository.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

describe('GET /metrics', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })

  it('counts deliveries by outcome, signature failures and ingest latency, and reads the due orders', async () => {
    const config = testConfig()
    const metrics = createMetrics(
      { poolStats: database.poolStats, dueOrders: async () => ({ ordersDue: 3, oldestDueAgeS: 42 }) },
      { defaultMetrics: false },
    )
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock, metrics })
    await createOrder(database.db, { externalReference: 'm-1' })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded') })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded') })
    await sendWebhook(app, { body: tradePayload('m-1', 'funded'), signature: 'sha256=00' })

    const response = await request(app).get('/metrics')
    expect(response.status).toBe(200)
    expect(response.headers['content-type']).toContain('text/plain')
    expect(response.text).toContain('webhook_deliveries_total{outcome="applied"} 1')
    expect(response.text).toContain('webhook_deliveries_total{outcome="duplicate_effect"} 1')
    expect(response.text).toContain('webhook_signature_failures_total 1')
    expect(response.text).toContain('webhook_ingest_duration_seconds_count{outcome="applied"} 1')
    expect(response.text).toContain('poller_orders_due 3')
    expect(response.text).toContain('poller_oldest_due_age_seconds 42')
    expect(response.text).toMatch(/database_pool_connections\{state="idle"\} \d+/)
  })

  it('is not served when metrics are switched off', async () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const config = testConfig({ METRICS_ENABLED: 'false' })
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock, metrics })
    expect((await request(app).get('/metrics')).status).toBe(404)
  })
})
