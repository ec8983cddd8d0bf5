// The dispatcher: runs each (event, handler) job, wakes on the commit's notification, retries a throwing
// handler with backoff until the dead letter, keeps one order's events in sequence per handler, takes a
// job back whose lease ran out, and gives leases back when it stops. Time is a fake clock throughout:
// only the clock moves backoffs and leases, so nothing here depends on the machine's speed.
import { CompiledQuery, type Kysely, sql } from 'kysely'
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { openDatabase } from '../src/db/open-database.js'
import type { Database } from '../src/db/database.js'
import { moveNewOrder } from './helpers/orders.js'
import { createDispatcher, type Dispatcher, type DispatcherDeps } from '../src/reactions/dispatcher.js'
import { abortUnwindMs, type AttemptResult, type DispatcherSettings } from '../src/reactions/dispatcher-settings.js'
import type { ReactionEvent, ReactionHandler } from '../src/reactions/reaction-event.js'
import { claimReactionJobs, claimReactionJobsQuery, retryJob, skipJob, skipJobNotTaken } from '../src/reactions/reaction-job.repository.js'
import { ensureReactionStreams, readReactionStream, readReactionStreamQuery, writeReactionStream } from '../src/reactions/reaction-stream.repository.js'
import { HANDLER_IGNORED_ABORT, HANDOFF_MS } from '../src/reactions/stream-worker.js'
import { createReactionRegistry, type ReactionRegistry } from '../src/reactions/reaction-registry.js'
import { backoffDelayS } from '../src/reconcile/backoff-delay.js'
import { FakeClock } from './helpers/fake-clock.js'
import { processWarningsDuring } from './helpers/process-warnings.js'
import { logEntries, logLines, taggedLogger, testLogger } from './helpers/log-sink.js'
import { clearReactions, reactionRecords, TEST_DISPATCHER_SETTINGS, untilEventsReadable } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, type TestDatabase, useTestDatabase } from './helpers/test-database.js'

const SETTINGS = TEST_DISPATCHER_SETTINGS
const HALF = () => 0.5

describe('the reaction dispatcher', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  let dispatcher: Dispatcher | undefined
  let counter = 0
  let streams = 0

  beforeEach(() => {
    clock = new FakeClock(Date.now())
  })
  afterEach(async () => {
    await dispatcher?.stop()
    dispatcher = undefined
    await clearReactions(database.db)
  })

  /** Starts a dispatcher for the registry: its streams begin after what is committed, unless made before (`streamsNow`). */
  const start = async (reactions: ReactionRegistry, settings: Partial<DispatcherSettings> = {}, hooks: Partial<Pick<DispatcherDeps, 'onAttempt' | 'logger'>> = {}) => {
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
      ...hooks,
    })
    await dispatcher.start()
    return dispatcher
  }

  /** Moves an order through `statuses` (API answers), enqueuing the registry's jobs. */
  // an order moved through `statuses`, its events readable by the streams before the test goes on
  const transitions = async (reactions: ReactionRegistry, statuses: string[], ref = `dispatch-${++counter}`) => {
    const orderId = await moveNewOrder(database.db, { externalReference: ref, statuses, handlersFor: reactions.handlersFor, now: () => new Date(clock.now()) })
    await untilEventsReadable(database.db)
    return orderId
  }

  // the order's jobs of a handler by sequence: the rows, and the events done on their first attempt (no row:
  // recorded with their stream batch, id null)
  const jobs = async (orderId: number, handler: string) => {
    const rows = await database.db
      .selectFrom('reactionJobs')
      .select(['id', 'sequence', 'state', 'attempts', 'runAt', 'lastError', 'leaseToken'])
      .where('orderId', '=', orderId)
      .where('handler', '=', handler)
      .execute()
    const firstAttempts = (await reactionRecords(database.db, handler))
      .filter((record) => record.orderId === orderId && record.attempts === 1 && !rows.some((row) => row.sequence === record.sequence))
      .map(({ sequence }) => ({ id: null, sequence, state: 'done', attempts: 1, runAt: null, lastError: null, leaseToken: null }))
    return [...rows, ...firstAttempts].sort((a, b) => a.sequence - b.sequence)
  }

  /** The streams begin here: the transitions committed from now on are theirs, even before the dispatcher starts. */
  const streamsNow = (reactions: ReactionRegistry) => ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))

  /** The job loop and every stream are asleep (a timer each) and no handler runs: what happens next, only the clock decides. */
  const idle = () =>
    eventually(() => dispatcher!.running === 0 && clock.pendingSleepers === 1 + streams, 'the dispatcher is idle')

  it('hands each event to its handlers as soon as the commit notifies, with no clock moving', async () => {
    const seen: { handler: string; event: ReactionEvent; attempt: number }[] = []
    const record =
      (handler: string): ReactionHandler =>
      async (event, { attempt }) => {
        seen.push({ handler, event, attempt })
      }
    const reactions = createReactionRegistry().on('trade.funded', 'ship-goods', record('ship-goods')).on('trade.*', 'ledger', record('ledger'))
    await start(reactions)
    const orderId = await transitions(reactions, ['created', 'funded'], 'notified-1')
    await eventually(() => seen.length === 3, 'three jobs ran')
    const ledger = seen.filter((call) => call.handler === 'ledger')
    expect(ledger.map((call) => [call.event.sequence, call.event.type, call.event.from, call.event.to])).toEqual([
      [1, 'trade.created', null, 'created'],
      [2, 'trade.funded', 'created', 'funded'],
    ])
    const shipped = seen.find((call) => call.handler === 'ship-goods')!
    expect(shipped).toMatchObject({ attempt: 1, event: { orderId, externalReference: 'notified-1', tradeId: 'trd_notified-1', source: 'api' } })
    expect(shipped.event.eventId).toBe(ledger[1]!.event.eventId)
    // a handler's call is recorded before its job is marked done: wait for every job of both handlers
    // (all three: before a stream's write-back there are no rows, and every() of none is true)
    const allDone = async () => {
      const rows = [...(await jobs(orderId, 'ledger')), ...(await jobs(orderId, 'ship-goods'))]
      return rows.length === 3 && rows.every((job) => job.state === 'done')
    }
    await eventually(allDone, 'the jobs are done')
    expect(await jobs(orderId, 'ship-goods')).toMatchObject([{ state: 'done', attempts: 1, leaseToken: null }])
  })

  it('runs a dozen handlers under its one stop signal without a listener warning', async () => {
    // each stream's sleeps and batches listen to the dispatcher's stop signal while they last: a dozen streams
    // are more than Node's default of 10 listeners, which Node would report as a possible leak
    const warnings = await processWarningsDuring(async () => {
      const calls: string[] = []
      let reactions = createReactionRegistry()
      for (let i = 1; i <= 12; i++) reactions = reactions.on('trade.*', `handler-${i}`, async () => void calls.push(`handler-${i}`))
      await start(reactions)
      await transitions(reactions, ['created', 'funded'])
      await eventually(() => calls.length === 24, 'every handler took both events')
      await idle()
    })
    expect(warnings.filter((warning) => warning.startsWith('MaxListenersExceededWarning'))).toEqual([])
  })

  it('runs more than ten handlers at once under one batch or claim signal without a listener warning', async () => {
    // a stream's batch gives all its handlers one signal, and a claim all its jobs one: a handler that listens to
    // it (the forwarder does) puts REACTION_CONCURRENCY listeners on it, past Node's default of 10
    const orders = 16
    let started = 0
    const calls: number[] = []
    let release: () => void = () => {}
    let released = new Promise<void>((resolve) => (release = resolve))
    const warnings = await processWarningsDuring(async () => {
      const reactions = createReactionRegistry().on('trade.created', 'listening', async (_event, { signal, attempt }) => {
        const onAbort = () => {}
        signal.addEventListener('abort', onAbort)
        started += 1
        if (started % orders === 0) release()
        await released
        signal.removeEventListener('abort', onAbort)
        calls.push(attempt)
        // the first attempts throw: their retries come back through the job loop, claimed together
        if (attempt === 1) throw new Error('not yet')
      })
      await streamsNow(reactions)
      for (let i = 0; i < orders; i++) await transitions(reactions, ['created'])
      await start(reactions, { concurrency: orders })
      await eventually(() => calls.length === orders, 'every first attempt ran, all at once')
      released = new Promise<void>((resolve) => (release = resolve))
      await idle()
      await clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
      await eventually(() => calls.length === 2 * orders, 'every retry ran, all at once')
    })
    expect(calls.filter((attempt) => attempt === 2)).toHaveLength(orders)
    expect(warnings.filter((warning) => warning.startsWith('MaxListenersExceededWarning'))).toEqual([])
  })

  // Found from outside: with a receiver answering in 14 s, FORWARD_TIMEOUT_MS=30000 and REACTION_LEASE_S=40, events
  // that waited for a slot were started with a few seconds of lease left, cut off at its end, counted as failed
  // attempts, and sent twice. A call now starts only with its handler's whole timeout of lease left.
  /** Three orders' events through one slot, the calls answered one at a time after `takesMs[i]` of the clock. */
  const slowCalls = async ({ leaseMs, timeoutMs, takesMs }: { leaseMs: number; timeoutMs: number; takesMs: number[] }) => {
    const calls: { orderId: number; attempt: number; aborted: boolean; answered: boolean; answer: () => void }[] = []
    const reactions = createReactionRegistry().on(
      'trade.created',
      'slow-receiver',
      (event, { signal, attempt }) =>
        new Promise<void>((resolve, reject) => {
          const cut = () => {
            call.aborted = true
            reject(signal.reason)
          }
          const call = {
            orderId: event.orderId,
            attempt,
            aborted: false,
            answered: false,
            answer: () => {
              call.answered = true
              signal.removeEventListener('abort', cut)
              resolve()
            },
          }
          calls.push(call)
          signal.addEventListener('abort', cut)
        }),
      { timeoutMs },
    )
    await streamsNow(reactions)
    const orders: number[] = []
    for (let i = 0; i < takesMs.length; i++) orders.push(await transitions(reactions, ['created']))
    dispatcher = createDispatcher({
      db: database.db,
      handler: reactions.handler,
      timeoutOf: reactions.timeoutOf,
      streams: reactions,
      clock,
      logger: testLogger(),
      listen: database.listen,
      settings: { ...SETTINGS, concurrency: 1, leaseMs },
      random: HALF,
    })
    streams = 1
    await dispatcher.start()
    for (const [index, takes] of takesMs.entries()) {
      const running = () => calls.find((call) => !call.aborted && !call.answered)
      await eventually(() => running() !== undefined, `call ${index + 1} started`)
      await clock.advance(takes)
      const call = running()
      expect(call, `call ${index + 1} still running after ${takes} ms, not cut off`).toBeDefined()
      call!.answer()
    }
    await eventually(async () => {
      const states = await Promise.all(orders.map(async (orderId) => (await jobs(orderId, 'slow-receiver'))[0]?.state))
      return states.every((state) => state === 'done')
    }, 'every event is done')
    expect(calls.filter((call) => call.aborted)).toEqual([])
    expect(calls.map((call) => call.orderId).sort()).toEqual([...orders].sort())
    expect(calls.map((call) => call.attempt)).toEqual(takesMs.map(() => 1))
  }

  it('starts a job that waited for its slot only while the handler\'s timeout fits in its lease, so none is cut off and run twice', async () => {
    // each call answers after 25 s: the second would start 25 s into a 40-s lease, 11 s before its abort
    await slowCalls({ leaseMs: 40_000, timeoutMs: 30_000, takesMs: [25_000, 25_000, 25_000] })
  })

  it('starts a stream batch\'s later call only while the handler\'s timeout fits in the batch\'s lease', async () => {
    // the first call answers within HANDOFF_MS, and the batch goes on: the next would start with 35.8 s of the 36 s
    // left before the batch's abort, short of its 35.9-s timeout, and be cut off there by the 35.85 s it takes
    expect(200).toBeLessThan(HANDOFF_MS)
    await slowCalls({ leaseMs: 40_000, timeoutMs: 35_900, takesMs: [200, 35_850, 35_850] })
  })

  // While a handler's system is down every event fails, first attempts and retries alike: 5,000 forwards to a dead
  // port wrote 2,793 "retrying later" lines (930 KB) in 16 s. They are written once a second at most for each handler
  // and error code, the rest counted in `suppressed`; "failed for the last time" comes once a job, each one a job
  // for an operator, and is not limited.
  it('writes "retrying later" once a second per handler and error code, counting the rest, and every "failed for the last time"', async () => {
    const ORDERS = 40
    let code = 'partner_down'
    const calls: string[] = []
    const down =
      (handler: string): ReactionHandler =>
      async () => {
        calls.push(`${handler} ${code}`)
        throw Object.assign(new Error(`the partner system is down (${code})`), { code })
      }
    const reactions = createReactionRegistry().on('trade.*', 'down-a', down('down-a')).on('trade.*', 'down-b', down('down-b'))
    const before = logLines.length
    const started = Date.now()
    await start(reactions, { maxAttempts: 4, concurrency: 16 })
    for (let index = 0; index < ORDERS; index++) {
      await moveNewOrder(database.db, { externalReference: `down-${index}`, statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date(clock.now()) })
    }
    await untilEventsReadable(database.db)
    const failedAttempts = (attempts: number) => eventually(() => calls.length === 2 * ORDERS * attempts, `attempt ${attempts} of every job failed`)
    // attempts 1 (the streams') and 2 (the job loop's) fail with one code, 3 with another, and 4, the last, with that too
    await failedAttempts(1)
    await idle()
    await clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
    await failedAttempts(2)
    await idle()
    code = 'partner_timeout'
    await clock.advance(backoffDelayS(2, SETTINGS.backoff, HALF) * 1000)
    await failedAttempts(3)
    await idle()
    await clock.advance(backoffDelayS(3, SETTINGS.backoff, HALF) * 1000)
    await failedAttempts(4)
    await idle()

    const lines = () =>
      logLines
        .slice(before)
        .flatMap((line) => line.split('\n').filter(Boolean))
        .map((line) => JSON.parse(line) as { msg: string; handler?: string; error?: string; eventId?: string; suppressed?: number })
        .filter((line) => line.handler?.startsWith('down-'))
    const retrying = (handler: string, code: string) =>
      lines().filter((line) => line.msg === 'reaction handler failed; retrying later' && line.handler === handler && line.error === `Error: the partner system is down (${code})`)
    const accounted = (handler: string, code: string) => retrying(handler, code).reduce((sum, line) => sum + 1 + (line.suppressed ?? 0), 0)
    // every failed attempt that is tried again is written or counted in a written line's `suppressed`, per handler and
    // code (the last of each second is written at its end)
    const expected = { 'down-a partner_down': 2 * ORDERS, 'down-b partner_down': 2 * ORDERS, 'down-a partner_timeout': ORDERS, 'down-b partner_timeout': ORDERS }
    const seen = () => Object.fromEntries(Object.keys(expected).map((key) => [key, accounted(...(key.split(' ') as [string, string]))]))
    await eventually(() => JSON.stringify(seen()) === JSON.stringify(expected), 'every retried attempt is accounted for')
    const elapsedS = (Date.now() - started) / 1_000
    for (const key of Object.keys(expected)) {
      const written = retrying(...(key.split(' ') as [string, string])).length
      expect(written, key).toBeGreaterThanOrEqual(1)
      expect(written, key).toBeLessThanOrEqual(2 + Math.ceil(elapsedS))
    }
    // the jobs failed for good: one line each, every one written
    const failedForGood = lines().filter((line) => line.msg === 'reaction handler failed for the last time: the job is failed until retried or skipped')
    expect(failedForGood).toHaveLength(2 * ORDERS)
    expect(new Set(failedForGood.map((line) => `${line.handler} ${line.eventId}`)).size).toBe(2 * ORDERS)
  })

  // A "retrying later" line held back for the end of its second was written up to a second after the stop, into
  // whatever ran next (another test's log, here); it is written at the stop, before "stopped", and nothing after it
  it('writes the "retrying later" line it held back at its stop, before "stopped", and no line after', async () => {
    const calls: number[] = []
    const reactions = createReactionRegistry().on('trade.*', 'held-line', async () => {
      calls.push(calls.length)
      throw new Error('the partner system is down')
    })
    const own = taggedLogger()
    await start(reactions, { backoff: { baseS: 3_600, capS: 3_600 } }, { logger: own.logger })
    for (let index = 0; index < 3; index++) await transitions(reactions, ['created'], `held-line-${++counter}`)
    await eventually(() => calls.length === 3, 'three first attempts failed')
    await idle()
    const lines = () =>
      own
        .entries()
        .filter((line) => line.msg === 'reaction dispatcher stopped' || line.handler === 'held-line')
        .map((line) => [line.msg, line.suppressed])
    // (the three fail well within a second of each other: the limiter's own clock is the machine's)
    expect(lines()).toEqual([['reaction handler failed; retrying later', undefined]])
    const running = dispatcher!
    dispatcher = undefined
    await running.stop()
    const atStop = [
      ['reaction handler failed; retrying later', undefined],
      ['reaction handler failed; retrying later', 1],
      ['reaction dispatcher stopped', undefined],
    ]
    expect(lines()).toEqual(atStop)
    await new Promise((resolve) => setTimeout(resolve, 1_100))
    expect(lines()).toEqual(atStop)
  })

  it('retries a throwing handler after the backoff, fails it after the last attempt, and holds back that order for that handler until retried', async () => {
    let failing = true
    const flakyCalls: { sequence: number; attempt: number }[] = []
    const ledger: number[] = []
    const reactions = createReactionRegistry()
      .on('trade.*', 'flaky', async (event, { attempt }) => {
        flakyCalls.push({ sequence: event.sequence, attempt })
        if (failing) throw new Error(`the partner system is down (attempt ${attempt})`)
      })
      .on('trade.*', 'ledger', async (event) => {
        ledger.push(event.sequence)
      })
    await start(reactions)
    const startedAt = clock.now()
    const orderId = await transitions(reactions, ['created', 'funded'])

    await eventually(async () => (await jobs(orderId, 'flaky')).length === 2 && (await jobs(orderId, 'flaky'))[0]!.attempts === 1, 'the first attempt failed')
    let [first, second] = await jobs(orderId, 'flaky')
    expect(new Date(first!.runAt!).getTime()).toBe(startedAt + backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
    expect(first!.lastError).toBe('Error: the partner system is down (attempt 1)')
    // the later event waits behind it, untouched; the other handler is not held back
    expect(second).toMatchObject({ state: 'pending', attempts: 0 })
    await eventually(() => ledger.length === 2, 'the ledger saw both events')
    expect(ledger).toEqual([1, 2])

    await idle()
    await clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
    await eventually(async () => (await jobs(orderId, 'flaky'))[0]!.attempts === 2 && (await jobs(orderId, 'flaky'))[0]!.state === 'pending', 'the second attempt failed')
    await idle()
    await clock.advance(backoffDelayS(2, SETTINGS.backoff, HALF) * 1000)
    await eventually(async () => (await jobs(orderId, 'flaky'))[0]!.state === 'failed', 'the job is failed')
    ;[first, second] = await jobs(orderId, 'flaky')
    expect(first).toMatchObject({ attempts: 3, lastError: 'Error: the partner system is down (attempt 3)' })
    expect(second).toMatchObject({ state: 'pending', attempts: 0 })
    expect(flakyCalls).toEqual([
      { sequence: 1, attempt: 1 },
      { sequence: 1, attempt: 2 },
      { sequence: 1, attempt: 3 },
    ])

    // a day later it is still held back: a failed job is the dead letter, not retried on its own
    await idle()
    await clock.advance(86_400_000)
    await idle()
    expect((await jobs(orderId, 'flaky')).map((job) => job.state)).toEqual(['failed', 'pending'])

    // the operator retries it once the partner system is back: both run, in order
    failing = false
    expect(await retryJob(database.db, first!.id!, new Date(clock.now()))).toEqual({ result: 'retried' })
    await eventually(async () => (await jobs(orderId, 'flaky')).every((job) => job.state === 'done'), 'both jobs are done')
    expect(flakyCalls.slice(3)).toEqual([
      { sequence: 1, attempt: 1 },
      { sequence: 2, attempt: 1 },
    ])
  })

  // found from outside: a value String() cannot convert (Object.create(null)) threw out of the stream's attempt; no
  // outcome was written, and the handler's stream ran its batch again and again, other orders' events that had
  // succeeded too (one 42 times), past the attempt limit, with nothing for the operator to see
  it('records whatever a handler throws as its job\'s error, and runs the other events of the batch once', async () => {
    const calls: string[] = []
    const thrown: Record<string, unknown> = { 'odd-null': Object.create(null), 'odd-object': { code: 'thing_unreachable' }, 'odd-symbol': Symbol('gone') }
    const reactions = createReactionRegistry().on('trade.*', 'odd', async (event) => {
      calls.push(`${event.externalReference}#${event.sequence}`)
      if (event.externalReference in thrown) throw thrown[event.externalReference]
    })
    await streamsNow(reactions)
    const orders: Record<string, number> = {}
    for (const ref of ['odd-null', 'odd-plain-1', 'odd-object', 'odd-symbol', 'odd-plain-2']) orders[ref] = await transitions(reactions, ['created'], ref)
    await start(reactions)
    await eventually(async () => {
      for (const ref of Object.keys(thrown)) if ((await jobs(orders[ref]!, 'odd'))[0]?.attempts !== 1) return false
      return true
    }, 'each throwing event has its first attempt recorded')
    await idle()
    expect((await jobs(orders['odd-null']!, 'odd'))[0]).toMatchObject({ state: 'pending', attempts: 1, lastError: '{}' })
    expect((await jobs(orders['odd-object']!, 'odd'))[0]).toMatchObject({ state: 'pending', attempts: 1, lastError: '{"code":"thing_unreachable"}' })
    expect((await jobs(orders['odd-symbol']!, 'odd'))[0]).toMatchObject({ state: 'pending', attempts: 1, lastError: 'Symbol(gone)' })
    for (const ref of ['odd-plain-1', 'odd-plain-2']) expect((await jobs(orders[ref]!, 'odd'))[0]).toMatchObject({ state: 'done', attempts: 1 })
    expect(calls.sort()).toEqual(['odd-null#1', 'odd-object#1', 'odd-plain-1#1', 'odd-plain-2#1', 'odd-symbol#1'])
  })

  /**
   * One handler `name`, one transition, and the transition's job row left as `job` says (its streams begin after the
   * event, so only the job loop runs it); `calls` collects the sequences the handler was called for.
   */
  const oneJobLeft = async (
    name: string,
    job: { state: 'pending' | 'running'; attempts: number; runAt: Date; leaseToken: string | null; leaseExpiresAt: Date | null; lastError: string | null },
  ) => {
    const calls: number[] = []
    const reactions = createReactionRegistry().on('trade.*', name, async (event) => {
      calls.push(event.sequence)
    })
    const orderId = await transitions(reactions, ['created'])
    await streamsNow(reactions)
    const event = await database.db.selectFrom('orderStatusHistory').select(['eventId', 'sequence']).where('orderId', '=', orderId).executeTakeFirstOrThrow()
    await database.db
      .insertInto('reactionJobs')
      .values({ eventId: event.eventId, orderId, sequence: event.sequence!, handler: name, ...job, finishedAt: null })
      .execute()
    return { reactions, orderId, calls }
  }

  // found from outside: a job whose last attempt outlived its lease (a handler that ignores its abort, a replica that
  // died mid-call) is failed by the next claim without a call; it said `failed after 4 attempt(s)` of 3 calls
  it('fails a job whose last attempt outlived its lease without calling it again, counting the calls made', async () => {
    const past = new Date(clock.now() - 60_000)
    // the job row stands for the transition's, as a dead replica left it
    const { reactions, orderId, calls } = await oneJobLeft('overran', {
      state: 'running',
      attempts: SETTINGS.maxAttempts,
      runAt: past,
      leaseToken: 'a-dead-replica',
      leaseExpiresAt: past,
      lastError: null,
    })
    await start(reactions)
    await eventually(async () => (await jobs(orderId, 'overran'))[0]?.state === 'failed', 'the job is failed')
    expect((await jobs(orderId, 'overran'))[0]).toMatchObject({
      attempts: SETTINGS.maxAttempts,
      lastError: `Error: attempt ${SETTINGS.maxAttempts} of ${SETTINGS.maxAttempts} did not finish within its lease`,
    })
    expect(calls).toEqual([])
  })

  // found from outside: REACTION_MAX_ATTEMPTS lowered below a waiting job's attempts failed it as "attempt 3 of 2 did not
  // finish within its lease", pointing at a dead replica, and the receiver's own error (its 500) was lost
  it('fails a waiting job whose attempts REACTION_MAX_ATTEMPTS was lowered below, saying so and keeping its last error', async () => {
    const had = SETTINGS.maxAttempts + 1
    const { reactions, orderId, calls } = await oneJobLeft('lowered', {
      state: 'pending',
      attempts: had,
      runAt: new Date(clock.now() - 1_000),
      leaseToken: null,
      leaseExpiresAt: null,
      lastError: 'ForwardError: the receiver answered 500',
    })
    await start(reactions)
    await eventually(async () => (await jobs(orderId, 'lowered'))[0]?.state === 'failed', 'the job is failed')
    expect((await jobs(orderId, 'lowered'))[0]).toMatchObject({
      attempts: had,
      lastError: `Error: not called again: it has had ${had} attempts, more than REACTION_MAX_ATTEMPTS (now ${SETTINGS.maxAttempts})\n(the error before: ForwardError: the receiver answered 500)`,
    })
    expect(calls).toEqual([])
  })

  it('lets the order proceed when the operator skips its failed job', async () => {
    const calls: number[] = []
    const reactions = createReactionRegistry().on('trade.*', 'picky', async (event) => {
      calls.push(event.sequence)
      if (event.sequence === 1) throw new Error('refused')
    })
    await start(reactions, { maxAttempts: 1 })
    const orderId = await transitions(reactions, ['created', 'funded', 'delivered'])
    await eventually(async () => (await jobs(orderId, 'picky'))[0]?.state === 'failed', 'the first job is failed')
    await idle()
    expect(calls).toEqual([1])
    const [failed] = await jobs(orderId, 'picky')
    expect(await skipJob(database.db, failed!.id!, new Date(clock.now()))).toEqual({ result: 'skipped' })
    await eventually(async () => (await jobs(orderId, 'picky')).filter((job) => job.state === 'done').length === 2, 'the rest ran')
    expect(calls).toEqual([1, 2, 3])
    expect(await skipJob(database.db, failed!.id!, new Date(clock.now()))).toEqual({ result: 'not_allowed', state: 'skipped' })
    expect(await retryJob(database.db, '999999999', new Date(clock.now()))).toEqual({ result: 'not_found' })
  })

  /**
   * The service as it ran before a restart: `partner` took trade.delivered and trade.released, and the broker
   * behind it returned trade.delivered. An order moved created → funded → delivered → released: its delivered
   * job waits for its retry (one call made) and its released job is held back behind it. Then the dispatcher
   * stops, for the operator to change the handler's types and start again.
   */
  const heldBehindAFailure = async () => {
    const before = createReactionRegistry().on(['trade.delivered', 'trade.released'], 'partner', async (event) => {
      if (event.type === 'trade.delivered') throw new Error('no queue is bound for routing key trade.delivered')
    })
    await start(before)
    const orderId = await transitions(before, ['created', 'funded', 'delivered', 'released'])
    await eventually(async () => (await jobs(orderId, 'partner')).map((job) => job.attempts).join() === '1,0', 'the delivered job failed once')
    await idle()
    expect(await jobs(orderId, 'partner')).toMatchObject([
      { sequence: 3, state: 'pending', attempts: 1, lastError: 'Error: no queue is bound for routing key trade.delivered' },
      { sequence: 4, state: 'pending', attempts: 0 },
    ])
    await dispatcher!.stop()
    dispatcher = undefined
    return orderId
  }
  const untilRetryDue = () => clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)

  it('skips a held job, uncalled, once its handler no longer takes its type, and then runs the order’s next event', async () => {
    const orderId = await heldBehindAFailure()
    const calls: { type: string; attempt: number }[] = []
    const results: [string, AttemptResult][] = []
    // restarted with trade.released only (AMQP_EVENTS=trade.released, for the built-in publisher)
    const after = createReactionRegistry().on('trade.released', 'partner', async (event, { attempt }) => void calls.push({ type: event.type, attempt }))
    await start(after, {}, { onAttempt: (handler, result) => void results.push([handler, result]) })
    await idle()
    await untilRetryDue()
    await eventually(async () => (await jobs(orderId, 'partner'))[1]?.state === 'done', 'the released job is done')

    const reason = 'handler partner no longer takes trade.delivered (its registration); skipped without running'
    const [skipped, released] = await jobs(orderId, 'partner')
    // the claim's attempt is taken back: the handler was called once, before the restart
    expect(skipped).toMatchObject({ sequence: 3, state: 'skipped', attempts: 1, leaseToken: null })
    expect(skipped!.lastError).toBe(`${reason}\n(the error before: Error: no queue is bound for routing key trade.delivered)`)
    expect(released).toMatchObject({ sequence: 4, state: 'done', attempts: 1 })
    expect(calls).toEqual([{ type: 'trade.released', attempt: 1 }])
    expect(results).toEqual([
      ['partner', 'skipped'],
      ['partner', 'done'],
    ])
    const warnings = logEntries().filter((entry) => entry.msg === reason)
    expect(warnings).toHaveLength(1)
    // the job, its handler and type, and nothing of the event's body (no reference, trade id or statuses)
    // the attempts the job shows: the claim's attempt (2) is not counted, and the line said "attempt":2
    expect(warnings[0]).toMatchObject({ level: 40, jobId: String(skipped!.id), handler: 'partner', type: 'trade.delivered', attempts: 1 })
    expect(Object.keys(warnings[0]!).sort()).toEqual(['attempts', 'eventId', 'handler', 'jobId', 'level', 'msg', 'service', 'time', 'type'])
  })

  it('runs a held job as before when its handler still takes its type', async () => {
    const orderId = await heldBehindAFailure()
    const calls: { type: string; attempt: number }[] = []
    const after = createReactionRegistry().on(['trade.delivered', 'trade.released'], 'partner', async (event, { attempt }) => void calls.push({ type: event.type, attempt }))
    await start(after)
    await idle()
    await untilRetryDue()
    await eventually(async () => (await jobs(orderId, 'partner'))[1]?.state === 'done', 'the released job is done')
    expect(await jobs(orderId, 'partner')).toMatchObject([
      { sequence: 3, state: 'done', attempts: 2, lastError: null },
      { sequence: 4, state: 'done', attempts: 1 },
    ])
    expect(calls).toEqual([
      { type: 'trade.delivered', attempt: 2 },
      { type: 'trade.released', attempt: 1 },
    ])
  })

  // Replicas with different handlers (a rolling deploy that turns one on, AMQP_URL set on some): one without the
  // handler failed its jobs at once, `no reaction handler named amqp is registered`, and each held back the rest of
  // its order for good; an outside attack lost 60 of 60 events to the queue so
  it('leaves the jobs of a handler it does not have to a replica that has it: none claimed, none failed', async () => {
    const orderId = await heldBehindAFailure()
    await start(createReactionRegistry().on('trade.*', 'ledger', async () => {}))
    await idle()
    await untilRetryDue()
    await idle()
    expect(await jobs(orderId, 'partner')).toMatchObject([
      { sequence: 3, state: 'pending', attempts: 1, lastError: 'Error: no queue is bound for routing key trade.delivered' },
      { sequence: 4, state: 'pending', attempts: 0 },
    ])
    await dispatcher!.stop()
    // the replica with the handler runs them, in their order
    const calls: string[] = []
    await start(createReactionRegistry().on(['trade.delivered', 'trade.released'], 'partner', async (event) => void calls.push(event.type)))
    await eventually(async () => (await jobs(orderId, 'partner'))[1]?.state === 'done', 'the released job is done')
    expect(await jobs(orderId, 'partner')).toMatchObject([
      { sequence: 3, state: 'done', attempts: 2 },
      { sequence: 4, state: 'done', attempts: 1 },
    ])
    expect(calls).toEqual(['trade.delivered', 'trade.released'])
  })

  // A rolling deploy that widens FORWARD_EVENTS: the replica still on trade.funded held the stream, read every event
  // and moved its place past the ones it does not take, which the wider replica would have forwarded. An outside
  // attack lost 40 of 60 events so, with no job and no dead letter
  it('leaves a stream to the replica started later with other types: every event of those types runs, and this one skips none', async () => {
    const narrowCalls: string[] = []
    const wideCalls: string[] = []
    const narrow = createReactionRegistry().on('trade.funded', 'forward', async (event) => void narrowCalls.push(event.type))
    await start(narrow)
    await transitions(narrow, ['created', 'funded'])
    await eventually(async () => narrowCalls.length === 1, 'the narrow replica forwarded its funded event')
    // it holds the stream's lease now; the wide replica starts, and fails its first call of a delivered event
    let failDelivered = true
    const wide = createReactionRegistry().on('trade.*', 'forward', async (event) => {
      if (event.type === 'trade.delivered' && failDelivered) {
        failDelivered = false
        throw new Error('the receiver is away')
      }
      wideCalls.push(`${event.orderId} ${event.type}`)
    })
    const log = testLogger()
    const later = createDispatcher({
      db: database.db,
      handler: wide.handler,
      streams: wide,
      clock,
      logger: log,
      listen: database.listen,
      settings: SETTINGS,
      random: HALF,
    })
    await later.start()
    try {
      const second = await transitions(wide, ['created', 'funded', 'delivered'])
      // (the first order's events may run again there: the narrow replica had not written its place back yet, at least once)
      const ofSecond = () => wideCalls.filter((call) => call.startsWith(`${second} `))
      await eventually(async () => ofSecond().length === 2, 'the wide replica forwarded the created and funded events')
      expect(ofSecond()).toEqual([`${second} trade.created`, `${second} trade.funded`])
      // the narrow one heard it at its next read, and said so
      await eventually(
        async () => logEntries().some((entry) => entry.msg?.toString().startsWith('a replica started later takes other types for reaction handler forward')),
        'the narrow replica says it leaves the stream',
      )
      // the delivered event's retry is a job row, which either replica may claim: neither skips it
      await eventually(async () => (await jobs(second, 'forward')).some((job) => job.sequence === 3 && job.attempts === 1 && job.state === 'pending'), 'the delivered event failed once')
      // both asleep on the clock (a job loop and a stream each), so none reads the clock before the retry's time and after
      await eventually(() => dispatcher!.running === 0 && later.running === 0 && clock.pendingSleepers === 4, 'both replicas are idle')
      await untilRetryDue()
      await eventually(async () => (await jobs(second, 'forward')).some((job) => job.sequence === 3 && job.state === 'done'), 'the delivered retry is done')
      expect((await jobs(second, 'forward')).filter((job) => job.state === 'skipped')).toEqual([])
      expect([...ofSecond(), ...narrowCalls.slice(1).map((type) => `${second} ${type}`)].sort()).toEqual(
        [`${second} trade.created`, `${second} trade.delivered`, `${second} trade.funded`].sort(),
      )
      expect(narrowCalls[0]).toBe('trade.funded')
    } finally {
      await later.stop()
    }
  })

  it('without streams (the job loop alone), fails a held job whose handler is not registered, and keeps holding back its order', async () => {
    const orderId = await heldBehindAFailure()
    const ledger = createReactionRegistry().on('trade.*', 'ledger', async () => {})
    streams = 0
    dispatcher = createDispatcher({
      db: database.db,
      handler: ledger.handler,
      clock,
      logger: testLogger(),
      listen: database.listen,
      settings: SETTINGS,
      random: HALF,
    })
    await dispatcher.start()
    await idle()
    await untilRetryDue()
    await eventually(async () => (await jobs(orderId, 'partner'))[0]?.state === 'failed', 'the delivered job is failed')
    await idle()
    expect(await jobs(orderId, 'partner')).toMatchObject([
      { sequence: 3, state: 'failed', attempts: 2, lastError: 'Error: no reaction handler named partner is registered' },
      { sequence: 4, state: 'pending', attempts: 0 },
    ])
  })

  it('skips a job not taken any more only under its lease: a claim that lost it writes nothing', async () => {
    const orderId = await heldBehindAFailure()
    // the claims' times are their own parameters: no dispatcher runs, and the clock is not needed
    const due = new Date(clock.now() + backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
    const [first] = await claimReactionJobs(database.db, { now: due, limit: 10, leaseMs: 1_000, leaseToken: 'first-claim' })
    expect(first).toMatchObject({ handler: 'partner', event: { orderId, type: 'trade.delivered' } })
    // its lease ran out and another dispatcher claimed the job again
    const later = new Date(due.getTime() + 2_000)
    const [second] = await claimReactionJobs(database.db, { now: later, limit: 10, leaseMs: 60_000, leaseToken: 'second-claim' })
    expect(second?.id).toBe(first!.id)
    const skip = (leaseToken: string) => skipJobNotTaken(database.db, { id: first!.id, leaseToken, now: later, reason: 'not taken' })
    expect(await skip('first-claim')).toBe(false)
    expect((await jobs(orderId, 'partner'))[0]).toMatchObject({ state: 'running', attempts: 3, leaseToken: 'second-claim' })
    expect(await skip('second-claim')).toBe(true)
    expect((await jobs(orderId, 'partner'))[0]).toMatchObject({ state: 'skipped', attempts: 2, leaseToken: null })
  })

  it('reads a stream again when the lease of a dispatcher that died mid-batch runs out (and says which streams it holds)', async () => {
    const calls: { sequence: number; attempt: number }[] = []
    const reactions = createReactionRegistry().on('trade.*', 'ledger', async (event, { attempt }) => {
      calls.push({ sequence: event.sequence, attempt })
    })
    await streamsNow(reactions)
    const orderId = await transitions(reactions, ['created'])
    // a replica reads the event and dies: nothing writes its batch back
    const now = new Date(clock.now())
    const dead = await readReactionStream(database.db, { handler: 'ledger', leaseToken: 'dead-replica', now, leaseEnd: new Date(now.getTime() + 60_000), limit: 10 })
    expect(dead.events.map((entry) => entry.event.sequence)).toEqual([1])
    await start(reactions)
    await idle()
    expect(calls).toEqual([])
    // another replica holds the stream: this one's commits must wake it (the service's NOTIFY)
    expect(dispatcher!.holdsEveryStream()).toBe(false)
    await clock.advance(60_000)
    await eventually(() => calls.length === 1, 'the event ran again')
    expect(calls).toEqual([{ sequence: 1, attempt: 1 }])
    expect(dispatcher!.holdsEveryStream()).toBe(true)
    await eventually(async () => (await jobs(orderId, 'ledger'))[0]?.state === 'done', 'the job is done')
    // the dead replica's late write-back is refused by its token
    const late = await writeReactionStream(database.db, {
      handler: 'ledger',
      leaseToken: 'dead-replica',
      place: dead.events[0]!,
      outcomes: [],
      now: new Date(clock.now()),
      leaseEnd: new Date(clock.now() + 60_000),
    })
    expect(late).toBeUndefined()
    expect(await jobs(orderId, 'ledger')).toMatchObject([{ state: 'done', attempts: 1, lastError: null }])
    // stopped, it gives the lease back and holds nothing
    await dispatcher!.stop()
    expect(dispatcher!.holdsEveryStream()).toBe(false)
  })

  it('aborts a handler still running a little before its lease ends, and counts it as a failed attempt', async () => {
    const signals: AbortSignal[] = []
    const reactions = createReactionRegistry().on('trade.*', 'stuck', async (_event, { signal }) => {
      signals.push(signal)
      await new Promise((_resolve, reject) => signal.addEventListener('abort', () => reject(signal.reason)))
    })
    // both orders' events in the dispatcher's first batch
    await streamsNow(reactions)
    const orderId = await transitions(reactions, ['created', 'funded'], `stuck-${++counter}`)
    const other = await transitions(reactions, ['created'], `stuck-${++counter}`)
    await start(reactions)
    await eventually(() => signals.length === 2, 'both orders’ first handlers started')
    // the lease is 60 s; the margin is 5 s (a tenth of the lease, at most 5 s)
    await clock.advance(SETTINGS.leaseMs - 5_001)
    expect(signals.map((signal) => signal.aborted)).toEqual([false, false])
    await clock.advance(1)
    await eventually(() => signals.length === 2 && signals.every((signal) => signal.aborted), 'both handlers aborted')
    for (const id of [orderId, other]) {
      await eventually(async () => (await jobs(id, 'stuck'))[0]?.state === 'pending', 'the attempt is written back')
      expect((await jobs(id, 'stuck'))[0]).toMatchObject({ state: 'pending', attempts: 1, leaseToken: null })
      expect((await jobs(id, 'stuck'))[0]!.lastError).toMatch(/lease is about to end/)
    }
    // the order's second event waits behind the first
    expect((await jobs(orderId, 'stuck'))[1]).toMatchObject({ state: 'pending', attempts: 0 })
  })

  it('hands a slow handler to the job loop, runs no more handlers at once than its concurrency, and gives back a claimed job still waiting when its lease is about to end', async () => {
    let runningNow = 0
    let most = 0
    const calls: { sequence: string; attempt: number; finish: () => void }[] = []
    const reactions = createReactionRegistry().on('trade.*', 'gate', async (event, { signal, attempt }) => {
      runningNow += 1
      most = Math.max(most, runningNow)
      try {
        await new Promise<void>((resolve, reject) => {
          calls.push({ sequence: event.externalReference, attempt, finish: resolve })
          signal.addEventListener('abort', () => reject(signal.reason))
        })
      } finally {
        runningNow -= 1
      }
    })
    // three orders' events in the first batch; one slot
    await streamsNow(reactions)
    const orders: number[] = []
    const byReference = new Map<string, number>()
    for (let i = 0; i < 3; i++) {
      const reference = `gate-${++counter}`
      orders.push(await transitions(reactions, ['created'], reference))
      byReference.set(reference, orders.at(-1)!)
    }
    // (a retry's backoff longer than the test: only the jobs below are due)
    await start(reactions, { concurrency: 1, backoff: { baseS: 3_600, capS: 3_600 } })
    await eventually(() => calls.length === 1, 'one handler started')
    const states = () =>
      database.db.selectFrom('reactionJobs').select(['orderId', 'state', 'attempts']).where('handler', '=', 'gate').orderBy('orderId').execute()
    expect(await states()).toEqual([])
    // the batch does not wait for it: the running one is handed off, the two others left to the job loop
    await clock.advance(HANDOFF_MS)
    await eventually(async () => (await states()).length === 3, 'the batch is written back')
    expect(await states()).toEqual([
      { orderId: orders[0], state: 'running', attempts: 1 },
      { orderId: orders[1], state: 'pending', attempts: 0 },
      { orderId: orders[2], state: 'pending', attempts: 0 },
    ])
    // no slot: the job loop waits for the stuck handler, which is aborted shortly before its lease ends
    await clock.advance(SETTINGS.leaseMs - 5_000 - HANDOFF_MS)
    // its slot free, one claim leases both jobs: one runs, one waits in the process
    await eventually(() => calls.length === 2, 'a claimed job started')
    expect(calls[1]!.attempt).toBe(1)
    expect(byReference.get(calls[1]!.sequence)).not.toBe(orders[0])
    await eventually(async () => (await states()).filter((job) => job.state === 'running').length === 2, 'both jobs are leased')
    // that claim's lease is about to end: the running one is aborted (its attempt counted), the waiting one is
    // given back unstarted (not counted), claimed again at once and started
    await clock.advance(SETTINGS.leaseMs - 5_000)
    await eventually(() => calls.length === 3, 'the job given back is claimed again and started')
    expect(calls[2]!.attempt).toBe(1)
    expect(new Set(calls.map((call) => call.sequence)).size).toBe(3)
    calls[2]!.finish()
    await eventually(async () => (await states()).every((job) => job.state !== 'running'), 'nothing is leased')
    const final = new Map((await states()).map((job) => [job.orderId, job]))
    expect(final.get(orders[0]!)).toMatchObject({ state: 'pending', attempts: 1 })
    expect(final.get(byReference.get(calls[1]!.sequence)!)).toMatchObject({ state: 'pending', attempts: 1 })
    expect(final.get(byReference.get(calls[2]!.sequence)!)).toMatchObject({ state: 'done', attempts: 1 })
    expect(most).toBe(1)
  })

  // a handler whose calls hang until aborted; releaseAll() returns every call, and makes later ones return at
  // once (a call left hanging would hold the dispatcher's stop)
  const hangingHandler = () => {
    const hanging: (() => void)[] = []
    let over = false
    const handle: ReactionHandler = async (_event, { signal }) => {
      if (over) return
      await new Promise<void>((resolve, reject) => {
        hanging.push(resolve)
        signal.addEventListener('abort', () => reject(signal.reason), { once: true })
      })
    }
    const releaseAll = () => {
      over = true
      for (const finish of hanging) finish()
    }
    return { hanging, handle, releaseAll }
  }

  it('runs a handler’s events while another handler’s calls hang: each handler has its own REACTION_CONCURRENCY slots', async () => {
    // the partner's HTTP receiver never answers (until the lease ends); its RabbitMQ is fine
    const receiver = hangingHandler()
    const { hanging } = receiver
    const published: string[] = []
    const reactions = createReactionRegistry()
      .on('trade.created', 'receiver', receiver.handle)
      .on('trade.funded', 'broker', async (event) => {
        published.push(event.externalReference)
      })
    await streamsNow(reactions)
    // (committed before the start: the hanging handler's batch reads all three at once)
    for (let i = 0; i < 3; i++) await transitions(reactions, ['created'])
    await start(reactions, { concurrency: 2 })
    try {
      await eventually(() => hanging.length === 2, 'the hanging handler holds both of its slots')
      const references: string[] = []
      for (let i = 0; i < 5; i++) {
        references.push(`broker-${++counter}`)
        await transitions(reactions, ['funded'], references.at(-1))
      }
      // the clock does not move: no hanging call is aborted or timed out, and the other handler runs all the same
      await eventually(() => published.length === 5, 'the other handler handled every event')
      expect(published.sort()).toEqual(references.sort())
      expect(hanging).toHaveLength(2)
    } finally {
      receiver.releaseAll()
    }
  })

  it('claims a retry of one handler while another’s calls hang, leasing no more of the hanging one’s jobs than it can hold', async () => {
    const receiver = hangingHandler()
    const { hanging } = receiver
    const calls: { reference: string; attempt: number }[] = []
    const reactions = createReactionRegistry()
      .on('trade.created', 'receiver', receiver.handle)
      .on('trade.funded', 'broker', async (event, { attempt }) => {
        calls.push({ reference: event.externalReference, attempt })
        if (attempt === 1) throw new Error('the broker blinked')
      })
    await streamsNow(reactions)
    // one slot each; every one of the twelve orders' created events is due for the hanging handler
    for (let i = 0; i < 12; i++) await transitions(reactions, ['created'])
    await start(reactions, { concurrency: 1 })
    try {
      await eventually(() => hanging.length === 1, 'the hanging handler holds its slot')
      // its batch is written back: the call handed off, the other eleven due for the job loop
      await clock.advance(HANDOFF_MS)
      const leased = () =>
        database.db.selectFrom('reactionJobs').select(['state']).where('handler', '=', 'receiver').where('state', '=', 'running').execute()
      await eventually(async () => (await leased()).length >= 1, 'the hanging handler’s batch is written back')
      const reference = `retried-${++counter}`
      const orderId = await transitions(reactions, ['funded'], reference)
      await eventually(() => calls.length === 1, 'the broker handler’s first attempt failed')
      await eventually(async () => (await jobs(orderId, 'broker'))[0]?.state === 'pending', 'its retry is written')
      // its backoff ends (well before the hanging call's lease): the job loop claims the retry
      await clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
      // (a millisecond at a time: the loop may have gone to sleep for the retry after the advance; a few
      // seconds at most, far from the hanging call's lease)
      await eventually(async () => {
        await clock.advance(1)
        return calls.length === 2
      }, 'the retry ran')
      expect(calls[1]).toEqual({ reference, attempt: 2 })
      await eventually(async () => (await jobs(orderId, 'broker'))[0]?.state === 'done', 'the retry is done')
      // the hanging handler's jobs leased: its running call and at most 4 × REACTION_CONCURRENCY claimed ahead
      expect((await leased()).length).toBeLessThanOrEqual(1 + 4)
      expect(hanging).toHaveLength(1)
    } finally {
      receiver.releaseAll()
    }
  })

  it('claims a due job as soon as a stream batch gives back the slot the job loop found taken, with no clock moving', async () => {
    const calls: { reference: string; attempt: number; finish: () => void }[] = []
    let failing = true
    const reactions = createReactionRegistry().on('trade.*', 'gate', async (event, { attempt }) => {
      if (failing) {
        calls.push({ reference: event.externalReference, attempt, finish: () => {} })
        throw new Error('the partner system is down')
      }
      await new Promise<void>((finish) => calls.push({ reference: event.externalReference, attempt, finish }))
    })
    // one slot, one attempt: the first order's job is failed at once
    await start(reactions, { concurrency: 1, maxAttempts: 1 })
    const failedReference = `slot-a-${++counter}`
    const failedOrder = await transitions(reactions, ['created'], failedReference)
    await eventually(async () => (await jobs(failedOrder, 'gate'))[0]?.state === 'failed', 'the job is failed')
    try {
      // a second order's event: the stream's batch runs it, holding the only slot
      failing = false
      const otherReference = `slot-b-${++counter}`
      await transitions(reactions, ['created'], otherReference)
      await eventually(() => calls.length === 2, 'the stream runs the second event')
      // the operator retries the failed job meanwhile: the job loop wakes and finds the slot taken
      const [failed] = await jobs(failedOrder, 'gate')
      expect(await retryJob(database.db, failed!.id!, new Date(clock.now()))).toEqual({ result: 'retried' })
      await new Promise((resolve) => setTimeout(resolve, 100))
      expect(calls).toHaveLength(2)
      // the batch ends and gives the slot back: the job loop claims the retried job at once
      calls[1]!.finish()
      await eventually(() => calls.length === 3, 'the retried job started')
      // (a retried job starts its attempts afresh)
      expect(calls[2]).toMatchObject({ reference: failedReference, attempt: 1 })
      calls[2]!.finish()
    } finally {
      // (a call left waiting would hold the dispatcher's stop)
      for (const call of calls) call.finish()
    }
    await eventually(async () => (await jobs(failedOrder, 'gate'))[0]?.state === 'done', 'the retried job is done')
  })

  it('on stop, lets a running handler finish within the timeout, then aborts it and gives its lease back', async () => {
    let signalSeen: AbortSignal | undefined
    const reactions = createReactionRegistry().on('trade.*', 'slow', async (_event, { signal }) => {
      signalSeen = signal
      await new Promise((_resolve, reject) => signal.addEventListener('abort', () => reject(signal.reason)))
    })
    await start(reactions)
    const orderId = await transitions(reactions, ['created'])
    await eventually(() => signalSeen !== undefined, 'the handler started')
    const running = dispatcher!
    dispatcher = undefined
    expect(running.waitingOn()).toBeUndefined()
    const stopped = running.stop()
    // its batch is written back at once, the handler's job as running
    await eventually(async () => (await jobs(orderId, 'slow'))[0]?.state === 'running', 'the job is handed off')
    expect(await jobs(orderId, 'slow')).toMatchObject([{ state: 'running', attempts: 1 }])
    // stop waits for the handler on the clock's shutdown timeout
    await eventually(() => clock.sleeps.includes(SETTINGS.shutdownTimeoutMs), 'stop waits for the handler')
    expect(signalSeen!.aborted).toBe(false)
    // what a stop past the service's bound names beside the dispatcher
    expect(running.waitingOn()).toBe('the handler streams')
    await clock.advance(SETTINGS.shutdownTimeoutMs)
    await stopped
    expect(running.waitingOn()).toBeUndefined()
    expect(signalSeen!.aborted).toBe(true)
    expect(await jobs(orderId, 'slow')).toMatchObject([{ state: 'pending', attempts: 0, leaseToken: null }])
  })

  // A retry (the job loop's call) running at a stop past its grace: a handler that ends on its abort is let unwind and is
  // not said to ignore it; one that ignores it is named, with its event, as a stream's first attempt is. Before, the job
  // loop named neither, and a stream's batch named both (it ended their grace in the abort's own turn)
  // The wait is a second, or a fifth of the grace where that is shorter: with a grace of 2 s, 400 ms (the service's
  // stop bound would be 4 s, and a second after its half the stream's unwind and the job loop's passed 90 % of it)
  it.each([
    ['ends on its abort', false, 5_000, 1_000],
    ['ignores its abort', true, 5_000, 1_000],
    ['ignores its abort, its grace 2 s', true, 2_000, 400],
  ])('on stop, a retry whose handler %s is aborted and given back, and named only if it has not returned after its unwind', async (_, ignores, graceMs, unwindMs) => {
    const signals: AbortSignal[] = []
    let eventId: string | undefined
    let letGo = () => {}
    const reactions = createReactionRegistry().on('trade.*', 'retried', async (event, { signal, attempt }) => {
      eventId = event.eventId
      if (attempt === 1) throw new Error('the first attempt fails')
      signals.push(signal)
      await new Promise((resolve, reject) => {
        letGo = () => resolve(undefined)
        if (!ignores) signal.addEventListener('abort', () => reject(signal.reason))
      })
    })
    // its own lines: another file's in the same worker are not its (a line held back comes up to a second later)
    const own = taggedLogger()
    await start(reactions, { shutdownTimeoutMs: graceMs }, { logger: own.logger })
    const orderId = await transitions(reactions, ['created'])
    await eventually(async () => (await jobs(orderId, 'retried'))[0]?.attempts === 1, 'the first attempt failed')
    await idle()
    // (past the first attempt's "retrying later")
    const before = own.entries().length
    await clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
    await eventually(() => signals.length === 1, 'the retry started')
    const running = dispatcher!
    dispatcher = undefined
    const stopped = running.stop()
    await eventually(() => running.waitingOn() === 'the handlers in flight', 'stop waits for the retry')
    await clock.advance(graceMs)
    expect(signals[0]!.aborted).toBe(true)
    expect(abortUnwindMs(graceMs)).toBe(unwindMs)
    if (ignores) {
      await eventually(() => clock.sleeps.includes(unwindMs), 'stop lets the aborted call unwind')
      await clock.advance(unwindMs)
    }
    await stopped
    letGo()
    expect(await jobs(orderId, 'retried')).toMatchObject([{ state: 'pending', attempts: 1, leaseToken: null }])
    const warnings = own
      .entries()
      .slice(before)
      .filter((line) => line.level === 40)
      .map((line) => [line.msg, line.handler, line.eventId])
    expect(warnings).toEqual([
      ...(ignores ? [[HANDLER_IGNORED_ABORT, 'retried', eventId]] : []),
      ['reaction handlers stopped before finishing; their jobs run again', undefined, undefined],
    ])
  })

  // Over a path gone silent the listener's polite end never gets the server's answer: it waited a second of its own,
  // whatever the dispatcher had left of its share of the shutdown bound, and a bound that gave the dispatcher less
  // than that second was overrun: the compiled serve at SHUTDOWN_TIMEOUT_MS=1000 on a silenced path exited 1 at 0.92 s,
  // waiting for the listener, and exits 0 at 0.52 s (measured; a test of that would hang on the machine's speed)
  it('on stop, gives the notification listener what is left of its grace, not a second of its own', async () => {
    const given: (number | undefined)[] = []
    const reactions = createReactionRegistry().on('trade.*', 'quiet', async () => {})
    streams = reactions.names.length
    const running = createDispatcher({
      db: database.db,
      handler: reactions.handler,
      streams: reactions,
      clock,
      logger: testLogger(),
      listen: async (channel, onNotify) => {
        const unlisten = await database.listen(channel, onNotify)
        return async (withinMs) => {
          given.push(withinMs)
          await unlisten(withinMs)
        }
      },
      settings: { ...SETTINGS, shutdownTimeoutMs: 300 },
      random: HALF,
    })
    await running.start()
    await running.stop()
    // the fake clock did not move: all 300 ms of the grace were left
    expect(given).toEqual([300])
  })
})

describePostgres('the reaction claim (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
    // 200,000 finished jobs and 1,000 due ones: a claim must not read the finished ones
    await sql`insert into reaction_jobs (event_id, order_id, sequence, handler, state, run_at)
      select gen_random_uuid(), n / 20, n % 20, 'ledger', case when n <= 200000 then 'done' else 'pending' end,
        now() - interval '1 hour'
      from generate_series(1, 201000) n`.execute(database.db)
    await sql`analyze reaction_jobs`.execute(database.db)
  })
  afterAll(async () => {
    await database.close()
  })

  it('walks the due index in order and checks the order on the unfinished index, never scanning or sorting a table', async () => {
    const query = claimReactionJobsQuery({ now: new Date(), limit: 8, leaseMs: 60_000, leaseToken: 'plan' }).compile(database.db)
    const explained = await database.db.executeQuery<{ 'QUERY PLAN': string }>(
      CompiledQuery.raw(`explain ${query.sql}`, [...query.parameters]),
    )
    const plan = explained.rows.map((row) => row['QUERY PLAN']).join('\n')
    expect(plan).toMatch(/Index Scan using reaction_jobs_due_idx on reaction_jobs job/)
    expect(plan).toMatch(/reaction_jobs_unfinished_idx on reaction_jobs earlier/)
    expect(plan).not.toMatch(/Seq Scan/)
    // the due index gives the order: no sort of every due job before the limit (that is O(backlog) a claim)
    expect(plan).not.toMatch(/Sort|Hash/)
    // the events of the claimed jobs are looked up by id, not joined over the whole history
    expect(plan).toMatch(/order_status_history_event_id_key on order_status_history/)
  })
})

describePostgres('the notification listener (Postgres)', () => {
  it('counts the listeners of other processes on a channel, never its own', async () => {
    const database = await createTestDatabase()
    const another = database.openAnother()
    // a channel of this test's own: other test files' listeners share the database
    const channel = `count_${Date.now()}_${process.pid}`
    try {
      // not listening itself yet: it cannot tell its own listener from others
      expect(await database.otherListeners(channel)).toBeUndefined()
      const unlisten = await database.listen(channel, () => {})
      await eventually(async () => (await database.otherListeners(channel)) === 0, 'its own listener is connected and not counted')
      const unlistenAnother = await another.listen(channel, () => {})
      await eventually(async () => (await database.otherListeners(channel)) === 1, 'the other process’s listener is counted')
      await unlistenAnother()
      await eventually(async () => (await database.otherListeners(channel)) === 0, 'gone once it stopped listening')
      await unlisten()
    } finally {
      await another.close()
      await database.close()
    }
  })

  it('reconnects after its connection is cut, without an unhandled error, and hears the next commit', async () => {
    const database = await createTestDatabase()
    const name = `listener-${Date.now()}-${process.pid}`
    const url = new URL(database.url!)
    url.searchParams.set('application_name', name)
    const handle = openDatabase({ databaseUrl: url.toString(), poolSize: 1, logger: testLogger() })
    let notified = 0
    // a channel of its own: NOTIFY is per database, and other test files' dispatchers share this one's
    const channel = `listener_${process.pid}_${Date.now()}`
    const unlisten = await handle.listen(channel, () => notified++)
    // the listener's backend: the pool's connection has the URL's name too (the listener's probe goes through it)
    const backends = async () =>
      (
        await sql<{ pid: number }>`select pid from pg_stat_activity where application_name = ${name} and query like 'LISTEN %'`.execute(
          database.db,
        )
      ).rows
    try {
      await eventually(async () => (await backends()).length === 1 && notified === 1, 'the listener is connected')
      // cut it as a failover or a proxy would: only this test's listener backend
      await sql`select pg_terminate_backend(pid) from pg_stat_activity where application_name = ${name} and query like 'LISTEN %'`.execute(
        database.db,
      )
      // back, and it looks once on reconnecting
      await eventually(() => notified >= 2, 'the listener reconnected', 60_000)
      await eventually(async () => (await backends()).length === 1, 'one listener backend again')
      const before = notified
      await sql`select pg_notify(${channel}, '')`.execute(database.db)
      await eventually(() => notified > before, 'the notification after the reconnect arrived')
    } finally {
      await unlisten()
      await handle.close()
      await database.close()
    }
  })
})

// 200,000 events in the streams (their places spread below the snapshot's xmin, as committed events are),
// 20,000 from before them (no place), a stream that has read them all (the busy stream's usual read) and
// 50,000 done jobs of its handler. No statistics are taken after: as on tables growing faster than autovacuum
// analyzes them.
async function seedStreamHistory(db: Kysely<Database>): Promise<void> {
  await sql`insert into orders (external_reference) select 'plan-' || n from generate_series(1, 1000) n`.execute(db)
  await sql`insert into order_status_history (order_id, from_status, to_status, source, sequence, stream_position)
    select o.id, 'created', 'funded', 'webhook', n / 1000,
      case when n > 20000 then (1 + (n - 20001) * (x.xmin - 2) / 200000)::text::xid8 end
    from generate_series(1, 220000) n
    join orders o on o.external_reference = 'plan-' || (n % 1000 + 1)
    cross join (select pg_snapshot_xmin(pg_current_snapshot())::text::bigint as xmin) x`.execute(db)
  await sql`insert into reaction_streams (handler, position, history_id, lease_token, lease_expires_at)
    select 'ledger', stream_position, id, 'plan', now() + interval '1 hour' from order_status_history
    where stream_position is not null order by stream_position desc, id desc limit 1`.execute(db)
  await sql`insert into reaction_jobs (event_id, order_id, sequence, handler, state, attempts, run_at, finished_at)
    select event_id, order_id, sequence, 'ledger', 'done', 1, now(), now() from order_status_history
    where stream_position is not null limit 50000`.execute(db)
}

/** The stream read as a prepared statement, and EXECUTE's arguments for it (expressions: the values as literals). */
function preparedRead(db: Kysely<Database>): { prepare: string; execute: string } {
  const now = new Date()
  const query = readReactionStreamQuery({ handler: 'ledger', leaseToken: 'plan', now, leaseEnd: new Date(now.getTime() + 60_000), limit: 64 }).compile(db)
  const literal = (value: unknown) =>
    value === null
      ? 'null'
      : typeof value === 'number'
        ? String(value)
        : `'${(value instanceof Date ? value.toISOString() : String(value)).replaceAll("'", "''")}'`
  return {
    prepare: `prepare plan_read as ${query.sql.replace(/^\/\* prepared \*\/\s*/, '')}`,
    execute: `execute plan_read(${query.parameters.map(literal).join(', ')})`,
  }
}

/** The shape every plan of the read must have, on any statistics. */
function expectStreamReadPlan(plan: string): void {
  expect(plan).not.toMatch(/Seq Scan on order_status_history/)
  // the events after the place, and the look past the snapshot's xmin
  expect(plan.match(/using order_status_history_stream_idx/g)).toHaveLength(2)
  // whether an event waits behind an unfinished job: the unfinished jobs' index, never a walk of every
  // job of the handler (done ones, as many as retention keeps)
  expect(plan).toMatch(/(using|on) reaction_jobs_unfinished_idx/)
  expect(plan).not.toMatch(/reaction_jobs_handler_idx|Seq Scan on reaction_jobs/)
  // and probed by the event's order: a check of the handler alone reads each of its unfinished jobs on every
  // read, and with statistics behind the table Postgres took the handler index for it, every done job
  const lines = plan.split('\n')
  const jobScans = lines.flatMap((line, index) => (/ on reaction_jobs j\b/.test(line) ? [lines[index + 1]!.trim()] : []))
  expect(jobScans.length).toBeGreaterThan(0)
  for (const condition of jobScans) expect(condition).toMatch(/^Index Cond: \(\(order_id = h\.order_id\) AND \(handler = /)
}

describePostgres('the stream read (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
    // the statistics are those of the empty tables
    await sql`analyze order_status_history`.execute(database.db)
    await sql`analyze reaction_jobs`.execute(database.db)
    await seedStreamHistory(database.db)
  })
  afterAll(async () => {
    await database?.close()
  })

  for (const mode of ['force_custom_plan', 'force_generic_plan']) {
    it(`reads the history and probes for withheld events through the stream index, never scanning it (${mode})`, async () => {
      // the read is a prepared statement: Postgres may keep a generic plan for it. Prepared here too, so the
      // generic plan is the one a parameter's unknown value gives
      const read = preparedRead(database.db)
      const plan = await database.db.connection().execute(async (connection) => {
        await sql`set plan_cache_mode = ${sql.raw(mode)}`.execute(connection)
        await connection.executeQuery(CompiledQuery.raw(read.prepare))
        try {
          const explained = await connection.executeQuery<{ 'QUERY PLAN': string }>(CompiledQuery.raw(`explain ${read.execute}`))
          return explained.rows.map((row) => row['QUERY PLAN']).join('\n')
        } finally {
          await sql`deallocate plan_read`.execute(connection)
          await sql`reset plan_cache_mode`.execute(connection)
        }
      })
      expectStreamReadPlan(plan)
    })
  }

  it('is planned once per connection: after its first reads Postgres keeps one plan for it (plan_cache_mode auto)', async () => {
    // a stream reads every few milliseconds under load; planning each read anew cost 0.2 ms of Postgres's CPU
    const read = preparedRead(database.db)
    const plans = await database.db.connection().execute(async (connection) => {
      await connection.executeQuery(CompiledQuery.raw(read.prepare))
      try {
        for (let reads = 0; reads < 10; reads++) await connection.executeQuery(CompiledQuery.raw(read.execute))
        const { rows } = await connection.executeQuery<{ genericPlans: string; customPlans: string }>(
          CompiledQuery.raw(`select generic_plans, custom_plans from pg_prepared_statements where name = 'plan_read'`),
        )
        return rows[0]
      } finally {
        await sql`deallocate plan_read`.execute(connection)
      }
    })
    // Postgres plans the first five for their values, then compares: the kept plan served the other five (with
    // the limit a bare parameter, every read was planned for its values: 10 custom plans, no generic one)
    expect(Number(plans?.genericPlans)).toBeGreaterThanOrEqual(5)
    expect(Number(plans?.customPlans)).toBeLessThanOrEqual(5)
  })

  it('keeps that shape in a generic plan made while the tables were empty, used after they filled', async () => {
    // a connection keeps a prepared statement's generic plan for its life: one made on a new deploy's empty
    // tables still reads the streams once they hold millions of rows (inserts do not make Postgres plan
    // again). With the batch limit a constant in the statement, this plan read the history through a bitmap
    // scan and a sort of everything after the place
    const fresh = await createTestDatabase()
    try {
      const read = preparedRead(fresh.db)
      const plan = await fresh.db.connection().execute(async (connection) => {
        await sql`set plan_cache_mode = force_generic_plan`.execute(connection)
        await connection.executeQuery(CompiledQuery.raw(read.prepare))
        await connection.executeQuery(CompiledQuery.raw(read.execute))
        await seedStreamHistory(connection)
        const explained = await connection.executeQuery<{ 'QUERY PLAN': string }>(CompiledQuery.raw(`explain (analyze, timing off) ${read.execute}`))
        return explained.rows.map((row) => row['QUERY PLAN']).join('\n')
      })
      expectStreamReadPlan(plan)
    } finally {
      await fresh.close()
    }
  })
})
