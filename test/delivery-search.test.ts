// The console's and the CLI's searches of deliveries by trade id or external reference read two sources (the
// deliveries not applied through their partial indexes, the applied ones through their order's history;
// migrations/0014). Whatever the deliveries did, the search must find exactly the rows a plain scan of the
// table finds, in the same order, across pages; so must the bulk re-apply's count and its list.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type App, createApp } from '../src/http/app.js'
import {
  countDeliveriesByOutcome,
  type DeliveryCursor,
  type DeliveryFilter,
  findDelivery,
  listDeliveriesToReapply,
  searchDeliveries,
} from '../src/webhooks/delivery.repository.js'
import { reapplyDelivery } from '../src/webhooks/parked-deliveries.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { createOrder, TEST_OBSERVATION_SETTINGS } from './helpers/orders.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig()

describe('searching deliveries by trade id and external reference', () => {
  let database: TestDatabase
  let app: App
  const clock = new FakeClock(Date.parse('2026-12-01T00:00:00Z'))
  let sequence = 0

  const send = async (body: object | string, deliveryId = `ds-${++sequence}`) => {
    await clock.advance(1_000)
    const answer = await sendWebhook(app, { body, deliveryId })
    expect(answer.status, deliveryId).toBe(200)
    return deliveryId
  }

  beforeAll(async () => {
    database = await createTestDatabase()
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock })
    const now = () => new Date(clock.now())

    // an order moved by webhooks: applied, a replay of its status, a stale one, applied again
    await createOrder(database.db, { externalReference: 'ds-a', now })
    await send(tradePayload('ds-a', 'funded'))
    await send(tradePayload('ds-a', 'funded'))
    await send(tradePayload('ds-a', 'created'))
    const delivered = await send(tradePayload('ds-a', 'delivered'))
    // a retry of a stored delivery changes nothing; a re-apply of an applied one keeps it applied
    await send(tradePayload('ds-a', 'delivered'), delivered)
    await reapplyDelivery(database.db, (await findDelivery(database.db, delivered))!, TEST_OBSERVATION_SETTINGS, now())

    // parked before its order existed, replayed, then applied when the order came
    await send(tradePayload('ds-b', 'funded'))
    await send(tradePayload('ds-b', 'funded'))
    await createOrder(database.db, { externalReference: 'ds-b', now })
    await send(tradePayload('ds-b', 'released'))

    // another trade for an order already linked (trade_mismatch), found by either trade id
    await send(tradePayload('ds-a', 'released', 'trd_elsewhere'))
    // an id reused with another body, a status the table does not know, a reference with no order at all
    await send(tradePayload('ds-b', 'disputed'), delivered)
    await send(tradePayload('ds-a', 'teleported'))
    await send(tradePayload('ds-nobody', 'funded'))
    // a blank trade id: stored invalid, under its reference
    await send(tradePayload('ds-a', 'funded', ''))
  })
  afterAll(async () => {
    await database.close()
  })

  // the plain scan the indexes once served: every row with the value, newest first
  const scanned = async (filter: DeliveryFilter) => {
    let query = database.db.selectFrom('webhookDeliveries').select(['deliveryId', 'bodySha256', 'outcome'])
    if (filter.tradeId) query = query.where('tradeId', '=', filter.tradeId)
    if (filter.externalReference) query = query.where('externalReference', '=', filter.externalReference)
    if (filter.outcome) query = query.where('outcome', '=', filter.outcome)
    return query.orderBy('receivedAt', 'desc').orderBy('deliveryId', 'desc').orderBy('bodySha256', 'desc').execute()
  }

  const searchedInPages = async (filter: DeliveryFilter, pageSize: number) => {
    const rows: { deliveryId: string; bodySha256: string; outcome: string }[] = []
    let after: DeliveryCursor | undefined
    do {
      const page = await searchDeliveries(database.db, filter, { after, limit: pageSize })
      rows.push(...page.deliveries.map(({ deliveryId, bodySha256, outcome }) => ({ deliveryId, bodySha256, outcome })))
      after = page.next
    } while (after)
    return rows
  }

  const filters: DeliveryFilter[] = [
    { externalReference: 'ds-a' },
    { externalReference: 'ds-b' },
    { externalReference: 'ds-nobody' },
    { tradeId: 'trd_ds-a' },
    { tradeId: 'trd_ds-b' },
    { tradeId: 'trd_elsewhere' },
    { tradeId: 'trd_ds-a', externalReference: 'ds-a' },
    { tradeId: 'trd_ds-a', externalReference: 'ds-b' },
    { externalReference: 'ds-a', outcome: 'applied' },
    { externalReference: 'ds-a', outcome: 'duplicate_effect' },
    { tradeId: 'trd_ds-b', outcome: 'applied' },
  ]

  it('holds deliveries of every kind the search must reach', async () => {
    const outcomes = new Set((await scanned({})).map((row) => row.outcome))
    for (const outcome of ['applied', 'duplicate_effect', 'stale', 'trade_mismatch', 'unknown_status', 'unmatched', 'invalid']) {
      expect(outcomes).toContain(outcome)
    }
    // the parked delivery applied when its order came, and the one an operator re-applied, are applied rows
    expect((await scanned({ externalReference: 'ds-b', outcome: 'applied' })).length).toBe(2)
  })

  for (const filter of filters) {
    it(`finds what a scan of the table finds, in order and across pages: ${JSON.stringify(filter)}`, async () => {
      const expected = await scanned(filter)
      // every filter but the one naming a trade and another order's reference finds something
      if (!(filter.tradeId === 'trd_ds-a' && filter.externalReference === 'ds-b')) expect(expected.length).toBeGreaterThan(0)
      for (const pageSize of [1, 2, 50]) {
        expect(await searchedInPages(filter, pageSize), `pages of ${pageSize}`).toEqual(expected)
      }
    })

    it(`counts and lists for a bulk re-apply what a scan finds: ${JSON.stringify(filter)}`, async () => {
      const expected = await scanned(filter)
      const counted = await countDeliveriesByOutcome(database.db, filter)
      const byOutcome = new Map<string, number>()
      for (const row of expected) byOutcome.set(row.outcome, (byOutcome.get(row.outcome) ?? 0) + 1)
      expect(new Map(counted.map((row) => [row.outcome, row.deliveries]))).toEqual(byOutcome)
      const oldestFirst = [...expected].reverse()
      for (const limit of [1, 3, 100]) {
        // run after run, each starting after the last row of the one before, until none is left: every row once, in order
        const runs: { deliveryId: string; bodySha256: string; outcome: string }[][] = []
        let startAfter: Awaited<ReturnType<typeof listDeliveriesToReapply>>['next']
        do {
          const { deliveries, next } = await listDeliveriesToReapply(database.db, { ...filter, startAfter }, limit)
          runs.push(deliveries.map(({ deliveryId, bodySha256, outcome }) => ({ deliveryId, bodySha256, outcome })))
          startAfter = next
        } while (startAfter && runs.length <= expected.length)
        expect(runs[0], `limit ${limit}`).toEqual(oldestFirst.slice(0, limit))
        expect(runs.flat(), `limit ${limit}`).toEqual(oldestFirst)
        expect(runs.slice(0, -1).every((run) => run.length === limit)).toBe(true)
      }
    })
  }
})
