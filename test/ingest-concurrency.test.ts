import { afterAll, beforeAll, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { createOrder } from './helpers/orders.js'
import { statusRank } from '../src/orders/trade-status.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig({ LOG_LEVEL: 'warn' })

// a seeded shuffle keeps a failure reproducible
function shuffled<T>(items: T[], seed: number): T[] {
  const copy = [...items]
  let state = seed
  for (let i = copy.length - 1; i > 0; i--) {
    state = (state * 1_103_515_245 + 12_345) % 2 ** 31
    const j = state % (i + 1)
    ;[copy[i], copy[j]] = [copy[j]!, copy[i]!]
  }
  return copy
}

describePostgres('ingest under concurrency (Postgres)', () => {
  let database: TestDatabase
  let app: App

  beforeAll(async () => {
    database = await createTestDatabase({ poolSize: 20 })
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
  })
  afterAll(async () => {
    await database.close()
  })

  it('applies the same delivery sent 50 times at once exactly once', async () => {
    const { order } = await createOrder(database.db, { externalReference: 'same-50' })
    const body = JSON.stringify(tradePayload('same-50', 'funded'))
    const responses = await Promise.all(
      Array.from({ length: 50 }, () => sendWebhook(app, { body, deliveryId: 'dlv-same-50' })),
    )
    expect(responses.map((response) => response.status)).toEqual(Array(50).fill(200))
    expect(responses.filter((response) => response.body.duplicate === true)).toHaveLength(49)
    expect(await orderHistory(database.db, order.id)).toHaveLength(1)
    const rows = await database.db.selectFrom('webhookDeliveries').select('outcome').where('deliveryId', '=', 'dlv-same-50').execute()
    expect(rows).toEqual([{ outcome: 'applied' }])
  })

  it('leaves 100 orders at their highest-ranked status after 1,000 shuffled deliveries with replays', async () => {
    const lifecycles = [
      ['created', 'funded', 'delivered', 'released'],
      ['created', 'funded', 'disputed', 'resolved'],
      ['created', 'funded', 'cancelled', 'refunded'],
      ['created', 'funded', 'delivered', 'disputed'],
    ]
    const expected = new Map<string, string>()
    const deliveries: { ref: string; status: string; deliveryId: string }[] = []
    for (let i = 0; i < 100; i++) {
      const ref = `bulk-${i}`
      await createOrder(database.db, { externalReference: ref })
      // each order gets a prefix of a lifecycle, then replays and stale repeats under fresh ids, 10 in all
      const lifecycle = lifecycles[i % lifecycles.length]!.slice(0, 2 + (i % 3))
      expected.set(ref, lifecycle.at(-1)!)
      for (let k = 0; k < 10; k++) {
        deliveries.push({ ref, status: lifecycle[k % lifecycle.length]!, deliveryId: `bulk-${i}-${k}` })
      }
    }
    expect(deliveries).toHaveLength(1_000)

    const order = shuffled(deliveries, 42)
    const responses = []
    for (let start = 0; start < order.length; start += 100) {
      responses.push(
        ...(await Promise.all(
          order
            .slice(start, start + 100)
            .map((d) => sendWebhook(app, { body: tradePayload(d.ref, d.status), deliveryId: d.deliveryId })),
        )),
      )
    }
    expect(responses.every((response) => response.status === 200)).toBe(true)

    for (const [ref, status] of expected) {
      const found = await findOrderByExternalReference(database.db, ref)
      expect(found?.tradeStatus, ref).toBe(status)
      const history = await orderHistory(database.db, found!.id)
      const transitions = history.map((change) => `${change.fromStatus}->${change.toStatus}`)
      expect(new Set(transitions).size, `${ref}: ${transitions.join(', ')}`).toBe(transitions.length)
      // the history only ever climbs
      const ranks = history.map((change) => statusRank(change.toStatus)!)
      expect([...ranks].sort((a, b) => a - b)).toEqual(ranks)
      expect(history.at(-1)?.toStatus).toBe(status)
    }
  })
})

