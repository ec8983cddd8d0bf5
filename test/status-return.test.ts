// An order back from a status the table does not know to a known one it had: a trade put on hold and taken off it
// goes funded, on_hold, funded on the platform. Before, the order stayed on_hold until the trade moved further (funded
// had been visited, so every later funded was stale), and a partner who waits for funded to ship waited for good. Now
// a poll's answer takes it back, and a webhook of that status, which cannot (it may be a replay), asks for that poll.
import { beforeEach, describe, expect, it } from 'vitest'
import { applyObservation } from '../src/orders/apply-observation.js'
import { orderHistory } from '../src/orders/order.repository.js'
import { FakeClock } from './helpers/fake-clock.js'
import { TEST_OBSERVATION_SETTINGS } from './helpers/orders.js'
import { countingFetcher, insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { testPoller } from './helpers/reconcile-poller.js'
import { useTestDatabase } from './helpers/test-database.js'

describe('an order back from an unknown status', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  const fromNow = (s: number) => new Date(clock.now() + s * 1000)

  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
    clock = new FakeClock()
  })

  const webhook = (status: string, id: string) =>
    applyObservation(
      database.db,
      {
        target: { externalReference: 'order-1' },
        tradeId: 'tr_order-1',
        externalReference: 'order-1',
        status,
        source: 'webhook',
        deliveryId: id,
        observedAt: new Date(clock.now()),
      },
      TEST_OBSERVATION_SETTINGS,
    )

  it('follows the platform funded, on_hold, funded: the webhook asks for a poll now, and the poll moves the order', async () => {
    await insertOrders(database.db, [{ externalReference: 'order-1', tradeStatus: 'funded', nextPollAt: fromNow(-1) }])
    const platform = { status: 'on_hold' }
    const fetcher = countingFetcher(() => platform.status)
    const poller = testPoller({ db: database.db, fetcher, clock })

    await poller.runOnce()
    expect(await orderByReference(database.db, 'order-1')).toMatchObject({ tradeStatus: 'on_hold', statusRank: 20 })
    const afterHold = await orderByReference(database.db, 'order-1')
    expect(new Date(afterHold.nextPollAt!).getTime()).toBeGreaterThan(clock.now() + 60_000)

    // the hold is lifted: the platform's webhook is stale (funded was visited), but the order is due for a poll now
    platform.status = 'funded'
    await clock.advance(1_000)
    expect((await webhook('funded', 'dlv-funded-again')).outcome).toBe('stale')
    const asked = await orderByReference(database.db, 'order-1')
    expect(asked.tradeStatus).toBe('on_hold')
    expect(new Date(asked.nextPollAt!).getTime()).toBe(clock.now())

    await poller.runOnce()
    expect(poller.reported.map((result) => result.result)).toEqual(['applied', 'applied'])
    const back = await orderByReference(database.db, 'order-1')
    expect(back).toMatchObject({ tradeStatus: 'funded', statusRank: 20, isTerminal: false })
    expect((await orderHistory(database.db, back.id)).map((change) => [change.fromStatus, change.toStatus, change.source])).toEqual([
      ['funded', 'on_hold', 'poll'],
      ['on_hold', 'funded', 'poll'],
    ])

    // the trade goes on as usual, and neither on_hold nor funded is entered again
    platform.status = 'on_hold'
    await clock.advance(86_400_000)
    await poller.runOnce()
    expect((await orderByReference(database.db, 'order-1')).tradeStatus).toBe('funded')
    expect((await webhook('delivered', 'dlv-delivered')).outcome).toBe('applied')
    expect((await orderByReference(database.db, 'order-1')).tradeStatus).toBe('delivered')
  })

  it('takes no webhook for the platform’s word: a replayed funded never moves an order on hold, and a status below the rank it kept asks for no poll', async () => {
    await insertOrders(database.db, [{ externalReference: 'order-1', tradeStatus: 'funded', nextPollAt: fromNow(-1) }])
    const poller = testPoller({ db: database.db, fetcher: countingFetcher(() => 'on_hold'), clock })
    await poller.runOnce()
    for (const id of ['replay-1', 'replay-2']) expect((await webhook('funded', id)).outcome).toBe('stale')
    expect((await orderByReference(database.db, 'order-1')).tradeStatus).toBe('on_hold')
    // a status below the rank the order kept asks for nothing
    const before = (await orderByReference(database.db, 'order-1')).nextPollAt
    await database.db.updateTable('orders').set({ nextPollAt: fromNow(3_600) }).execute()
    expect((await webhook('created', 'replay-created')).outcome).toBe('stale')
    expect(new Date((await orderByReference(database.db, 'order-1')).nextPollAt!).getTime()).toBe(fromNow(3_600).getTime())
    expect(before).not.toBeNull()
  })
})
