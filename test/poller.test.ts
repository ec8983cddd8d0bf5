import { sql } from 'kysely'
import { beforeEach, describe, expect, it } from 'vitest'
import { PartnerNetworkError } from '../src/partner-api/partner-api-error.js'
import type { TradeRecord } from '../src/partner-api/types.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { claimDueOrders } from '../src/orders/poll-schedule.repository.js'
import { observationSettings } from '../src/orders/observations.js'
import { createClockGuard } from '../src/db/clock-guard.js'
import { longestPollMs } from '../src/reconcile/poll-lease.js'
import { ClockOffError, dueOrderStats, PLATFORM_FAILING_CAP_S, pollerSettings } from '../src/reconcile/poller.js'
import { CLOCK_STEPPED_MESSAGE, PLATFORM_FAILING_MESSAGE, THROTTLED_MESSAGE, UNAUTHORIZED_MESSAGE } from '../src/reconcile/reconcile-cycle.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { countingFetcher, insertOrders, orderByReference, platformError } from './helpers/reconcile-orders.js'
import { deferred, eventually, testPoller } from './helpers/reconcile-poller.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'

const STALE_AFTER_S = 21_600

describe('the poller', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  const now = () => new Date(clock.now())
  const fromNow = (s: number) => new Date(clock.now() + s * 1000)

  beforeEach(async () => {
    clock = new FakeClock()
    await database.db.deleteFrom('orders').execute()
    await database.db.deleteFrom('reconcileRuns').execute()
  })

  async function historyOf(externalReference: string) {
    const order = await orderByReference(database.db, externalReference)
    return database.db
      .selectFrom('orderStatusHistory')
      .select(['fromStatus', 'toStatus', 'source'])
      .where('orderId', '=', order.id)
      .orderBy('id')
      .execute()
  }

  describe('a cycle', () => {
    it('polls every due order once and applies what the platform answers as an observation by poll', async () => {
      await insertOrders(database.db, [
        { externalReference: 'a', nextPollAt: fromNow(-60) },
        { externalReference: 'b', nextPollAt: fromNow(-30) },
        { externalReference: 'not-yet', nextPollAt: fromNow(60) },
      ])
      const fetcher = countingFetcher(() => 'delivered')
      const poller = testPoller({ db: database.db, fetcher, clock })

      const summary = await poller.runOnce()

      expect(fetcher.calls.sort()).toEqual(['tr_a', 'tr_b'])
      expect(summary).toMatchObject({
        claimed: 2,
        polled: 2,
        changed: 2,
        errors: 0,
        released: 0,
        stoppedReason: null,
      })
      expect(summary.results.applied).toBe(2)
      const a = await orderByReference(database.db, 'a')
      expect(a).toMatchObject({ tradeStatus: 'delivered', pollLeaseToken: null, pollAttempts: 0 })
      expect(new Date(a.nextPollAt!).toISOString()).toBe(fromNow(STALE_AFTER_S).toISOString())
      expect(new Date(a.lastPolledAt!).toISOString()).toBe(now().toISOString())
      expect(await historyOf('a')).toEqual([{ fromStatus: 'funded', toStatus: 'delivered', source: 'poll' }])
      expect((await orderByReference(database.db, 'not-yet')).tradeStatus).toBe('funded')
      expect(poller.reported.map((result) => result.result)).toEqual(['applied', 'applied'])
    })

    it('records the run with its counts', async () => {
      await insertOrders(database.db, [
        { externalReference: 'moved', nextPollAt: fromNow(-1) },
        { externalReference: 'same', nextPollAt: fromNow(-1) },
        { externalReference: 'failing', nextPollAt: fromNow(-1) },
      ])
      const fetcher = countingFetcher((tradeId) =>
        tradeId === 'tr_moved'
          ? 'delivered'
          : tradeId === 'tr_same'
            ? 'funded'
            : new PartnerNetworkError('reset'),
      )
      const summary = await testPoller({ db: database.db, fetcher, clock, replica: 'replica-runs' }).runOnce()

      const runs = await database.db.selectFrom('reconcileRuns').selectAll().execute()
      expect(runs).toHaveLength(1)
      expect(runs[0]).toMatchObject({
        id: summary.runId,
        replica: 'replica-runs',
        polled: 3,
        changed: 1,
        errors: 1,
        stoppedReason: null,
      })
      expect(new Date(runs[0]!.startedAt).toISOString()).toBe(now().toISOString())
      expect(runs[0]!.finishedAt).not.toBeNull()
      expect(summary.results).toMatchObject({ applied: 1, unchanged: 1, error: 1 })
    })

    it('reschedules an order the platform confirmed unchanged STALE_AFTER_S later, with no history', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1), pollAttempts: 3 }])
      await testPoller({ db: database.db, fetcher: countingFetcher(() => 'funded'), clock }).runOnce()
      const a = await orderByReference(database.db, 'a')
      expect(new Date(a.nextPollAt!).toISOString()).toBe(fromNow(STALE_AFTER_S).toISOString())
      expect(a.pollAttempts).toBe(0)
      expect(await historyOf('a')).toEqual([])
    })

    it('takes an order that reached a terminal status off the schedule for good', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      const fetcher = countingFetcher(() => 'released')
      const poller = testPoller({ db: database.db, fetcher, clock })
      await poller.runOnce()
      const a = await orderByReference(database.db, 'a')
      expect(a).toMatchObject({ tradeStatus: 'released', isTerminal: true, nextPollAt: null })

      await clock.advance(365 * 86_400_000)
      const later = await poller.runOnce()
      expect(later.claimed).toBe(0)
      expect(fetcher.calls).toEqual(['tr_a'])
    })

    it('never polls an order without a trade id', async () => {
      await insertOrders(database.db, [
        { externalReference: 'no-trade', tradeId: null, tradeStatus: null, nextPollAt: null },
      ])
      const fetcher = countingFetcher()
      const summary = await testPoller({ db: database.db, fetcher, clock }).runOnce()
      expect(summary.claimed).toBe(0)
      expect(fetcher.calls).toEqual([])
    })

    it('keeps a status the platform answers below the one the order has, and reports it stale', async () => {
      await insertOrders(database.db, [
        { externalReference: 'a', tradeStatus: 'delivered', statusRank: 30, nextPollAt: fromNow(-1) },
      ])
      const poller = testPoller({ db: database.db, fetcher: countingFetcher(() => 'funded'), clock })
      const summary = await poller.runOnce()
      expect(summary.results.stale).toBe(1)
      expect((await orderByReference(database.db, 'a')).tradeStatus).toBe('delivered')
    })

    it('flags an order whose polled record is another order’s or another trade’s, stops polling it, and warns once', async () => {
      await insertOrders(database.db, [
        { externalReference: 'mine', nextPollAt: fromNow(-1) },
        { externalReference: 'mine-too', nextPollAt: fromNow(-1) },
      ])
      const fetcher = countingFetcher((tradeId) =>
        tradeId === 'tr_mine'
          ? tradeRecord({ trade_id: tradeId, reference: 'REF-x', status: 'released', external_reference: 'someone-else' })
          : tradeRecord({ trade_id: 'tr_other', reference: 'REF-x', status: 'released', external_reference: 'mine-too' }),
      )
      const poller = testPoller({ db: database.db, fetcher, clock })
      const summary = await poller.runOnce()

      expect(summary.results).toMatchObject({ applied: 0, error: 0, trade_mismatch: 2 })
      expect(summary.errors).toBe(2)
      for (const reference of ['mine', 'mine-too']) {
        const order = await orderByReference(database.db, reference)
        expect(order, reference).toMatchObject({
          tradeStatus: 'funded',
          tradeId: `tr_${reference}`,
          isTerminal: false,
          attention: 'trade_mismatch',
          nextPollAt: null,
          pollLeaseToken: null,
          pollLeaseExpiresAt: null,
        })
        expect(await historyOf(reference)).toEqual([])
      }
      const warnings = () =>
        logEntries().filter((entry) => String(entry.msg).includes('another order') && String(entry.externalReference).startsWith('mine'))
      expect(warnings().map((entry) => entry.answeredExternalReference).sort()).toEqual(['mine-too', 'someone-else'])

      // polled no more: a week of cycles asks the platform nothing and writes no other warning
      for (let day = 0; day < 7; day++) {
        await clock.advance(STALE_AFTER_S * 1000 + 1)
        expect((await poller.runOnce()).claimed).toBe(0)
      }
      expect(fetcher.calls.sort()).toEqual(['tr_mine', 'tr_mine-too'])
      expect(warnings()).toHaveLength(2)
    })

    it('polls no more than POLL_CONCURRENCY trades at once', async () => {
      await insertOrders(
        database.db,
        Array.from({ length: 12 }, (_, i) => ({ externalReference: `o${i}`, nextPollAt: fromNow(-1) })),
      )
      let inFlight = 0
      let highest = 0
      const fetcher = countingFetcher(async () => {
        inFlight++
        highest = Math.max(highest, inFlight)
        await new Promise((resolve) => setTimeout(resolve, 2))
        inFlight--
        return 'funded'
      })
      await testPoller({ db: database.db, fetcher, clock, settings: { concurrency: 3 } }).runOnce()
      expect(fetcher.calls).toHaveLength(12)
      expect(highest).toBe(3)
    })

    it('claims no more than POLL_BATCH_SIZE orders per cycle, oldest first', async () => {
      await insertOrders(
        database.db,
        Array.from({ length: 5 }, (_, i) => ({ externalReference: `o${i}`, nextPollAt: fromNow(-100 + i) })),
      )
      const fetcher = countingFetcher()
      const summary = await testPoller({
        db: database.db,
        fetcher,
        clock,
        settings: { batchSize: 2 },
      }).runOnce()
      expect(summary.claimed).toBe(2)
      expect(fetcher.calls.sort()).toEqual(['tr_o0', 'tr_o1'])
    })
  })

  describe('errors', () => {
    it('counts an answer the database failed to write as write_failed, not as the platform\'s error, and names the database', async () => {
      await insertOrders(database.db, [
        { externalReference: 'unwritable', nextPollAt: fromNow(-2) },
        { externalReference: 'unreachable', nextPollAt: fromNow(-1) },
      ])
      // the database refuses the write-back of one order's answer: a trigger that fails its update
      await sql`create function refuse_unwritable() returns trigger language plpgsql as $$
        begin raise exception 'refused for the test'; end $$`.execute(database.db)
      await sql`create trigger refuse_unwritable before update on orders for each row
        when (new.external_reference = 'unwritable' and new.trade_status <> old.trade_status) execute function refuse_unwritable()`.execute(database.db)
      try {
        const fetcher = countingFetcher((tradeId) => (tradeId === 'tr_unwritable' ? 'delivered' : new PartnerNetworkError('reset')))
        const poller = testPoller({ db: database.db, fetcher, clock, settings: { concurrency: 1 } })
        const summary = await poller.runOnce()
        expect(fetcher.calls).toEqual(['tr_unwritable', 'tr_unreachable'])
        expect(poller.reported.map((result) => [result.externalReference, result.result])).toEqual([
          ['unwritable', 'write_failed'],
          ['unreachable', 'error'],
        ])
        expect(summary).toMatchObject({ polled: 2, changed: 0, errors: 2 })
        expect(summary.results).toMatchObject({ write_failed: 1, error: 1 })
        expect(summary.firstFailure).toMatchObject({ externalReference: 'unwritable' })
        expect(summary.firstFailure!.reason).not.toMatch(/^the platform|could not reach the platform/)
        expect((await orderByReference(database.db, 'unwritable')).tradeStatus).toBe('funded')
      } finally {
        await sql`drop trigger refuse_unwritable on orders`.execute(database.db)
        await sql`drop function refuse_unwritable()`.execute(database.db)
      }
    })

    it('backs off exponentially with jitter on consecutive errors, up to the cap, and resets on an answer', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      let failing = true
      const fetcher = countingFetcher(() =>
        failing ? new PartnerNetworkError('connection reset') : 'delivered',
      )
      // random 0.5: each delay is 3/4 of min(cap, 30 s * 2^(attempt-1))
      const poller = testPoller({ db: database.db, fetcher, clock, random: () => 0.5 })
      const delaysS: number[] = []
      for (let attempt = 1; attempt <= 10; attempt++) {
        const summary = await poller.runOnce()
        expect(summary.results.error).toBe(1)
        const order = await orderByReference(database.db, 'a')
        expect(order.pollAttempts).toBe(attempt)
        expect(order.pollLeaseToken).toBeNull()
        const delayMs = new Date(order.nextPollAt!).getTime() - clock.now()
        delaysS.push(delayMs / 1000)
        // not due a moment before its time, due at it
        await clock.advance(delayMs - 1)
        expect((await poller.runOnce()).claimed).toBe(0)
        await clock.advance(1)
      }
      expect(delaysS).toEqual([22.5, 45, 90, 180, 360, 720, 1440, 2700, 2700, 2700])

      failing = false
      await poller.runOnce()
      const order = await orderByReference(database.db, 'a')
      expect(order).toMatchObject({ tradeStatus: 'delivered', pollAttempts: 0 })
      expect(new Date(order.nextPollAt!).toISOString()).toBe(fromNow(STALE_AFTER_S).toISOString())
    })

    it('spreads orders that failed together over the jitter range', async () => {
      await insertOrders(
        database.db,
        Array.from({ length: 4 }, (_, i) => ({ externalReference: `o${i}`, nextPollAt: fromNow(-1) })),
      )
      const randoms = [0, 0.25, 0.5, 0.999]
      const poller = testPoller({
        db: database.db,
        fetcher: countingFetcher(() => platformError(503)),
        clock,
        settings: { concurrency: 1 },
        random: () => randoms.shift()!,
      })
      await poller.runOnce()
      const orders = await database.db
        .selectFrom('orders')
        .select('nextPollAt')
        .orderBy('nextPollAt')
        .execute()
      const delays = orders.map((order) => (new Date(order.nextPollAt!).getTime() - clock.now()) / 1000)
      // attempt 1: between half and all of the 30 s base
      expect(delays).toEqual([15, 18.75, 22.5, 29.985])
    })

    it('flags an order whose trade the platform does not know (404) and stops polling it', async () => {
      await insertOrders(database.db, [{ externalReference: 'gone', nextPollAt: fromNow(-1) }])
      const fetcher = countingFetcher(() => platformError(404, 'not_found'))
      const poller = testPoller({ db: database.db, fetcher, clock })
      const summary = await poller.runOnce()
      expect(summary.results.not_found).toBe(1)
      expect(summary.errors).toBe(1)
      const order = await orderByReference(database.db, 'gone')
      expect(order).toMatchObject({ attention: 'trade_not_found', nextPollAt: null, pollLeaseToken: null })

      await clock.advance(30 * 86_400_000)
      expect((await poller.runOnce()).claimed).toBe(0)
      expect(fetcher.calls).toEqual(['tr_gone'])
    })

    // found from outside: a webhook for a flagged order put it back on the schedule, flag and all, and it was polled
    // every STALE_AFTER_S while PartnerEscrowOrdersFlagged kept firing
    it('keeps a flagged order off the schedule when a webhook moves it, until an operator requeues it', async () => {
      await insertOrders(database.db, [{ externalReference: 'flagged', nextPollAt: fromNow(-1) }])
      const fetcher = countingFetcher(() => platformError(404, 'not_found'))
      const poller = testPoller({ db: database.db, fetcher, clock })
      await poller.runOnce()
      const flagged = await orderByReference(database.db, 'flagged')
      const result = await applyObservation(
        database.db,
        { target: { externalReference: 'flagged' }, tradeId: 'tr_flagged', status: 'delivered', source: 'webhook', observedAt: now() },
        { staleAfterS: STALE_AFTER_S, handlersFor: () => [] },
      )
      expect(result.outcome).toBe('applied')
      expect(await orderByReference(database.db, 'flagged')).toMatchObject({
        tradeStatus: 'delivered',
        attention: 'trade_not_found',
        nextPollAt: null,
        version: flagged.version + 1,
      })
      await clock.advance(STALE_AFTER_S * 1000 + 1)
      expect((await poller.runOnce()).claimed).toBe(0)
      expect(fetcher.calls).toEqual(['tr_flagged'])
    })

    it('stops the cycle at the first 401, gives every other claim back untouched, and logs one error', async () => {
      const dueTimes = [fromNow(-50), fromNow(-40), fromNow(-30), fromNow(-20), fromNow(-10)]
      await insertOrders(
        database.db,
        dueTimes.map((nextPollAt, i) => ({
          externalReference: `o${i}`,
          nextPollAt,
          pollAttempts: i === 4 ? 2 : 0,
        })),
      )
      const fetcher = countingFetcher(() => platformError(401, 'invalid_signature'))
      const replica = 'replica-401'
      const poller = testPoller({ db: database.db, fetcher, clock, replica, settings: { concurrency: 1 } })

      const summary = await poller.runOnce()

      expect(fetcher.calls).toHaveLength(1)
      expect(summary).toMatchObject({ claimed: 5, polled: 1, released: 5, stoppedReason: 'unauthorized' })
      expect(summary.results.unauthorized).toBe(1)
      const orders = await database.db.selectFrom('orders').selectAll().orderBy('id').execute()
      expect(orders.map((order) => new Date(order.nextPollAt!).toISOString())).toEqual(
        dueTimes.map((time) => time.toISOString()),
      )
      expect(orders.map((order) => order.pollAttempts)).toEqual([0, 0, 0, 0, 2])
      expect(orders.every((order) => order.pollLeaseToken === null && order.attention === null)).toBe(true)

      const run = await database.db.selectFrom('reconcileRuns').selectAll().executeTakeFirstOrThrow()
      expect(run).toMatchObject({ stoppedReason: 'unauthorized', polled: 1, errors: 1 })
      const errors = logEntries().filter((entry) => entry.replica === replica && Number(entry.level) >= 50)
      expect(errors).toHaveLength(1)
      expect(errors[0]!.msg).toBe(UNAUTHORIZED_MESSAGE)
    })

    it('stops the cycle at a 429, and neither the order nor the claims given back are due before its Retry-After', async () => {
      const dueTimes = [fromNow(-50), fromNow(-40), fromNow(-30)]
      await insertOrders(
        database.db,
        dueTimes.map((nextPollAt, i) => ({ externalReference: `o${i}`, nextPollAt })),
      )
      // what the client throws once a Retry-After is longer than it waits inside a call: 600 s here
      const fetcher = countingFetcher(() => Object.assign(platformError(429, 'rate_limited'), { retryAfterMs: 600_000 }))
      const poller = testPoller({ db: database.db, fetcher, clock, replica: 'replica-429', settings: { concurrency: 1 } })

      const summary = await poller.runOnce()

      expect(fetcher.calls).toEqual(['tr_o0'])
      expect(summary).toMatchObject({ claimed: 3, polled: 1, released: 2, stoppedReason: 'throttled', throttledUntil: fromNow(600) })
      // counted as the platform's asking to slow down, not as a failure of its own
      expect(summary.results).toMatchObject({ throttled: 1, error: 0 })
      const orders = await database.db.selectFrom('orders').selectAll().orderBy('id').execute()
      // the order polled backs off as after any error (30 s at most here), but no sooner than the 600 s
      expect(new Date(orders[0]!.nextPollAt!).getTime()).toBe(fromNow(600).getTime())
      expect(orders[0]!.pollAttempts).toBe(1)
      // the two not polled: given back, attempt not counted, due at the end of the wait
      expect(orders.slice(1).map((order) => [new Date(order.nextPollAt!).toISOString(), order.pollAttempts, order.pollLeaseToken])).toEqual([
        [fromNow(600).toISOString(), 0, null],
        [fromNow(600).toISOString(), 0, null],
      ])
      const run = await database.db.selectFrom('reconcileRuns').selectAll().executeTakeFirstOrThrow()
      expect(run).toMatchObject({ stoppedReason: 'throttled', polled: 1, errors: 1 })
      const warnings = logEntries().filter((entry) => entry.replica === 'replica-429' && entry.msg === THROTTLED_MESSAGE)
      expect(warnings).toHaveLength(1)
    })

    // found from outside: 3,000 orders due and the platform answering 503 drew about 29 requests a second at
    // POLL_CONCURRENCY=8 (105 at 32), each order its four attempts, batch after batch, for as long as the outage lasted
    it('stops the cycle once polls in a row fail at the platform, and gives the rest back untried', async () => {
      const dueAt = fromNow(-60)
      await insertOrders(database.db, Array.from({ length: 12 }, (_, i) => ({ externalReference: `down-${i}`, nextPollAt: dueAt })))
      const fetcher = countingFetcher(() => platformError(503, 'unavailable'))
      const poller = testPoller({ db: database.db, fetcher, clock, replica: 'replica-down', settings: { concurrency: 1 } })

      const summary = await poller.runOnce()

      // five in a row at least, or as many as run at once
      expect(fetcher.calls).toHaveLength(5)
      expect(summary).toMatchObject({ claimed: 12, polled: 5, released: 7, stoppedReason: 'platform_failing' })
      expect(summary.results).toMatchObject({ error: 5 })
      const orders = await database.db.selectFrom('orders').selectAll().orderBy('id').execute()
      // the five polled back off as after any error; the seven given back are due as before, attempt not counted
      expect(orders.slice(0, 5).every((order) => order.pollAttempts === 1 && new Date(order.nextPollAt!) > now())).toBe(true)
      expect(orders.slice(5).map((order) => [new Date(order.nextPollAt!).toISOString(), order.pollAttempts, order.pollLeaseToken])).toEqual(
        Array(7).fill([dueAt.toISOString(), 0, null]),
      )
      const run = await database.db.selectFrom('reconcileRuns').selectAll().executeTakeFirstOrThrow()
      expect(run).toMatchObject({ stoppedReason: 'platform_failing', polled: 5, errors: 5 })
      expect(logEntries().filter((entry) => entry.replica === 'replica-down' && entry.msg === PLATFORM_FAILING_MESSAGE)).toHaveLength(1)
    })

    it('goes on through failures that answers come between: one trade the platform fails on is not an outage', async () => {
      await insertOrders(database.db, Array.from({ length: 12 }, (_, i) => ({ externalReference: `some-${i}`, nextPollAt: fromNow(-60 + i) })))
      // four failures, then an answer, in turn
      let polls = 0
      const fetcher = countingFetcher(() => (++polls % 5 === 0 ? 'delivered' : platformError(503)))
      const summary = await testPoller({ db: database.db, fetcher, clock, settings: { concurrency: 1 } }).runOnce()
      expect(fetcher.calls).toHaveLength(12)
      expect(summary).toMatchObject({ claimed: 12, polled: 12, released: 0, stoppedReason: null })
      expect(summary.results).toMatchObject({ error: 10, applied: 2 })
    })

    // found from outside: a replica stopped (SIGSTOP) past its lease was told the platform answers slowly
    it.each([
      ['a platform that slow', 25, 20_000, 'the platform answers slowly: a smaller POLL_BATCH_SIZE or a larger POLL_CONCURRENCY keeps a cycle inside the lease'],
      ['a pause of the process', 70, 10_000, 'one poll took 70 s, half the lease or more: this process was likely paused (a stopped process, a paused VM) or its clock jumped; if the platform is that slow, lower PARTNER_API_TIMEOUT_MS'],
      // found from outside: with PARTNER_API_TIMEOUT_MS=20000 one GET's four attempts may take 80 s, no pause needed
      [
        'a GET that ran its attempts to the timeout',
        75,
        20_000,
        'one poll took 75 s, which one GET can take with PARTNER_API_TIMEOUT_MS=20000 (its attempts together up to 81 s): lower PARTNER_API_TIMEOUT_MS, so that they fit well inside the lease (60 s)',
      ],
    ])('says why a cycle outlived its lease, for %s', async (_kind, pollS, timeoutMs, why) => {
      await insertOrders(database.db, Array.from({ length: 4 }, (_, i) => ({ externalReference: `late-${pollS}-${i}`, nextPollAt: fromNow(-10 + i) })))
      // each poll takes pollS of the clock's time
      const fetcher = countingFetcher(async () => {
        await clock.advance(pollS * 1000)
        return 'funded'
      })
      const replica = `replica-late-${pollS}`
      const { getCall } = pollerSettings(testConfig().poll, observationSettings(testConfig()), { timeoutMs }, testConfig().databaseStatementTimeoutMs)
      const settings = { concurrency: 1, leaseS: 60, getCall }
      const summary = await testPoller({ db: database.db, fetcher, clock, replica, settings }).runOnce()
      expect(summary.polled).toBeLessThan(4)
      const warning = logEntries().find((entry) => entry.replica === replica && String(entry.msg).startsWith('reconcile cycle outlived its poll lease'))
      expect(warning?.msg).toBe(
        `reconcile cycle outlived its poll lease: the orders not yet polled were given back untried, as another replica may hold them now (${why})`,
      )
    })

    it('aborts the calls in flight when a 401 stops the cycle', async () => {
      await insertOrders(
        database.db,
        Array.from({ length: 3 }, (_, i) => ({ externalReference: `o${i}`, nextPollAt: fromNow(-10 + i) })),
      )
      const aborted: string[] = []
      const fetcher = {
        async getTrade(tradeId: string, options?: { signal?: AbortSignal }) {
          if (tradeId === 'tr_o2') throw platformError(401)
          // hangs until the cycle aborts it
          return new Promise<never>((_, reject) => {
            options?.signal?.addEventListener('abort', () => {
              aborted.push(tradeId)
              reject(options.signal!.reason)
            })
          })
        },
      }
      const summary = await testPoller({
        db: database.db,
        fetcher,
        clock,
        settings: { concurrency: 3 },
      }).runOnce()
      expect(aborted.sort()).toEqual(['tr_o0', 'tr_o1'])
      expect(summary).toMatchObject({ claimed: 3, polled: 1, released: 3, stoppedReason: 'unauthorized' })
      expect(await dueOrderStats(database.db, clock)).toMatchObject({ ordersDue: 3 })
    })
  })

  describe('leases', () => {
    it('lets another replica claim an order whose lease ran out, and the late write-back changes nothing', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      const slowAnswer = deferred<string>()
      const slowFetcher = countingFetcher(() => slowAnswer.promise)
      const slow = testPoller({
        db: database.db,
        fetcher: slowFetcher,
        clock,
        replica: 'replica-slow',
        settings: { leaseS: 60 },
      })
      const fast = testPoller({
        db: database.db,
        fetcher: countingFetcher(() => 'disputed'),
        clock,
        replica: 'replica-fast',
        settings: { leaseS: 60 },
      })

      const slowRun = slow.runOnce()
      // its GET is at the platform (a claim whose lease ran out before its poll began is not polled at all)
      await eventually(() => slowFetcher.calls.length === 1, 'claimed and polling')
      // inside the lease the order belongs to the slow replica
      expect((await fast.runOnce()).claimed).toBe(0)
      await clock.advance(60_000)
      const fastSummary = await fast.runOnce()
      expect(fastSummary.results.applied).toBe(1)

      // the slow replica's platform answer arrives after all: an older status, which must not land
      slowAnswer.resolve('delivered')
      const slowSummary = await slowRun
      expect(slowSummary.results.lease_lost).toBe(1)
      expect(slowSummary.changed).toBe(0)
      const order = await orderByReference(database.db, 'a')
      expect(order.tradeStatus).toBe('disputed')
      expect(await historyOf('a')).toEqual([{ fromStatus: 'funded', toStatus: 'disputed', source: 'poll' }])
    })

    // order `a` claimed by a replica whose platform answer waits on `slowAnswer`, its lease run out and the order
    // claimed again with the lease token 'newer'
    const slowReplicaPastItsLease = async <T extends string | Error | TradeRecord>() => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      const slowAnswer = deferred<T>()
      const fetcher = countingFetcher(() => slowAnswer.promise)
      const slow = testPoller({
        db: database.db,
        fetcher,
        clock,
        settings: { leaseS: 60 },
      })
      const slowRun = slow.runOnce()
      // its GET is at the platform (a claim whose lease ran out before its poll began is not polled at all)
      await eventually(() => fetcher.calls.length === 1, 'claimed and polling')
      await clock.advance(60_000)
      const [claimed] = await claimDueOrders(database.db, { now: now(), limit: 10, leaseS: 60, leaseToken: 'newer' })
      expect(claimed?.externalReference).toBe('a')
      return { slowAnswer, slowRun }
    }

    it('refuses a late error backoff from a replica whose lease ran out', async () => {
      const { slowAnswer, slowRun } = await slowReplicaPastItsLease<Error>()
      slowAnswer.resolve(new PartnerNetworkError('timed out late'))
      expect((await slowRun).results.lease_lost).toBe(1)
      const order = await orderByReference(database.db, 'a')
      expect(order.pollLeaseToken).toBe('newer')
      expect(new Date(order.nextPollAt!).toISOString()).toBe(fromNow(60).toISOString())
    })

    it('refuses a late mismatch flag from a replica whose lease ran out', async () => {
      const { slowAnswer, slowRun } = await slowReplicaPastItsLease<TradeRecord>()
      slowAnswer.resolve(tradeRecord({ trade_id: 'tr_a', reference: 'REF-a', status: 'funded', external_reference: 'someone-else' }))
      const summary = await slowRun
      expect(summary.results).toMatchObject({ lease_lost: 1, trade_mismatch: 0 })
      const order = await orderByReference(database.db, 'a')
      expect(order).toMatchObject({ attention: null, pollLeaseToken: 'newer' })
      expect(new Date(order.nextPollAt!).toISOString()).toBe(fromNow(60).toISOString())
    })

    // found from outside: a poll started at second 299 of a 300-s lease ran up to 235 s past its end, another replica
    // claimed the order again, and the first answer was thrown away (lease_lost)
    it('starts no poll once the lease has less than the longest poll left; the rest go back due now and the next cycle takes them', async () => {
      await insertOrders(database.db, Array.from({ length: 4 }, (_, i) => ({ externalReference: `short-${i}`, nextPollAt: fromNow(-10 + i) })))
      const dueBefore = fromNow(-7)
      // each poll takes 30 s of the clock's time: polls start at 0, 30 and 60 s, and at 90 s less than 235 s of the lease is left
      const fetcher = countingFetcher(async () => {
        await clock.advance(30_000)
        return 'funded'
      })
      const replica = 'replica-short-lease'
      const poller = testPoller({ db: database.db, fetcher, clock, replica, settings: { concurrency: 1, leaseS: 300, longestPollMs: 235_000 } })
      const summary = await poller.runOnce()
      expect(fetcher.calls).toEqual(['tr_short-0', 'tr_short-1', 'tr_short-2'])
      expect(summary).toMatchObject({ claimed: 4, polled: 3, released: 1, stoppedReason: null })
      const left = await orderByReference(database.db, 'short-3')
      expect(left).toMatchObject({ pollLeaseToken: null, pollAttempts: 0 })
      expect(new Date(left.nextPollAt!).toISOString()).toBe(dueBefore.toISOString())
      const warning = logEntries().find((entry) => entry.replica === replica && String(entry.msg).startsWith('reconcile cycle reached the end of its poll lease'))
      expect(warning).toMatchObject({ leaseS: 300, longestPollS: 235, untried: 1 })
      const next = await poller.runOnce()
      expect(next).toMatchObject({ claimed: 1, polled: 1, released: 0 })
      expect(fetcher.calls.at(-1)).toBe('tr_short-3')
    })

    it('takes the longest poll from PARTNER_API_TIMEOUT_MS and DATABASE_STATEMENT_TIMEOUT_MS', () => {
      const config = testConfig({ PARTNER_API_TIMEOUT_MS: '10000', DATABASE_STATEMENT_TIMEOUT_MS: '15000' })
      const settings = pollerSettings(config.poll, observationSettings(config), config.partner, config.databaseStatementTimeoutMs)
      expect(settings.longestPollMs).toBe(longestPollMs(10_000, 15_000))
      expect(settings.longestPollMs).toBeGreaterThan(200_000)
    })

    it('brings the orders of a replica that died mid-cycle back when the lease runs out', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      await claimDueOrders(database.db, { now: now(), limit: 10, leaseS: 300, leaseToken: 'died' })
      const fetcher = countingFetcher(() => 'delivered')
      const poller = testPoller({ db: database.db, fetcher, clock })
      expect((await poller.runOnce()).claimed).toBe(0)
      // the dead replica's claim holds the order until its lease runs out, and it counts as due (late) from when it came
      // due all the while, not from the lease's end
      expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 1, oldestDueAgeS: 1 })
      await clock.advance(300_000)
      expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 1, oldestDueAgeS: 301 })
      await clock.advance(15_000)
      expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 1, oldestDueAgeS: 316 })
      expect((await poller.runOnce()).results.applied).toBe(1)
    })
  })

  describe('a clock stepped mid-cycle', () => {
    // found from outside: a replica's clock stepped +600 s while a slow cycle ran; each poll after it wrote its next
    // due time by that clock (3 orders due 10-13 min late) and the run's end 9:39 in the future
    it('stops at the next poll: the one in flight finishes, no other starts, the rest go back due now, the run ends clock_offset in the database\'s time', async () => {
      // this clock agrees with the database's until the step
      clock = new FakeClock(Date.now())
      await insertOrders(database.db, Array.from({ length: 5 }, (_, i) => ({ externalReference: `step-${i}`, nextPollAt: fromNow(-10 + i) })))
      const dueBefore = [2, 3, 4].map((i) => fromNow(-10 + i).toISOString())
      let calls = 0
      const fetcher = countingFetcher(async () => {
        // the second poll is under way when the clock steps
        if (++calls === 2) await clock.advance(600_000)
        return 'funded'
      })
      const clockGuard = createClockGuard({ db: database.db, clock, logger: testLogger() })
      const replica = 'replica-stepped'
      const poller = testPoller({ db: database.db, fetcher, clock, replica, clockGuard, settings: { concurrency: 1 } })
      const summary = await poller.runOnce()
      expect(fetcher.calls).toEqual(['tr_step-0', 'tr_step-1'])
      expect(summary).toMatchObject({ claimed: 5, polled: 2, released: 3, stoppedReason: 'clock_offset' })
      const left = await Promise.all([2, 3, 4].map((i) => orderByReference(database.db, `step-${i}`)))
      expect(left.map((order) => [order.pollLeaseToken, order.pollAttempts])).toEqual([
        [null, 0],
        [null, 0],
        [null, 0],
      ])
      expect(left.map((order) => new Date(order.nextPollAt!).toISOString())).toEqual(dueBefore)
      const run = await database.db.selectFrom('reconcileRuns').selectAll().where('replica', '=', replica).executeTakeFirstOrThrow()
      expect(run).toMatchObject({ stoppedReason: 'clock_offset', polled: 2 })
      // its end in the database's time, not 600 s ahead
      expect(Math.abs(new Date(run.finishedAt!).getTime() - Date.now())).toBeLessThan(10_000)
      const line = logEntries().find((entry) => entry.replica === replica && entry.stoppedReason === 'clock_offset')
      expect(line?.msg).toBe(CLOCK_STEPPED_MESSAGE)
      expect(line?.offsetS).toBeLessThanOrEqual(-599)
      // and no cycle after it while the clock stays off
      await expect(poller.runOnce()).rejects.toBeInstanceOf(ClockOffError)
    })
  })

  describe('the loop', () => {
    it('runs a cycle, sleeps POLL_INTERVAL_S, runs again, and stops when told', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      const fetcher = countingFetcher(() => 'funded')
      const poller = testPoller({ db: database.db, fetcher, clock, settings: { intervalS: 30 } })
      poller.start()
      expect(poller.running).toBe(true)
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
      expect(fetcher.calls).toEqual(['tr_a'])
      expect(clock.sleeps).toEqual([30_000])

      // due again (an API call elsewhere scheduled it): picked up after the interval
      await database.db
        .updateTable('orders')
        .set({ nextPollAt: fromNow(10) })
        .execute()
      await clock.advance(30_000)
      await eventually(() => fetcher.calls.length === 2 && clock.pendingSleepers === 1, 'the second cycle')
      expect(clock.sleeps).toEqual([30_000, 30_000])

      await poller.stop()
      expect(poller.running).toBe(false)
      expect(clock.pendingSleepers).toBe(0)
    })

    it('sleeps the interval give or take a quarter, at random, so replicas started together drift apart', async () => {
      const randoms = [0, 0.5, 0.999]
      const poller = testPoller({
        db: database.db,
        fetcher: countingFetcher(() => 'funded'),
        clock,
        settings: { intervalS: 30 },
        random: () => randoms.shift()!,
      })
      poller.start()
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
      for (const _ of [1, 2]) {
        await clock.advance(clock.sleeps.at(-1)!)
        await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps again')
      }
      expect(clock.sleeps).toEqual([22_500, 30_000, 37_485])
      await poller.stop()
    })

    it('starts the next cycle at once while batches come back full', async () => {
      await insertOrders(
        database.db,
        Array.from({ length: 5 }, (_, i) => ({ externalReference: `o${i}`, nextPollAt: fromNow(-10 + i) })),
      )
      const fetcher = countingFetcher(() => 'funded')
      const poller = testPoller({ db: database.db, fetcher, clock, settings: { batchSize: 2 } })
      poller.start()
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
      // batches of 2, 2 and 1: only the last one, not full, ends in a sleep
      expect(fetcher.calls).toHaveLength(5)
      expect(clock.sleeps).toEqual([30_000])
      await poller.stop()
    })

    it('runs no cycle before the Retry-After of a 429 has passed, and then goes on at its interval', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      const fetcher = countingFetcher((_tradeId, call) =>
        call === 1 ? Object.assign(platformError(429), { retryAfterMs: 300_000 }) : 'funded',
      )
      const poller = testPoller({ db: database.db, fetcher, clock, settings: { intervalS: 30 } })
      poller.start()
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
      expect(clock.sleeps.at(-1)).toBe(300_000)
      await clock.advance(300_000)
      await eventually(() => fetcher.calls.length === 2, 'polled again after the wait')
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
      expect(clock.sleeps.at(-1)).toBe(30_000)
      await poller.stop()
    })

    /**
     * Starts the poller on `fetcher`'s refusals and checks that it sleeps 2, 4, 8 × the interval after each cycle;
     * returns it asleep after its fourth.
     */
    const startSleepsDoubling = async (
      fetcher: ReturnType<typeof countingFetcher>,
      settings: { intervalS: number; batchSize?: number; concurrency?: number },
    ) => {
      const poller = testPoller({ db: database.db, fetcher, clock, settings })
      poller.start()
      for (const expected of [60_000, 120_000, 240_000]) {
        await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
        expect(clock.sleeps.at(-1)).toBe(expected)
        await clock.advance(expected)
      }
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
      return poller
    }

    /** The same, one poll a cycle. */
    const expectSleepsDoubling = async (fetcher: ReturnType<typeof countingFetcher>, settings: { intervalS: number; batchSize?: number }) => {
      const poller = await startSleepsDoubling(fetcher, settings)
      expect(fetcher.calls).toHaveLength(4)
      await poller.stop()
    }

    it('backs off longer after each cycle in a row the platform answered 429, a Retry-After of 0 or none', async () => {
      await insertOrders(
        database.db,
        ['a', 'b', 'c', 'd'].map((externalReference) => ({ externalReference, nextPollAt: fromNow(-1) })),
      )
      // every order due: each cycle claims fresh ones, and each is answered 429
      const fetcher = countingFetcher((_tradeId, call) => (call % 2 === 1 ? Object.assign(platformError(429), { retryAfterMs: 0 }) : platformError(429)))
      await expectSleepsDoubling(fetcher, { intervalS: 30, batchSize: 1 })
    })

    it('backs off longer after each cycle stopped by the platform failing, and at the interval again once it answers', async () => {
      await insertOrders(database.db, Array.from({ length: 25 }, (_, i) => ({ externalReference: `out-${i}`, nextPollAt: fromNow(-100 + i) })))
      let failing = true
      const fetcher = countingFetcher(() => (failing ? platformError(502) : 'delivered'))
      const poller = await startSleepsDoubling(fetcher, { intervalS: 30, batchSize: 5, concurrency: 1 })
      // five polls a cycle, each stopped after them
      expect(fetcher.calls).toHaveLength(20)
      failing = false
      const sleepsBefore = clock.sleeps.length
      await clock.advance(clock.sleeps.at(-1)!)
      // Answered again, each cycle fills its batch and the next starts at once, without a sleep, until none is due: the
      // poller is asleep again only once every order was polled once more. Waited for as that sleep, not as a count of
      // calls on the way there (25 calls lasted only from one cycle's last poll to the next one's first: a look every
      // 5 ms missed it on a quick database, and found the poller asleep at 45)
      await eventually(() => clock.sleeps.length > sleepsBefore && clock.pendingSleepers === 1, 'the poller asleep again')
      // the five never polled first (due the earliest), then the twenty that failed, each once
      const trades = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => `tr_out-${from + i}`).sort()
      expect(fetcher.calls.slice(20, 25).sort()).toEqual(trades(20, 25))
      expect(fetcher.calls.slice(25).sort()).toEqual(trades(0, 20))
      expect((await database.db.selectFrom('orders').select('tradeStatus').execute()).map((order) => order.tradeStatus)).toEqual(
        Array.from({ length: 25 }, () => 'delivered'),
      )
      // one sleep, at the interval (random() is 0.5 here): no longer the backoff
      expect(clock.sleeps.slice(sleepsBefore)).toEqual([30_000])
      await poller.stop()
    })

    /** The test database, whose next cycle fails on it (its claim's `with` throws) when `first` or after failNextCycle(). */
    const databaseFailing = ({ first }: { first: boolean }) => {
      let failNext = first
      const db = new Proxy(database.db, {
        get(target, property, receiver) {
          if (property === 'with' && failNext) {
            failNext = false
            return () => {
              throw new Error('connection refused')
            }
          }
          const value = Reflect.get(target, property, receiver)
          return typeof value === 'function' ? value.bind(target) : value
        },
      })
      return { db, failNextCycle: () => void (failNext = true) }
    }

    it('backs off at most five minutes while the platform fails, below the stalled-poller bound, and after a database failure waits the interval', async () => {
      await insertOrders(database.db, Array.from({ length: 40 }, (_, i) => ({ externalReference: `down-${i}`, nextPollAt: fromNow(-100 + i) })))
      const fetcher = countingFetcher(() => platformError(502))
      const flaky = databaseFailing({ first: false })
      const poller = testPoller({ db: flaky.db, fetcher, clock, settings: { intervalS: 30, batchSize: 5, concurrency: 1 } })
      poller.start()
      // 60, 120, 240, then PLATFORM_FAILING_CAP_S where 480 s was, and again (it doubled up to an hour)
      for (const expected of [60_000, 120_000, 240_000, PLATFORM_FAILING_CAP_S * 1000]) {
        await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
        expect(clock.sleeps.at(-1)).toBe(expected)
        await clock.advance(expected)
      }
      await eventually(() => clock.pendingSleepers === 1 && clock.sleeps.length === 5, 'the poller sleeps')
      expect(clock.sleeps.at(-1)).toBe(PLATFORM_FAILING_CAP_S * 1000)
      const polled = fetcher.calls.length
      // the next cycle fails on the database: the next try after the interval, as its log line says (it slept the
      // platform's backoff)
      flaky.failNextCycle()
      await clock.advance(PLATFORM_FAILING_CAP_S * 1000)
      await eventually(() => clock.pendingSleepers === 1 && clock.sleeps.length === 6, 'the poller sleeps after the failed cycle')
      expect(fetcher.calls).toHaveLength(polled)
      expect(clock.sleeps.at(-1)).toBe(30_000)
      // the platform still failing then: the backoff goes on where it was
      await clock.advance(30_000)
      await eventually(() => clock.pendingSleepers === 1 && clock.sleeps.length === 7, 'the poller sleeps after the platform failed again')
      expect(fetcher.calls.length).toBeGreaterThan(polled)
      expect(clock.sleeps.at(-1)).toBe(PLATFORM_FAILING_CAP_S * 1000)
      await poller.stop()
    })

    it('backs off longer after each cycle the platform refused with 401, instead of hammering it', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      await expectSleepsDoubling(countingFetcher(() => platformError(401)), { intervalS: 30 })
    })

    it('on stop, aborts the cycle in flight, gives its claims back and records why it stopped', async () => {
      await insertOrders(database.db, [
        { externalReference: 'a', nextPollAt: fromNow(-20) },
        { externalReference: 'b', nextPollAt: fromNow(-10) },
      ])
      const fetcher = {
        calls: 0,
        getTrade(_tradeId: string, options?: { signal?: AbortSignal }) {
          this.calls++
          return new Promise<never>((_, reject) =>
            options?.signal?.addEventListener('abort', () => reject(options.signal!.reason)),
          )
        },
      }
      const poller = testPoller({ db: database.db, fetcher, clock, settings: { concurrency: 2 } })
      poller.start()
      await eventually(() => fetcher.calls === 2, 'both polls in flight')
      await poller.stop()

      const orders = await database.db.selectFrom('orders').selectAll().orderBy('id').execute()
      expect(orders.map((order) => [order.pollLeaseToken, order.pollAttempts])).toEqual([
        [null, 0],
        [null, 0],
      ])
      expect(new Date(orders[0]!.nextPollAt!).toISOString()).toBe(fromNow(-20).toISOString())
      const run = await database.db.selectFrom('reconcileRuns').selectAll().executeTakeFirstOrThrow()
      expect(run).toMatchObject({ stoppedReason: 'shutdown', polled: 0 })
      expect(run.finishedAt).not.toBeNull()
    })

    it('keeps going after a cycle fails on the database, trying again after the interval', async () => {
      await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: fromNow(-1) }])
      const fetcher = countingFetcher(() => 'delivered')
      const flaky = databaseFailing({ first: true })
      const poller = testPoller({ db: flaky.db, fetcher, clock })
      poller.start()
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps after the failure')
      expect(fetcher.calls).toEqual([])
      // a failed cycle is not a finished one: the stalled-poller metric must not move
      expect(poller.cycles).toEqual([])
      await clock.advance(30_000)
      await eventually(() => fetcher.calls.length === 1 && clock.pendingSleepers === 1, 'the next cycle')
      expect((await orderByReference(database.db, 'a')).tradeStatus).toBe('delivered')
      expect(poller.cycles.map((cycle) => [cycle.finishedAt.getTime(), cycle.polled])).toEqual([[clock.now(), 1]])
      await poller.stop()
    })
  })

  describe('metrics', () => {
    it('reports the orders due and how long the oldest has waited', async () => {
      await insertOrders(database.db, [
        { externalReference: 'a', nextPollAt: fromNow(-120) },
        { externalReference: 'b', nextPollAt: fromNow(-5) },
        { externalReference: 'c', nextPollAt: fromNow(5) },
      ])
      expect(await dueOrderStats(database.db, clock)).toEqual({ ordersDue: 2, oldestDueAgeS: 120 })
    })

    it('reports every poll result to onPollResult', async () => {
      await insertOrders(database.db, [
        { externalReference: 'moved', nextPollAt: fromNow(-4) },
        { externalReference: 'same', nextPollAt: fromNow(-3) },
        { externalReference: 'gone', nextPollAt: fromNow(-2) },
        { externalReference: 'broken', nextPollAt: fromNow(-1) },
        { externalReference: 'crossed', nextPollAt: fromNow(0) },
      ])
      const answers: Record<string, string | Error | TradeRecord> = {
        tr_moved: 'delivered',
        tr_same: 'funded',
        tr_gone: platformError(404),
        tr_broken: platformError(500),
        tr_crossed: tradeRecord({ trade_id: 'tr_someone', reference: 'REF-s', status: 'funded', external_reference: 'crossed' }),
      }
      const poller = testPoller({
        db: database.db,
        fetcher: countingFetcher((tradeId) => answers[tradeId]!),
        clock,
        settings: { concurrency: 1 },
      })
      await poller.runOnce()
      expect(poller.reported.map((result) => [result.externalReference, result.result])).toEqual([
        ['moved', 'applied'],
        ['same', 'unchanged'],
        ['gone', 'not_found'],
        ['broken', 'error'],
        ['crossed', 'trade_mismatch'],
      ])
      expect(poller.reported[0]).toMatchObject({
        fromStatus: 'funded',
        toStatus: 'delivered',
        tradeId: 'tr_moved',
      })
    })
  })
})
