// The background loops while the service's schema is not whole: a column of a table missing (42703: a database restored
// from a dump taken before the migration that added it, or in part). A statement that failed so only after the work
// had run made the work run again at every round: a stream's batch was handed to its handler again at each retry of
// its write-back, the job loop ran every due job and recorded none, and each cycle of the poller called the platform for
// each order it claimed and logged a line per order. Now each loop stops at the first such failure, starts nothing more
// until the schema is whole again (one line a second at most), and then carries on. The clock is a fake one: only the
// test moves backoffs, leases and the poll interval.
import { sql } from 'kysely'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import type { DispatcherSettings } from '../src/reactions/dispatcher-settings.js'
import { createReactionRegistry, type ReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { backoffDelayS } from '../src/reconcile/backoff-delay.js'
import { SCHEMA_NOT_WHOLE_MESSAGE } from '../src/reconcile/reconcile-cycle.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { clearReactions, reactionRecords, TEST_DISPATCHER_SETTINGS, untilEventsReadable } from './helpers/reaction-jobs.js'
import { countingFetcher, dueOrders, insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { eventually, testPoller } from './helpers/reconcile-poller.js'
import { useTestDatabase } from './helpers/test-database.js'

const SETTINGS = TEST_DISPATCHER_SETTINGS
const HALF = () => 0.5
const DISPATCHER_WAITS = "reaction dispatcher waits: the database's schema is not whole (a table, a column or a migration of this build missing): no stream is read and no job claimed until it is"
const POLLER_WAITS = "poller waits: the database's schema is not whole (a table, a column or a migration of this build missing): no order is claimed until it is"

describe('the background loops while a column is missing (42703)', () => {
  const database = useTestDatabase()
  let clock: FakeClock

  describe('the reaction dispatcher', () => {
    let dispatcher: Dispatcher | undefined
    let streams = 0
    let counter = 0

    beforeEach(() => {
      clock = new FakeClock(Date.now())
    })
    afterEach(async () => {
      await dispatcher?.stop()
      dispatcher = undefined
      await clearReactions(database.db)
    })

    const start = async (reactions: ReactionRegistry, settings: Partial<DispatcherSettings> = {}) => {
      streams = reactions.names.length
      dispatcher = createDispatcher({
        db: database.db,
        handler: reactions.handler,
        streams: reactions,
        clock,
        logger: testLogger(),
        listen: database.listen,
        settings: { ...SETTINGS, ...settings },
        random: HALF,
      })
      await dispatcher.start()
    }
    const transitions = async (reactions: ReactionRegistry, statuses: string[]) => {
      const orderId = await moveNewOrder(database.db, {
        externalReference: `loops-${++counter}`,
        statuses,
        handlersFor: reactions.handlersFor,
        now: () => new Date(clock.now()),
      })
      await untilEventsReadable(database.db)
      return orderId
    }
    /** The job loop and every stream asleep on the clock, no handler running: only the clock decides what comes next. */
    const idle = () => eventually(() => dispatcher!.running === 0 && clock.pendingSleepers === 1 + streams, 'the dispatcher is idle')
    /** Rounds of every loop: each sleeps at most the safety interval, and is woken by the clock's advance past it. */
    const rounds = async (count: number) => {
      for (let i = 0; i < count; i++) {
        await idle()
        await clock.advance(SETTINGS.safetyIntervalMs)
      }
      await idle()
    }

    it("hands a batch whose write-back met a column missing to its handler no more, writes it once the column is back, and goes on", async () => {
      const calls: string[] = []
      const reactions = createReactionRegistry().on('trade.*', 'ledger', async (event) => void calls.push(event.type))
      await start(reactions)
      const before = logEntries().length
      // written by a batch's write-back only: the read of the stream does not name it
      await sql`alter table reaction_stream_batches drop column events`.execute(database.db)
      try {
        await transitions(reactions, ['created'])
        await eventually(() => calls.length === 1, 'the first attempt ran')
        await rounds(5)
        // before: read again from the stream's written place at each retry, and handed to the handler each time
        expect(calls).toEqual(['trade.created'])
        const waits = logEntries().slice(before).filter((line) => line.msg === DISPATCHER_WAITS)
        expect(waits.length).toBeGreaterThan(0)
        expect(waits[0]!.err).toMatchObject({ kind: 'schema_missing', code: '42703' })
      } finally {
        await sql`alter table reaction_stream_batches add column if not exists events integer not null default 0`.execute(database.db)
      }
      await rounds(1)
      // the batch its write-back could not write is held in memory, and written once the column is back: its event is
      // not handed to the handler again (before, its write-back was lost and it ran once more)
      await eventually(async () => (await reactionRecords(database.db, 'ledger')).length === 1, 'the batch is recorded')
      expect(calls).toEqual(['trade.created'])
      await transitions(reactions, ['created'])
      await eventually(() => calls.length === 2, 'a later event is handed on')
      await rounds(2)
      expect(calls).toHaveLength(2)
    })

    it('claims no job while the write of their outcomes meets a column missing, and runs them once the column is back', async () => {
      const calls: { orderId: number; attempt: number }[] = []
      const reactions = createReactionRegistry().on('trade.created', 'ledger', async (event, { attempt }) => {
        calls.push({ orderId: event.orderId, attempt })
        // the first attempts throw: their retries are the job loop's
        if (attempt === 1) throw new Error('not yet')
      })
      await ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))
      for (let i = 0; i < 3; i++) await transitions(reactions, ['created'])
      await start(reactions)
      await eventually(() => calls.length === 3, 'the first attempts ran')
      await eventually(
        async () => (await database.db.selectFrom('reactionJobs').select('state').execute()).filter((job) => job.state === 'pending').length === 3,
        'the retries are written',
      )
      // what a job's completion writes, and its claim does not name
      await sql`alter table reaction_jobs drop column finished_at`.execute(database.db)
      try {
        await idle()
        await clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
        await eventually(() => calls.length === 6, 'the retries ran')
        // past the lease of their claim, several times over: before, claimed and run again each time
        for (let i = 0; i < 3; i++) {
          await idle()
          await clock.advance(SETTINGS.leaseMs)
        }
        await rounds(2)
        expect(calls.filter((call) => call.attempt > 2)).toEqual([])
      } finally {
        await sql`alter table reaction_jobs add column if not exists finished_at timestamptz`.execute(database.db)
      }
      await rounds(1)
      await eventually(
        async () => (await database.db.selectFrom('reactionJobs').select('state').execute()).every((job) => job.state === 'done'),
        'every job is done',
      )
      // each run once more: the outcome of its second attempt was never written
      expect(calls.filter((call) => call.attempt === 3)).toHaveLength(3)
    })
  })

  describe('the poller', () => {
    beforeEach(async () => {
      clock = new FakeClock()
      await database.db.deleteFrom('orders').execute()
      await database.db.deleteFrom('reconcileRuns').execute()
    })

    it('stops a cycle at the first poll whose write meets a column missing, claims nothing until it is back, then polls and applies', async () => {
      await insertOrders(database.db, dueOrders(20, new Date(clock.now() - 60_000)))
      const fetcher = countingFetcher(() => 'delivered')
      const poller = testPoller({ db: database.db, fetcher, clock, settings: { concurrency: 2, intervalS: 30 } })
      const before = logEntries().length
      // what recording a polled move writes (the history's), and the claim does not name
      await sql`alter table order_status_history drop column trade_id`.execute(database.db)
      try {
        poller.start()
        await eventually(() => poller.cycles.length === 1, 'the first cycle ended')
        // before: all 20 polled at the platform, none recorded, a warning for each
        expect(poller.cycles[0]).toMatchObject({ stoppedReason: 'schema_missing', polled: fetcher.calls.length, released: 20 - fetcher.calls.length })
        expect(fetcher.calls.length).toBeLessThanOrEqual(2)
        const calls = fetcher.calls.length
        // the poll interval, three times over: no cycle, no call
        for (let i = 0; i < 3; i++) {
          const sleeps = clock.sleeps.length
          await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
          await clock.advance(30_000)
          await eventually(() => clock.sleeps.length > sleeps, 'the poller looked again')
        }
        expect([poller.cycles.length, fetcher.calls.length]).toEqual([1, calls])
        const lines = logEntries().slice(before)
        expect(lines.filter((line) => line.msg === 'applying a polled status failed')).toEqual([])
        expect(lines.filter((line) => line.msg === SCHEMA_NOT_WHOLE_MESSAGE)).toHaveLength(1)
        expect(lines.filter((line) => line.msg === POLLER_WAITS).length).toBeGreaterThan(0)
      } finally {
        await sql`alter table order_status_history add column if not exists trade_id text`.execute(database.db)
      }
      const polledBefore = new Set(fetcher.calls)
      await eventually(() => clock.pendingSleepers === 1, 'the poller sleeps')
      await clock.advance(30_000)
      await eventually(() => poller.cycles.length === 2, 'a cycle ran once the column was back')
      // the orders given back untried, polled and moved; those polled before wait out their claim's lease
      const left = 20 - polledBefore.size
      expect(poller.cycles[1]).toMatchObject({ stoppedReason: null, claimed: left, changed: left })
      await poller.stop()
      for (let i = 0; i < 20; i++) {
        const order = await orderByReference(database.db, `order-${i}`)
        expect(order.tradeStatus, order.externalReference).toBe(polledBefore.has(`tr_order-${i}`) ? 'funded' : 'delivered')
      }
    })
  })
})
