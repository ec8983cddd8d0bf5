import { afterAll, beforeAll, expect, it } from 'vitest'
import type { DatabaseHandle } from '../src/db/open-database.js'
import { FakeClock } from './helpers/fake-clock.js'
import { countingFetcher, dueOrders, insertOrders } from './helpers/reconcile-orders.js'
import { deferred, eventually, testPoller } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

describePostgres('three poller replicas over one database (Postgres)', () => {
  let database: TestDatabase
  let replicas: DatabaseHandle[]
  beforeAll(async () => {
    database = await createTestDatabase()
    replicas = [database.openAnother(), database.openAnother(), database.openAnother()]
  })
  afterAll(async () => {
    await Promise.all(replicas.map((replica) => replica.close()))
    await database.close()
  })

  it('polls each of 1,000 due orders exactly once between them, none twice', async () => {
    const clock = new FakeClock()
    await insertOrders(database.db, dueOrders(1_000, new Date(clock.now() - 3_600_000)))
    // one fake platform for all three replicas: it counts every GET of every trade
    const platform = countingFetcher(async () => {
      // a little real latency, so the replicas' cycles overlap
      await new Promise((resolve) => setTimeout(resolve, Math.random() * 2))
      return 'delivered'
    })
    const pollers = replicas.map((replica, i) =>
      testPoller({
        db: replica.db,
        fetcher: platform,
        clock,
        replica: `replica-${i + 1}`,
        settings: { batchSize: 25, concurrency: 8 },
      }),
    )
    for (const poller of pollers) poller.start()
    // each replica ends up asleep once its claim comes back short: nothing more is due
    await eventually(() => clock.pendingSleepers === 3, 'every replica found nothing more due', 60_000)
    await Promise.all(pollers.map((poller) => poller.stop()))

    expect(platform.calls).toHaveLength(1_000)
    expect(new Set(platform.calls).size).toBe(1_000)
    expect([...platform.counts.values()].every((count) => count === 1)).toBe(true)
    const shares = pollers.map((poller) => poller.reported.length)
    expect(shares.reduce((sum, share) => sum + share, 0)).toBe(1_000)
    // all three took part
    expect(shares.every((share) => share > 0)).toBe(true)

    const orders = await database.db.selectFrom('orders').select(['tradeStatus', 'pollLeaseToken']).execute()
    expect(orders.every((order) => order.tradeStatus === 'delivered' && order.pollLeaseToken === null)).toBe(
      true,
    )
    const history = await database.db
      .selectFrom('orderStatusHistory')
      .select((eb) => eb.fn.countAll<string>().as('rows'))
      .where('source', '=', 'poll')
      .executeTakeFirstOrThrow()
    expect(Number(history.rows)).toBe(1_000)
    const runs = await database.db
      .selectFrom('reconcileRuns')
      .select(['replica', (eb) => eb.fn.sum<string>('polled').as('polled')])
      .groupBy('replica')
      .orderBy('replica')
      .execute()
    expect(runs.map((run) => run.replica)).toEqual(['replica-1', 'replica-2', 'replica-3'])
    expect(runs.reduce((sum, run) => sum + Number(run.polled), 0)).toBe(1_000)
  })

  it('polls no order after its claim ran out: a replica held up past the lease leaves the rest to the one that claimed them', async () => {
    await database.db.deleteFrom('orders').execute()
    const clock = new FakeClock()
    const leaseS = 300
    await insertOrders(database.db, dueOrders(3, new Date(clock.now() - 60_000), 'slow'))
    // replica 1's platform holds its first GET until the test answers it; replica 2's answers at once
    const held = deferred<string>()
    const slow = countingFetcher((_tradeId, call) => (call === 1 && slow.calls.length === 1 ? held.promise : 'funded'))
    const quick = countingFetcher(() => 'delivered')
    const first = testPoller({ db: replicas[0]!.db, fetcher: slow, clock, replica: 'slow', settings: { concurrency: 1, batchSize: 3, leaseS } })
    const second = testPoller({ db: replicas[1]!.db, fetcher: quick, clock, replica: 'quick', settings: { concurrency: 1, batchSize: 3, leaseS } })

    const slowRun = first.runOnce()
    await eventually(() => slow.calls.length === 1, 'replica 1 is polling its first order')
    // replica 1 is held up past its lease: its three claims are due again, and replica 2 takes them all
    await clock.advance((leaseS + 1) * 1000)
    const quickRun = await second.runOnce()
    expect(quickRun).toMatchObject({ claimed: 3, polled: 3 })
    expect(quick.calls).toEqual(['tr_slow-0', 'tr_slow-1', 'tr_slow-2'])

    held.resolve('funded')
    const slowSummary = await slowRun
    // its answer for the first order is refused (the lease is replica 2's now), and it polls nothing more
    expect(slow.calls).toEqual(['tr_slow-0'])
    expect(slowSummary).toMatchObject({ claimed: 3, polled: 1, results: expect.objectContaining({ lease_lost: 1 }) })
    const orders = await database.db
      .selectFrom('orders')
      .select(['tradeStatus', 'pollLeaseToken', 'pollAttempts'])
      .where('externalReference', 'like', 'slow-%')
      .execute()
    expect(orders).toEqual(Array(3).fill({ tradeStatus: 'delivered', pollLeaseToken: null, pollAttempts: 0 }))
  })
})
