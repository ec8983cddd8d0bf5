import { CompiledQuery, sql } from 'kysely'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { claimDueOrders, claimDueOrdersQuery, countDueOrdersQuery, DUE_COUNT_CAP } from '../src/orders/poll-schedule.repository.js'
import {
  countDueOrders,
  flagForOperator,
  releaseClaims,
  requeueOrders,
  rescheduleAfterError,
} from '../src/orders/poll-schedule.repository.js'
import { dueOrders, insertManyDueOrders, insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { createTestDatabase, describePostgres, type TestDatabase, useTestDatabase } from './helpers/test-database.js'

const NOW = new Date('2026-03-01T12:00:00Z')
const seconds = (s: number) => new Date(NOW.getTime() + s * 1000)

describe('claiming due orders', () => {
  const database = useTestDatabase()
  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
  })

  it('claims only orders whose next poll time has passed, oldest first, up to the limit', async () => {
    await insertOrders(database.db, [
      { externalReference: 'later', nextPollAt: seconds(1) },
      { externalReference: 'oldest', nextPollAt: seconds(-300) },
      { externalReference: 'exactly-now', nextPollAt: NOW },
      { externalReference: 'older', nextPollAt: seconds(-60) },
    ])
    const claimed = await claimDueOrders(database.db, {
      now: NOW,
      limit: 2,
      leaseS: 120,
      leaseToken: 'lease-a',
    })
    expect(claimed.map((order) => order.externalReference)).toEqual(['oldest', 'older'])
    expect(claimed[0]).toMatchObject({ tradeId: 'tr_oldest', tradeStatus: 'funded', pollAttempts: 1 })
    expect(claimed[0]!.dueAt.toISOString()).toBe(seconds(-300).toISOString())

    const rest = await claimDueOrders(database.db, {
      now: NOW,
      limit: 10,
      leaseS: 120,
      leaseToken: 'lease-b',
    })
    expect(rest.map((order) => order.externalReference)).toEqual(['exactly-now'])
  })

  it('writes the lease and pushes next_poll_at out by it, counting the attempt', async () => {
    await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: seconds(-5), pollAttempts: 2 }])
    await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 120, leaseToken: 'lease-a' })
    const order = await orderByReference(database.db, 'a')
    expect(order.pollLeaseToken).toBe('lease-a')
    expect(new Date(order.pollLeaseExpiresAt!).toISOString()).toBe(seconds(120).toISOString())
    expect(new Date(order.nextPollAt!).toISOString()).toBe(seconds(120).toISOString())
    expect(order.pollAttempts).toBe(3)
  })

  it('never claims an order without a trade id, with a terminal status, or without a next poll time', async () => {
    await insertOrders(database.db, [
      { externalReference: 'no-trade', tradeId: null, tradeStatus: null, nextPollAt: null },
      { externalReference: 'released', tradeStatus: 'released', isTerminal: true, nextPollAt: null },
      { externalReference: 'flagged', nextPollAt: null },
      // the invariant broken on purpose: the claim still refuses them
      { externalReference: 'broken-no-trade', tradeId: null, tradeStatus: null, nextPollAt: seconds(-10) },
      {
        externalReference: 'broken-terminal',
        tradeStatus: 'released',
        isTerminal: true,
        nextPollAt: seconds(-10),
      },
      { externalReference: 'due', nextPollAt: seconds(-10) },
    ])
    const claimed = await claimDueOrders(database.db, {
      now: NOW,
      limit: 100,
      leaseS: 60,
      leaseToken: 'lease',
    })
    expect(claimed.map((order) => order.externalReference)).toEqual(['due'])
  })

  it('does not claim a claimed order again until its lease runs out, then hands it to the next claim', async () => {
    await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: seconds(-1) }])
    expect(
      await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 60, leaseToken: 'first' }),
    ).toHaveLength(1)
    expect(
      await claimDueOrders(database.db, { now: seconds(59), limit: 10, leaseS: 60, leaseToken: 'x' }),
    ).toEqual([])
    const again = await claimDueOrders(database.db, {
      now: seconds(60),
      limit: 10,
      leaseS: 60,
      leaseToken: 'second',
    })
    expect(again.map((order) => order.externalReference)).toEqual(['a'])
    expect(again[0]!.pollAttempts).toBe(2)
    expect((await orderByReference(database.db, 'a')).pollLeaseToken).toBe('second')
  })

  it('does not claim an order a webhook made due again while its lease runs, until the lease ends', async () => {
    await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: seconds(-1) }])
    expect(await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 60, leaseToken: 'first' })).toHaveLength(1)
    // an observation reschedules the order (STALE_AFTER_S shorter than the poll) while the lease runs
    await database.db.updateTable('orders').set({ nextPollAt: seconds(5) }).where('externalReference', '=', 'a').execute()
    expect(await claimDueOrders(database.db, { now: seconds(30), limit: 10, leaseS: 60, leaseToken: 'x' })).toEqual([])
    const after = await claimDueOrders(database.db, { now: seconds(60), limit: 10, leaseS: 60, leaseToken: 'second' })
    expect(after.map((order) => order.externalReference)).toEqual(['a'])
  })

  it('writes a backoff or a 404 flag only under the lease token that claimed the order', async () => {
    const [id] = await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: seconds(-1) }])
    await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 60, leaseToken: 'mine' })

    expect(
      await rescheduleAfterError(database.db, {
        orderId: id!,
        leaseToken: 'other',
        nextPollAt: seconds(999),
      }),
    ).toBe(false)
    expect(await flagForOperator(database.db, { orderId: id!, leaseToken: 'other', now: NOW, attention: 'trade_not_found' })).toBe(false)
    let order = await orderByReference(database.db, 'a')
    expect(order.attention).toBeNull()
    expect(order.pollLeaseToken).toBe('mine')

    expect(
      await rescheduleAfterError(database.db, { orderId: id!, leaseToken: 'mine', nextPollAt: seconds(999) }),
    ).toBe(true)
    order = await orderByReference(database.db, 'a')
    expect(new Date(order.nextPollAt!).toISOString()).toBe(seconds(999).toISOString())
    expect(order.pollLeaseToken).toBeNull()
    expect(order.pollLeaseExpiresAt).toBeNull()
  })

  it('flags a 404 for an operator, takes it off the schedule, and requeues it on request', async () => {
    const [id] = await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: seconds(-1) }])
    await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 60, leaseToken: 'mine' })
    expect(await flagForOperator(database.db, { orderId: id!, leaseToken: 'mine', now: NOW, attention: 'trade_not_found' })).toBe(true)
    let order = await orderByReference(database.db, 'a')
    expect(order).toMatchObject({ attention: 'trade_not_found', nextPollAt: null, pollLeaseToken: null })

    const requeued = await requeueOrders(database.db, { now: seconds(10) })
    expect(requeued).toEqual([
      { externalReference: 'a', outcome: 'requeued', previousAttention: 'trade_not_found', partnerEnv: null },
    ])
    order = await orderByReference(database.db, 'a')
    expect(order.attention).toBeNull()
    expect(order.pollAttempts).toBe(0)
    expect(new Date(order.nextPollAt!).toISOString()).toBe(seconds(10).toISOString())
  })

  it('requeues every flagged order when no reference is given, whatever its flag', async () => {
    await insertOrders(database.db, [
      { externalReference: 'gone', nextPollAt: null },
      { externalReference: 'crossed', nextPollAt: null },
      { externalReference: 'fine', nextPollAt: seconds(600) },
    ])
    await database.db.updateTable('orders').set({ attention: 'trade_not_found' }).where('externalReference', '=', 'gone').execute()
    await database.db.updateTable('orders').set({ attention: 'trade_mismatch' }).where('externalReference', '=', 'crossed').execute()

    const requeued = await requeueOrders(database.db, { now: NOW })
    expect(requeued).toEqual([
      { externalReference: 'gone', outcome: 'requeued', previousAttention: 'trade_not_found', partnerEnv: null },
      { externalReference: 'crossed', outcome: 'requeued', previousAttention: 'trade_mismatch', partnerEnv: null },
    ])
    for (const reference of ['gone', 'crossed']) {
      const order = await orderByReference(database.db, reference)
      expect(order.attention, reference).toBeNull()
      expect(new Date(order.nextPollAt!).toISOString(), reference).toBe(NOW.toISOString())
    }
    // an order no one flagged keeps its schedule
    expect(new Date((await orderByReference(database.db, 'fine')).nextPollAt!).toISOString()).toBe(seconds(600).toISOString())
  })

  it('requeues by reference but leaves a terminal order off the schedule', async () => {
    await insertOrders(database.db, [
      { externalReference: 'done', tradeStatus: 'released', isTerminal: true, nextPollAt: null },
    ])
    await database.db.updateTable('orders').set({ attention: 'trade_not_found' }).execute()
    const requeued = await requeueOrders(database.db, {
      externalReferences: ['done', 'unknown-ref'],
      now: NOW,
    })
    expect(requeued).toEqual([
      { externalReference: 'done', outcome: 'not_pollable', previousAttention: 'trade_not_found', partnerEnv: null },
    ])
    const order = await orderByReference(database.db, 'done')
    expect(order.attention).toBeNull()
    expect(order.nextPollAt).toBeNull()
  })

  it('gives unpolled claims back as they were: due at their old time, attempt not counted', async () => {
    await insertOrders(database.db, [
      { externalReference: 'a', nextPollAt: seconds(-30), pollAttempts: 1 },
      { externalReference: 'b', nextPollAt: seconds(-20) },
      { externalReference: 'c', nextPollAt: seconds(-10) },
    ])
    const claimed = await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 60, leaseToken: 'mine' })
    // b was taken over by another replica meanwhile: not ours to release
    await database.db
      .updateTable('orders')
      .set({ pollLeaseToken: 'theirs' })
      .where('externalReference', '=', 'b')
      .execute()
    expect(await releaseClaims(database.db, 'mine', claimed)).toBe(2)

    const a = await orderByReference(database.db, 'a')
    expect(new Date(a.nextPollAt!).toISOString()).toBe(seconds(-30).toISOString())
    expect(a).toMatchObject({ pollAttempts: 1, pollLeaseToken: null, pollLeaseExpiresAt: null })
    expect((await orderByReference(database.db, 'b')).pollLeaseToken).toBe('theirs')
    expect(new Date((await orderByReference(database.db, 'c')).nextPollAt!).toISOString()).toBe(
      seconds(-10).toISOString(),
    )
  })

  it('counts due orders from when they came due, whether a claim holds them or they back off, leaving out unscheduled ones', async () => {
    expect(await countDueOrders(database.db, NOW)).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
    await insertOrders(database.db, [
      { externalReference: 'a', nextPollAt: seconds(-90) },
      { externalReference: 'b', nextPollAt: seconds(-30) },
      { externalReference: 'c', nextPollAt: seconds(30) },
      { externalReference: 'd', nextPollAt: null },
    ])
    expect(await countDueOrders(database.db, NOW)).toEqual({ ordersDue: 2, oldestDueAgeS: 90 })
    // a cycle holds both: they were counted as due no more (0 and 0) while their lease moved next_poll_at out
    const claimed = await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 60, leaseToken: 'mine' })
    expect(claimed.map((order) => order.externalReference)).toEqual(['a', 'b'])
    expect(await countDueOrders(database.db, NOW)).toEqual({ ordersDue: 2, oldestDueAgeS: 90 })
    // a's poll fails and backs off 2 minutes, b is given back untried: both still due from when they came due
    expect(await rescheduleAfterError(database.db, { orderId: claimed[0]!.orderId, leaseToken: 'mine', nextPollAt: seconds(120) })).toBe(true)
    expect(await releaseClaims(database.db, 'mine', claimed.slice(1))).toBe(1)
    expect(await countDueOrders(database.db, NOW)).toEqual({ ordersDue: 2, oldestDueAgeS: 90 })
    // past the backoff a is claimed again, and counts from its first due time still; c came due meanwhile
    const later = seconds(200)
    const again = await claimDueOrders(database.db, { now: later, limit: 10, leaseS: 60, leaseToken: 'again' })
    expect(again.map((order) => order.externalReference).sort()).toEqual(['a', 'b', 'c'])
    expect(await countDueOrders(database.db, later)).toEqual({ ordersDue: 3, oldestDueAgeS: 290 })
    // answered with a 404, a is flagged for an operator: off the schedule, counted by orders_needing_attention instead
    expect(await flagForOperator(database.db, { orderId: again.find((order) => order.externalReference === 'a')!.orderId, leaseToken: 'again', now: later, attention: 'trade_not_found' })).toBe(true)
    expect(await countDueOrders(database.db, later)).toEqual({ ordersDue: 2, oldestDueAgeS: 230 })
  })

  it('counts an order backing off from the time a webhook, an API call or an operator gave it since', async () => {
    await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: seconds(-90) }])
    const [claimed] = await claimDueOrders(database.db, { now: NOW, limit: 10, leaseS: 60, leaseToken: 'mine' })
    await rescheduleAfterError(database.db, { orderId: claimed!.orderId, leaseToken: 'mine', nextPollAt: seconds(60) })
    expect(await countDueOrders(database.db, NOW)).toEqual({ ordersDue: 1, oldestDueAgeS: 90 })
    // a webhook moved the order and put its next poll STALE_AFTER_S on: it is not due, nor late, until then
    await database.db.updateTable('orders').set({ nextPollAt: seconds(600) }).where('id', '=', claimed!.orderId).execute()
    expect(await countDueOrders(database.db, NOW)).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
    expect(await countDueOrders(database.db, seconds(610))).toEqual({ ordersDue: 1, oldestDueAgeS: 10 })
    // claimed at that time, it counts from that time, not from the poll that failed before the webhook
    await claimDueOrders(database.db, { now: seconds(610), limit: 10, leaseS: 60, leaseToken: 'later' })
    expect(await countDueOrders(database.db, seconds(620))).toEqual({ ordersDue: 1, oldestDueAgeS: 20 })
    // an operator's requeue makes it due now, from now
    await requeueOrders(database.db, { externalReferences: ['a'], now: seconds(620) })
    expect(await countDueOrders(database.db, seconds(620))).toEqual({ ordersDue: 1, oldestDueAgeS: 0 })
  })

  it('claims a large due backlog in batches without losing or repeating an order', async () => {
    await insertOrders(database.db, dueOrders(1_000, seconds(-3_600)))
    const seen = new Set<string>()
    for (let round = 0; round < 11; round++) {
      const claimed = await claimDueOrders(database.db, {
        now: NOW,
        limit: 100,
        leaseS: 60,
        leaseToken: `r${round}`,
      })
      for (const order of claimed) {
        expect(seen.has(order.externalReference)).toBe(false)
        seen.add(order.externalReference)
      }
      expect(claimed).toHaveLength(round < 10 ? 100 : 0)
    }
    expect(seen.size).toBe(1_000)
  })
})

describePostgres('the claim at scale (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
    await insertManyDueOrders(database.db, 200_000, seconds(-86_400))
  })
  afterAll(async () => {
    await database.close()
  })

  it('walks orders_due_idx in order and stops after the batch, even when every order is due', async () => {
    const query = claimDueOrdersQuery(database.db, {
      now: NOW,
      limit: 100,
      leaseS: 60,
      leaseToken: 'plan',
    }).compile()
    // EXPLAIN without ANALYZE: the plan of the real statement, nothing is claimed
    const explained = await database.db.executeQuery<{ 'QUERY PLAN': string }>(
      CompiledQuery.raw(`explain ${query.sql}`, [...query.parameters]),
    )
    const plan = explained.rows.map((row) => row['QUERY PLAN']).join('\n')
    expect(plan).toMatch(/Index Scan using orders_due_idx on orders/)
    expect(plan).not.toMatch(/Seq Scan on orders/)
    expect(plan).not.toMatch(/Sort/)
  })

  it('claims 100 of 200,000 due orders, oldest first', async () => {
    const claimed = await claimDueOrders(database.db, {
      now: NOW,
      limit: 100,
      leaseS: 60,
      leaseToken: 'scale',
    })
    expect(claimed).toHaveLength(100)
    expect(claimed[0]!.externalReference).toBe('bulk-1')
    expect(claimed[99]!.externalReference).toBe('bulk-100')
  })
})

describePostgres('the due count at scale (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
    // 200,000 orders due in an hour; 100 due now, and 200 backing off after failed polls since 10 minutes ago
    await insertManyDueOrders(database.db, 200_000, seconds(3_600))
    await sql`update orders set next_poll_at = ${seconds(-60)} where id % 2000 = 1`.execute(database.db)
    await sql`update orders set poll_due_since = ${seconds(-600)}, poll_retry_at = next_poll_at, poll_attempts = 2
      where id % 1000 = 2`.execute(database.db)
    await sql`analyze orders`.execute(database.db)
  })
  afterAll(async () => {
    await database.close()
  })

  it('reads the two partial indexes at each scrape, never the table', async () => {
    const query = countDueOrdersQuery(database.db, NOW).compile()
    const explained = await database.db.executeQuery<{ 'QUERY PLAN': string }>(
      CompiledQuery.raw(`explain ${query.sql}`, [...query.parameters]),
    )
    const plan = explained.rows.map((row) => row['QUERY PLAN']).join('\n')
    expect(plan).toMatch(/Bitmap Index Scan on orders_due_idx/)
    expect(plan).toMatch(/Bitmap Index Scan on orders_poll_due_since_idx/)
    expect(plan).not.toMatch(/Seq Scan on orders/)
    expect(await countDueOrders(database.db, NOW)).toEqual({ ordersDue: 300, oldestDueAgeS: 600 })
  })
})

// Through an outage of the platform every open order comes to be held by a cycle or backing off after failed polls: a
// count of them all read every one at each scrape (360 ms at 1,000,000 orders, found by an outside review), toward the
// scrape's 2-s read limit. The count stops at DUE_COUNT_CAP, and the oldest is each index's first entry.
describePostgres('the due count through a platform outage (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
    // 150,000 orders, every one backing off until an hour from now, the first due since 2 hours ago
    await insertManyDueOrders(database.db, 150_000, seconds(3_600))
    await sql`update orders set poll_due_since = ${seconds(-7_200)}::timestamptz + id * interval '1 millisecond',
      poll_retry_at = next_poll_at, poll_attempts = 3`.execute(database.db)
    await sql`analyze orders`.execute(database.db)
  })
  afterAll(async () => {
    await database.close()
  })

  it(`counts up to ${DUE_COUNT_CAP.toLocaleString('en')} and reads the oldest from the first entry of the held orders' index`, async () => {
    const query = countDueOrdersQuery(database.db, NOW).compile()
    const explained = await database.db.executeQuery<{ 'QUERY PLAN': string }>(
      CompiledQuery.raw(`explain ${query.sql}`, [...query.parameters]),
    )
    const plan = explained.rows.map((row) => row['QUERY PLAN']).join('\n')
    expect(plan).toMatch(/Index Scan using orders_poll_due_since_idx/)
    const { ordersDue, oldestDueAgeS } = await countDueOrders(database.db, NOW)
    expect(ordersDue).toBe(DUE_COUNT_CAP)
    const firstId = Number((await sql<{ id: string }>`select min(id) as id from orders`.execute(database.db)).rows[0]!.id)
    expect(oldestDueAgeS).toBeCloseTo(7_200 - firstId / 1000, 3)
  })
})
