// A handler stream's batch: it waits while its handlers keep returning (up to BATCH_MAX_MS), and is written back
// HANDOFF_MS after the last one returned. Its size follows its slots: after a batch cut short with events its
// slots never reached (those go to the job loop, a statement each), the next reads what the slots finished at
// that pace in three quarters of the wait; after full batches that finished it grows back, at most doubling.
// An order waiting behind its own slow call is not the slots' fault and changes nothing. Time is a fake
// clock: only the test decides when a handler returns and when the wait is over.
import { afterEach, describe, expect, it } from 'vitest'
import type { ReactionHandler } from '../src/reactions/reaction-event.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { BATCH_MAX_MS, HANDOFF_MS, nextBatchLimit } from '../src/reactions/stream-worker.js'
import { FakeClock } from './helpers/fake-clock.js'
import { moveNewOrder } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { clearReactions, reactionRecords, TEST_DISPATCHER_SETTINGS, testStreamWorker, untilEventsReadable } from './helpers/reaction-jobs.js'
import { useTestDatabase } from './helpers/test-database.js'

const CONCURRENCY = 2
const SETTINGS = { ...TEST_DISPATCHER_SETTINGS, concurrency: CONCURRENCY }

describe('the size of a reaction stream batch', () => {
  const database = useTestDatabase()
  let counter = 0

  afterEach(async () => {
    await clearReactions(database.db)
  })

  /** A handler whose calls return when the test says (or at once, once opened). */
  const gatedHandler = () => {
    const waiting: { reference: string; finish: () => void }[] = []
    let open = false
    const handler: ReactionHandler = async (event) => {
      if (open) return
      await new Promise<void>((finish) => waiting.push({ reference: event.externalReference, finish }))
    }
    return {
      handler,
      waiting,
      open: () => {
        open = true
        for (const call of waiting.splice(0)) call.finish()
      },
    }
  }

  const setUp = async (handler: ReactionHandler, report: (handler: string, result: string, count?: number) => void = () => {}) => {
    const clock = new FakeClock(Date.now())
    const reactions = createReactionRegistry().on('trade.*', 'gate', handler)
    await ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))
    /** `count` orders created, one event each, committed after the stream's place (and readable by it). */
    const transitions = async (count: number) => {
      for (let i = 0; i < count; i++) {
        await moveNewOrder(database.db, { externalReference: `batch-${++counter}`, statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date(clock.now()) })
      }
      await untilEventsReadable(database.db)
    }
    const worker = testStreamWorker(database.db, { name: 'gate', handler, clock, leaseToken: 'lease-batches', settings: SETTINGS, report })
    const stop = new AbortController()
    return { clock, transitions, worker, batch: () => worker.batch(stop.signal) }
  }

  it('waits while its handlers keep returning, reads fewer after its longest wait cut it short, then grows back', async () => {
    const gate = gatedHandler()
    const { clock, transitions, worker, batch } = await setUp(gate.handler)
    await transitions(100)

    // the first batch reads them all; each HANDOFF_MS its two slots finish a call each, so it keeps waiting
    // until BATCH_MAX_MS: 40 finished, 2 running, 58 never reached
    const first = batch()
    for (let waited = 0; waited < BATCH_MAX_MS; waited += HANDOFF_MS) {
      await eventually(() => gate.waiting.length === CONCURRENCY, 'both slots are busy')
      for (const call of gate.waiting.splice(0)) call.finish()
      await eventually(() => gate.waiting.length === CONCURRENCY, 'both slots are busy again')
      await clock.advance(HANDOFF_MS)
    }
    expect(await first).toMatchObject({ read: 100, full: false })
    // 40 finished in 5 s: 30 (40 × 3/4) in the next batch
    expect(worker.limit).toBe(30)
    gate.open()
    await worker.settled()

    await transitions(100)
    // full batches that finish in time double, up to what is there
    expect(await batch()).toMatchObject({ read: 30, full: true })
    expect(await batch()).toMatchObject({ read: 60, full: true })
    expect(await batch()).toMatchObject({ read: 10, full: false })
    // a batch that was not full gives no reason to read more
    expect(worker.limit).toBe(120)
    // (batches whose every event was done are written back at the next read, here one that finds nothing new)
    expect(await batch()).toMatchObject({ read: 0 })
    const jobs = await reactionRecords(database.db, 'gate')
    // the first batch's 58 never started went to the job loop (pending, due now); every later one was done in its batch
    expect(jobs.filter((job) => job.state === 'pending' && job.attempts === 0)).toHaveLength(58)
    expect(jobs.filter((job) => job.state === 'done')).toHaveLength(40 + CONCURRENCY + 100)
  })

  it('reports every attempt of a batch to the metrics, counted by result', async () => {
    // a batch reports its attempts together (one call per result): the counts add up to its events
    const reported = new Map<string, number>()
    let calls = 0
    const { transitions, batch } = await setUp(
      async () => {
        calls += 1
        if (calls % 4 === 0) throw new Error('every fourth call fails')
      },
      (handler, result, count = 1) => reported.set(`${handler} ${result}`, (reported.get(`${handler} ${result}`) ?? 0) + count),
    )
    await transitions(10)
    expect(await batch()).toMatchObject({ read: 10 })
    expect(Object.fromEntries(reported)).toEqual({ 'gate done': 8, 'gate retry': 2 })
  })

  it('keeps its size when only an order waiting behind its own slow call held it, HANDOFF_MS after the others returned', async () => {
    const gate = gatedHandler()
    const { clock, transitions, worker, batch } = await setUp(gate.handler)
    await transitions(6)
    // every order's call but one returns in the first HANDOFF_MS
    const first = batch()
    for (let finished = 0; finished < 5; finished++) {
      await eventually(() => gate.waiting.length > 0, 'a call is waiting')
      gate.waiting.shift()!.finish()
    }
    await eventually(() => gate.waiting.length === 1, 'the last call is running')
    await clock.advance(HANDOFF_MS)
    // handlers returned in that wait: the batch waits on
    await clock.advance(HANDOFF_MS - 1)
    expect(await Promise.race([first, new Promise((resolve) => setTimeout(resolve, 50, 'waiting'))])).toBe('waiting')
    // none returned for HANDOFF_MS: written back, the slow call handed off
    await clock.advance(1)
    expect(await first).toMatchObject({ read: 6 })
    expect(worker.limit).toBe(512)
    const running = await database.db.selectFrom('reactionJobs').select('id').where('handler', '=', 'gate').where('state', '=', 'running').execute()
    expect(running).toHaveLength(1)
    gate.open()
    await worker.settled()
  })
})

describe('nextBatchLimit', () => {
  const bounds = { min: 8, max: 512, waitMs: BATCH_MAX_MS }
  const cut = { elapsedMs: BATCH_MAX_MS, allFinished: false, unreached: true }
  it('sizes the batch to the pace of the slots within three quarters of the longest wait', () => {
    // 8 slots and a receiver answering in 100 ms: 400 of 512 finished when the wait ran out
    expect(nextBatchLimit(512, { read: 512, full: true, mine: 512, finished: 400, ...cut }, bounds)).toBe(300)
    // the next, 300 finished in 3,750 ms: it stays there rather than doubling
    expect(nextBatchLimit(300, { read: 300, full: true, mine: 300, finished: 300, elapsedMs: 3_750, allFinished: true, unreached: false }, bounds)).toBe(300)
    // 300 finished in 4,500 ms, its last orders' events on a few slots: no smaller for that
    expect(nextBatchLimit(300, { read: 300, full: true, mine: 300, finished: 300, elapsedMs: 4_500, allFinished: true, unreached: false }, bounds)).toBe(300)
    // a handler of one type in four: the events read scale with what it takes
    expect(nextBatchLimit(512, { read: 512, full: true, mine: 128, finished: 40, ...cut }, bounds)).toBe(120)
    // nothing finished: one event a slot
    expect(nextBatchLimit(512, { read: 512, full: true, mine: 512, finished: 0, ...cut }, bounds)).toBe(8)
    // a fast handler: doubles back to the most a batch reads
    expect(nextBatchLimit(300, { read: 300, full: true, mine: 300, finished: 300, elapsedMs: 3, allFinished: true, unreached: false }, bounds)).toBe(512)
    // no event of its types: full and finished, doubles
    expect(nextBatchLimit(64, { read: 64, full: true, mine: 0, finished: 0, elapsedMs: 1, allFinished: true, unreached: false }, bounds)).toBe(128)
    // finished, but its last read was not full (the reads ahead brought more than one read asks): no bigger
    expect(nextBatchLimit(300, { read: 420, full: false, mine: 420, finished: 420, elapsedMs: 3, allFinished: true, unreached: false }, bounds)).toBe(300)
  })
})
