// When an order comes due, as the trades service, the webhooks and the poller leave it: after an API
// call it expects a webhook and is polled EXPECTED_WEBHOOK_S later unless one came; after any observation
// it is polled STALE_AFTER_S later; a terminal order never.
import { beforeEach, describe, expect, it } from 'vitest'
import { applyObservation } from '../src/orders/apply-observation.js'
import { openTradeForOrder } from '../src/trades/open-trade-for-order.js'
import { runTradeOperation } from '../src/trades/run-trade-operation.js'
import type { TradeDeps } from '../src/trades/trade-deps.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { fakeTradeApi } from './helpers/partner-api-fake-client.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type CountingFetcher, countingFetcher, orderByReference } from './helpers/reconcile-orders.js'
import { type TestPoller, testPoller } from './helpers/reconcile-poller.js'
import { useTestDatabase } from './helpers/test-database.js'
import { NO_REACTION_HANDLERS } from '../src/orders/apply-observation.js'

const EXPECTED_WEBHOOK_S = 600
const STALE_AFTER_S = 21_600

describe('when an order is due', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  let trades: TradeDeps
  let fetcher: CountingFetcher
  let poller: TestPoller
  let start: number

  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
    clock = new FakeClock()
    start = clock.now()
    trades = {
      db: database.db,
      client: fakeTradeApi({
        createTrade: async (request) =>
          tradeRecord({
            trade_id: 'tr_1',
            external_reference: request.external_reference,
            status: 'created',
          }),
        fundTrade: async () =>
          tradeRecord({ trade_id: 'tr_1', external_reference: 'order-1', status: 'funded' }),
        cancelTrade: async () =>
          tradeRecord({ trade_id: 'tr_1', external_reference: 'order-1', status: 'cancelled' }),
      }),
      clock,
      logger: testLogger(),
      settings: { expectedWebhookS: EXPECTED_WEBHOOK_S, observation: { staleAfterS: STALE_AFTER_S, handlersFor: NO_REACTION_HANDLERS }, partnerKind: 'marketplace', createTimeoutMs: 10_000 },
    }
    // the platform's record of order-1's trade (a record of another order's would flag it for an operator)
    fetcher = countingFetcher(() => tradeRecord({ trade_id: 'tr_1', external_reference: 'order-1', status: 'funded' }))
    poller = testPoller({ db: database.db, fetcher, clock, settings: { observation: { staleAfterS: STALE_AFTER_S, handlersFor: NO_REACTION_HANDLERS } } })
  })

  const at = async (s: number) => clock.advance(start + s * 1000 - clock.now())
  const polledAt = async (s: number) => {
    await at(s)
    return (await poller.runOnce()).claimed === 1
  }
  const webhook = (status: string) =>
    applyObservation(
      database.db,
      {
        target: { externalReference: 'order-1' },
        tradeId: 'tr_1',
        externalReference: 'order-1',
        status,
        source: 'webhook',
        deliveryId: `dlv_${status}`,
        observedAt: new Date(clock.now()),
      },
      { staleAfterS: STALE_AFTER_S, handlersFor: NO_REACTION_HANDLERS },
    )

  async function openAndFund() {
    await openTradeForOrder(trades, 'order-1', {
      title: 'Bicycle',
      amount: '10.00',
      currency: 'EUR',
      seller_id: 's',
    })
    await at(100)
    await runTradeOperation(trades, 'order-1', { kind: 'fund' })
  }

  it('is EXPECTED_WEBHOOK_S after an API call when no webhook follows', async () => {
    await openAndFund()
    expect(await polledAt(100 + EXPECTED_WEBHOOK_S - 1)).toBe(false)
    expect(await polledAt(100 + EXPECTED_WEBHOOK_S)).toBe(true)
    expect(fetcher.calls).toEqual(['tr_1'])
    // polled: next due STALE_AFTER_S after the poll
    const order = await orderByReference(database.db, 'order-1')
    expect(new Date(order.nextPollAt!).getTime()).toBe(
      start + (100 + EXPECTED_WEBHOOK_S + STALE_AFTER_S) * 1000,
    )
  })

  it('is STALE_AFTER_S after a webhook that moved the order after the API call, not EXPECTED_WEBHOOK_S', async () => {
    await openAndFund()
    await at(110)
    expect((await webhook('delivered')).outcome).toBe('applied')
    expect(await polledAt(100 + EXPECTED_WEBHOOK_S)).toBe(false)
    expect(await polledAt(110 + STALE_AFTER_S - 1)).toBe(false)
    expect(await polledAt(110 + STALE_AFTER_S)).toBe(true)
  })

  it('is STALE_AFTER_S after a webhook that confirmed what the API call answered', async () => {
    await openAndFund()
    await at(105)
    expect((await webhook('funded')).outcome).toBe('duplicate_effect')
    expect(await polledAt(100 + EXPECTED_WEBHOOK_S)).toBe(false)
    expect(await polledAt(105 + STALE_AFTER_S)).toBe(true)
  })

  it('is never, once a webhook brought a terminal status', async () => {
    await openAndFund()
    await at(120)
    expect((await webhook('released')).outcome).toBe('applied')
    expect((await orderByReference(database.db, 'order-1')).nextPollAt).toBeNull()
    expect(await polledAt(100 + EXPECTED_WEBHOOK_S)).toBe(false)
    expect(await polledAt(10 * 365 * 86_400)).toBe(false)
    expect(fetcher.calls).toEqual([])
  })

  it('is EXPECTED_WEBHOOK_S after an API call made while a poll of the order was in flight', async () => {
    await openAndFund()
    // the API is called (and reschedules the order) while the poll's GET is under way
    const pollStart = 100 + EXPECTED_WEBHOOK_S
    poller = testPoller({
      db: database.db,
      fetcher: countingFetcher(async () => {
        await at(pollStart + 5)
        await runTradeOperation(trades, 'order-1', { kind: 'fund' })
        return tradeRecord({ trade_id: 'tr_1', external_reference: 'order-1', status: 'funded' })
      }),
      clock,
      settings: { observation: { staleAfterS: STALE_AFTER_S, handlersFor: NO_REACTION_HANDLERS } },
    })
    expect(await polledAt(pollStart)).toBe(true)
    // the poll's write-back does not push the API call's poll out to STALE_AFTER_S
    const order = await orderByReference(database.db, 'order-1')
    expect(new Date(order.nextPollAt!).getTime()).toBe(start + (pollStart + 5 + EXPECTED_WEBHOOK_S) * 1000)
  })

  it('is STALE_AFTER_S after a poll when nothing rescheduled the order meanwhile', async () => {
    await openAndFund()
    expect(await polledAt(100 + EXPECTED_WEBHOOK_S)).toBe(true)
    const order = await orderByReference(database.db, 'order-1')
    expect(new Date(order.nextPollAt!).getTime()).toBe(start + (100 + EXPECTED_WEBHOOK_S + STALE_AFTER_S) * 1000)
  })

  // found from outside: a cancel's answer applied, the platform's own `cancelled` webhook then put the poll
  // STALE_AFTER_S (6 h) on, and with the `refunded` webhook lost the order showed cancelled, not refunded, for 6 h
  describe('after a cancel, which the platform follows on its own with the refund', () => {
    const observation = { staleAfterS: STALE_AFTER_S, expectedWebhookS: EXPECTED_WEBHOOK_S, handlersFor: NO_REACTION_HANDLERS }
    const service = (status: string, source: 'webhook' | 'poll') =>
      applyObservation(
        database.db,
        { target: { externalReference: 'order-1' }, tradeId: 'tr_1', externalReference: 'order-1', status, source, deliveryId: `dlv_${status}_${clock.now()}`, observedAt: new Date(clock.now()) },
        observation,
      )
    const nextPollS = async () => (new Date((await orderByReference(database.db, 'order-1')).nextPollAt!).getTime() - start) / 1000

    it('a cancel answered, then its webhook: polled EXPECTED_WEBHOOK_S after the call, not STALE_AFTER_S', async () => {
      trades = { ...trades, settings: { ...trades.settings, observation } }
      await openAndFund()
      await at(200)
      await runTradeOperation(trades, 'order-1', { kind: 'cancel' })
      expect(await nextPollS()).toBe(200 + EXPECTED_WEBHOOK_S)
      await at(205)
      expect((await service('cancelled', 'webhook')).outcome).toBe('duplicate_effect')
      expect(await nextPollS()).toBe(200 + EXPECTED_WEBHOOK_S)
      // the poll finds it cancelled still: from there STALE_AFTER_S, as any order
      fetcher = countingFetcher(() => tradeRecord({ trade_id: 'tr_1', external_reference: 'order-1', status: 'cancelled' }))
      poller = testPoller({ db: database.db, fetcher, clock, settings: { observation } })
      expect(await polledAt(200 + EXPECTED_WEBHOOK_S)).toBe(true)
      expect(await nextPollS()).toBe(200 + EXPECTED_WEBHOOK_S + STALE_AFTER_S)
    })

    it('a webhook or a poll that moves the order to cancelled: polled EXPECTED_WEBHOOK_S later; to delivered, STALE_AFTER_S', async () => {
      await openAndFund()
      await at(300)
      expect((await service('delivered', 'webhook')).outcome).toBe('applied')
      expect(await nextPollS()).toBe(300 + STALE_AFTER_S)
      await at(310)
      expect((await service('cancelled', 'webhook')).outcome).toBe('applied')
      expect(await nextPollS()).toBe(310 + EXPECTED_WEBHOOK_S)
      // a poll whose answer moves an order to cancelled
      await database.db.deleteFrom('orders').execute()
      fetcher = countingFetcher(() => tradeRecord({ trade_id: 'tr_1', external_reference: 'order-1', status: 'cancelled' }))
      poller = testPoller({ db: database.db, fetcher, clock, settings: { observation } })
      start = clock.now()
      await openAndFund()
      expect(await polledAt(100 + EXPECTED_WEBHOOK_S)).toBe(true)
      expect((await orderByReference(database.db, 'order-1')).tradeStatus).toBe('cancelled')
      expect(await nextPollS()).toBe(100 + 2 * EXPECTED_WEBHOOK_S)
    })
  })

  it('is never before the order has a trade', async () => {
    await database.db.insertInto('orders').values({ externalReference: 'order-1' }).execute()
    expect((await orderByReference(database.db, 'order-1')).nextPollAt).toBeNull()
    expect(await polledAt(10 * 365 * 86_400)).toBe(false)
  })
})
