// What a poll's write-back leaves when the order changed while the poll was under way. The claim holds no row lock
// while its GET runs, so a webhook can make the order terminal, move and reschedule it, or a trade command can flag
// it, in the meantime. A failed poll and a claim given back untried know nothing newer than the claim: they never
// make a terminal order due again, and a schedule written since the claim stands, earlier or later. An outside
// attack left released orders due for good this way (poller_orders_due above 0 and poller_oldest_due_age_seconds
// growing until PartnerEscrowOldestDueOrderLate fired), through a poll that timed out and through a SIGTERM.
import type { Kysely } from 'kysely'
import { beforeEach, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { apiObservation } from '../src/orders/observations.js'
import { countDueOrders, flagLinkedOrder, TRADE_MISMATCH } from '../src/orders/poll-schedule.repository.js'
import { PartnerTimeoutError } from '../src/partner-api/partner-api-error.js'
import type { TradeRecord } from '../src/partner-api/types.js'
import type { TradeFetcher } from '../src/reconcile/poll-order.js'
import { dueOrderStats } from '../src/reconcile/poller.js'
import { FakeClock } from './helpers/fake-clock.js'
import { TEST_OBSERVATION_SETTINGS } from './helpers/orders.js'
import { countingFetcher, insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { eventually, TEST_POLLER_SETTINGS, testPoller } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, type TestDatabase, useTestDatabase } from './helpers/test-database.js'

const STALE_AFTER_S = 21_600
const DAY_MS = 86_400_000

const historyOf = (db: Kysely<Database>, orderId: number) =>
  db.selectFrom('orderStatusHistory').select(['fromStatus', 'toStatus', 'source']).where('orderId', '=', orderId).orderBy('id').execute()

const timedOut = () => new PartnerTimeoutError('the platform did not answer within 10000 ms', 10_000)

/** A platform whose GETs never answer: each ends only when the cycle aborts it (the replica is stopped). */
function hangingFetcher(): TradeFetcher & { calls: number } {
  return {
    calls: 0,
    getTrade(_tradeId: string, options?: { signal?: AbortSignal }) {
      this.calls++
      return new Promise<TradeRecord>((_, reject) => options?.signal?.addEventListener('abort', () => reject(options.signal!.reason)))
    },
  }
}

function receiveWebhook(db: Kysely<Database>, clock: FakeClock, externalReference: string, status: string) {
  return applyObservation(
    db,
    {
      target: { externalReference },
      tradeId: `tr_${externalReference}`,
      externalReference,
      status,
      source: 'webhook',
      deliveryId: `dlv_${externalReference}_${status}`,
      observedAt: new Date(clock.now()),
    },
    TEST_OBSERVATION_SETTINGS,
  )
}

describe('a poll write-back after the order changed under it', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  const fromNow = (s: number) => new Date(clock.now() + s * 1000)
  const webhook = (externalReference: string, status: string) => receiveWebhook(database.db, clock, externalReference, status)

  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
    clock = new FakeClock()
  })

  it('leaves a terminal order off the schedule when its poll times out after a webhook released it', async () => {
    await insertOrders(database.db, [{ externalReference: 'order-1', nextPollAt: fromNow(-60) }])
    const fetcher = countingFetcher(async () => {
      await clock.advance(5_000)
      expect((await webhook('order-1', 'released')).outcome).toBe('applied')
      return timedOut()
    })
    const poller = testPoller({ db: database.db, fetcher, clock })
    await poller.runOnce()
    expect(poller.reported.map((result) => result.result)).toEqual(['error'])

    const order = await orderByReference(database.db, 'order-1')
    expect(order).toMatchObject({ tradeStatus: 'released', isTerminal: true, nextPollAt: null, pollLeaseToken: null, pollLeaseExpiresAt: null })
    // a day later the order is still not due: the gauges read 0 and no cycle polls it
    await clock.advance(DAY_MS)
    expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
    expect((await poller.runOnce()).claimed).toBe(0)
    expect(fetcher.calls).toHaveLength(1)
  })

  it('gives claims back on stop without making due again the orders a webhook released meanwhile', async () => {
    await insertOrders(database.db, [
      { externalReference: 'in-flight', nextPollAt: fromNow(-20) },
      { externalReference: 'waiting', nextPollAt: fromNow(-10) },
      { externalReference: 'untouched', nextPollAt: fromNow(-5) },
    ])
    const fetcher = hangingFetcher()
    // one GET at a time: the first order's is in flight, the other two are claimed and wait their turn
    const poller = testPoller({ db: database.db, fetcher, clock, settings: { concurrency: 1 } })
    poller.start()
    await eventually(() => fetcher.calls === 1, 'the first poll is in flight')
    expect((await orderByReference(database.db, 'waiting')).pollLeaseToken).not.toBeNull()
    for (const reference of ['in-flight', 'waiting']) expect((await webhook(reference, 'released')).outcome).toBe('applied')
    await poller.stop()

    for (const reference of ['in-flight', 'waiting']) {
      const order = await orderByReference(database.db, reference)
      expect(order, reference).toMatchObject({ isTerminal: true, nextPollAt: null, pollLeaseToken: null, pollLeaseExpiresAt: null, pollAttempts: 0 })
    }
    // the claim no one changed is given back as it was
    const untouched = await orderByReference(database.db, 'untouched')
    expect(untouched).toMatchObject({ pollLeaseToken: null, pollAttempts: 0 })
    expect(new Date(untouched.nextPollAt!).toISOString()).toBe(fromNow(-5).toISOString())
    await clock.advance(DAY_MS)
    expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 1, oldestDueAgeS: DAY_MS / 1000 + 5 })
  })

  it('keeps the schedule of a webhook that moved the order while its poll failed, not the backoff', async () => {
    await insertOrders(database.db, [{ externalReference: 'order-1', nextPollAt: fromNow(-60) }])
    let webhookAt = 0
    const fetcher = countingFetcher(async () => {
      await clock.advance(5_000)
      webhookAt = clock.now()
      expect((await webhook('order-1', 'delivered')).outcome).toBe('applied')
      return timedOut()
    })
    const poller = testPoller({ db: database.db, fetcher, clock })
    await poller.runOnce()
    expect(poller.reported.map((result) => result.result)).toEqual(['error'])
    const order = await orderByReference(database.db, 'order-1')
    expect(order).toMatchObject({ tradeStatus: 'delivered', pollLeaseToken: null })
    // the webhook is news the failed poll did not have: STALE_AFTER_S after it, not a poll again within the backoff
    expect(new Date(order.nextPollAt!).getTime()).toBe(webhookAt + STALE_AFTER_S * 1000)
    expect(TEST_POLLER_SETTINGS.backoff!.capS).toBeLessThan(STALE_AFTER_S)
  })

  it('keeps the schedule of a webhook that moved a claimed order when the claim is given back on stop, not its old due time', async () => {
    await insertOrders(database.db, [
      { externalReference: 'in-flight', nextPollAt: fromNow(-20) },
      { externalReference: 'waiting', nextPollAt: fromNow(-10) },
    ])
    const fetcher = hangingFetcher()
    const poller = testPoller({ db: database.db, fetcher, clock, settings: { concurrency: 1 } })
    poller.start()
    await eventually(() => fetcher.calls === 1, 'the first poll is in flight')
    await clock.advance(3_000)
    const webhookAt = clock.now()
    for (const reference of ['in-flight', 'waiting']) expect((await webhook(reference, 'delivered')).outcome).toBe('applied')
    await poller.stop()

    for (const reference of ['in-flight', 'waiting']) {
      const order = await orderByReference(database.db, reference)
      expect(order, reference).toMatchObject({ tradeStatus: 'delivered', pollLeaseToken: null, pollAttempts: 0 })
      expect(new Date(order.nextPollAt!).getTime(), reference).toBe(webhookAt + STALE_AFTER_S * 1000)
    }
    expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
  })

  it('leaves an order a trade command flagged while its poll failed off the schedule, with its flag', async () => {
    const [id] = await insertOrders(database.db, [{ externalReference: 'order-1', nextPollAt: fromNow(-60) }])
    const fetcher = countingFetcher(async () => {
      await flagLinkedOrder(database.db, { orderId: id!, now: new Date(clock.now()), attention: TRADE_MISMATCH })
      return timedOut()
    })
    const poller = testPoller({ db: database.db, fetcher, clock })
    await poller.runOnce()
    expect(await orderByReference(database.db, 'order-1')).toMatchObject({ attention: TRADE_MISMATCH, nextPollAt: null, pollLeaseToken: null })
    await clock.advance(DAY_MS)
    expect((await poller.runOnce()).claimed).toBe(0)
    expect(fetcher.calls).toHaveLength(1)
  })

  it('leaves an order a trade command flagged while its poll was answered off the schedule, moved but flagged', async () => {
    const [id] = await insertOrders(database.db, [{ externalReference: 'order-1', nextPollAt: fromNow(-60) }])
    const fetcher = countingFetcher(async () => {
      await flagLinkedOrder(database.db, { orderId: id!, now: new Date(clock.now()), attention: TRADE_MISMATCH })
      return 'delivered'
    })
    const poller = testPoller({ db: database.db, fetcher, clock })
    await poller.runOnce()
    expect(poller.reported.map((result) => result.result)).toEqual(['applied'])
    // the answer is the platform's word and moves the order; the flag is an operator's to clear (orders requeue)
    expect(await orderByReference(database.db, 'order-1')).toMatchObject({
      tradeStatus: 'delivered',
      attention: TRADE_MISMATCH,
      nextPollAt: null,
      pollLeaseToken: null,
    })
    await clock.advance(DAY_MS)
    expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
    expect((await poller.runOnce()).claimed).toBe(0)
    expect(fetcher.calls).toHaveLength(1)
  })

  // An answer the order moved past while it was on its way cannot be placed by rank when its status is unknown (or
  // the order's is): it is stale, and the order is polled again now. An outside attack saw an old on_hold take an
  // order back from a delivered webhook, and the handlers given a second trade.delivered when the next poll
  // brought it back.
  it('keeps the webhook\'s status when a poll answers an unknown status it asked for before the webhook, and polls again now', async () => {
    await insertOrders(database.db, [{ externalReference: 'order-1', tradeStatus: 'funded', nextPollAt: fromNow(-60) }])
    let answers = 0
    const fetcher = countingFetcher(async () => {
      answers++
      if (answers > 1) return 'on_hold'
      // the trade was on hold when asked; its hold lifted and delivered meanwhile, and that webhook came first
      await clock.advance(5_000)
      expect((await webhook('order-1', 'delivered')).outcome).toBe('applied')
      return 'on_hold'
    })
    const poller = testPoller({ db: database.db, fetcher, clock })
    await poller.runOnce()
    expect(poller.reported.map((result) => result.result)).toEqual(['stale'])
    const order = await orderByReference(database.db, 'order-1')
    expect(order).toMatchObject({ tradeStatus: 'delivered', statusSource: 'webhook', pollLeaseToken: null })
    expect(order.nextPollAt!.getTime()).toBeLessThanOrEqual(clock.now())
    expect((await historyOf(database.db, order.id)).map((row) => `${row.fromStatus}->${row.toStatus} ${row.source}`)).toEqual(['funded->delivered webhook'])

    // the poll now, asked after the order's last move: a hold the trade really went on is followed
    await poller.runOnce()
    expect((await orderByReference(database.db, 'order-1')).tradeStatus).toBe('on_hold')
    expect((await historyOf(database.db, order.id)).map((row) => `${row.fromStatus}->${row.toStatus} ${row.source}`)).toEqual([
      'funded->delivered webhook',
      'delivered->on_hold poll',
    ])
  })

  it('keeps a hold a trade command\'s answer put on while a poll was on its way, the poll\'s older funded notwithstanding, and polls again now', async () => {
    const [orderId] = await insertOrders(database.db, [{ externalReference: 'order-1', tradeStatus: 'funded', nextPollAt: fromNow(-60) }])
    const fetcher = countingFetcher(async (_tradeId, call) => {
      if (call > 1) return 'funded'
      await clock.advance(5_000)
      // a trade command answered meanwhile with the trade on hold (an unknown status, which an answer applies)
      const answered = apiObservation({ orderId: orderId!, externalReference: 'order-1' }, { trade_id: 'tr_order-1', status: 'on_hold' }, new Date(clock.now()))
      expect((await applyObservation(database.db, answered, TEST_OBSERVATION_SETTINGS)).outcome).toBe('applied')
      return 'funded'
    })
    const poller = testPoller({ db: database.db, fetcher, clock })
    await poller.runOnce()
    const held = await orderByReference(database.db, 'order-1')
    expect(held.tradeStatus).toBe('on_hold')
    expect(held.nextPollAt!.getTime()).toBeLessThanOrEqual(clock.now())
    // asked after the hold: the platform's funded is the hold lifted
    await poller.runOnce()
    expect((await orderByReference(database.db, 'order-1')).tradeStatus).toBe('funded')
  })

  it('counts as due, and as the oldest, no terminal order a broken invariant left with a next poll time', async () => {
    // as an earlier version's failed poll or SIGTERM left them
    await insertOrders(database.db, [
      { externalReference: 'released-long-ago', tradeStatus: 'released', isTerminal: true, nextPollAt: fromNow(-3_600) },
      { externalReference: 'cancelled', tradeStatus: 'cancelled', isTerminal: true, nextPollAt: fromNow(-600) },
      { externalReference: 'funded', nextPollAt: fromNow(-30) },
      { externalReference: 'later', nextPollAt: fromNow(30) },
    ])
    expect(await countDueOrders(database.db, new Date(clock.now()))).toEqual({ ordersDue: 1, oldestDueAgeS: 30 })
  })
})

describePostgres('a webhook another replica received while this one polled (Postgres)', () => {
  let database: TestDatabase
  let clock: FakeClock
  const fromNow = (s: number) => new Date(clock.now() + s * 1000)

  beforeEach(async () => {
    clock = new FakeClock()
  })

  it('neither a timed-out poll nor a stop makes the released orders due again', async () => {
    database = await createTestDatabase()
    const other = database.openAnother()
    try {
      await insertOrders(database.db, [
        { externalReference: 'timed-out', nextPollAt: fromNow(-30) },
        { externalReference: 'in-flight', nextPollAt: fromNow(-20) },
        { externalReference: 'waiting', nextPollAt: fromNow(-10) },
      ])
      // path A: the GET times out after the other replica's webhook released the order
      const failing = countingFetcher(async () => {
        expect((await receiveWebhook(other.db, clock, 'timed-out', 'released')).outcome).toBe('applied')
        return timedOut()
      })
      const once = testPoller({ db: database.db, fetcher: failing, clock, settings: { batchSize: 1 } })
      await once.runOnce()
      expect(once.reported.map((result) => result.result)).toEqual(['error'])

      // path B: claims given back on stop, after the other replica's webhooks released them
      const hanging = hangingFetcher()
      const poller = testPoller({ db: database.db, fetcher: hanging, clock, settings: { concurrency: 1 } })
      poller.start()
      await eventually(() => hanging.calls === 1, 'the first poll is in flight')
      for (const reference of ['in-flight', 'waiting']) {
        expect((await receiveWebhook(other.db, clock, reference, 'released')).outcome).toBe('applied')
      }
      await poller.stop()

      const orders = await database.db.selectFrom('orders').select(['externalReference', 'isTerminal', 'nextPollAt', 'pollLeaseToken']).orderBy('id').execute()
      expect(orders).toEqual(
        ['timed-out', 'in-flight', 'waiting'].map((externalReference) => ({ externalReference, isTerminal: true, nextPollAt: null, pollLeaseToken: null })),
      )
      await clock.advance(DAY_MS)
      expect(await dueOrderStats(other.db, clock)).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
    } finally {
      await other.close()
      await database.close()
    }
  })
})
