// A handler's timeoutMs is a timeout: its call's signal is aborted at it, on the stream's first attempt and on the job
// loop's retries alike, and the attempt is a failure ("timed out after N ms") retried as any other; a call that
// ignores its signal keeps its slot until it returns, and its late answer is not taken. A timeoutMs the lease would
// cut off first is refused when the handler is registered. Found from outside: `{ timeoutMs: 2000 }` and a handler
// waiting 20 s on its signal ran 20,000 ms, its signal never aborted, the option deciding only whether a call started.
// Time is a fake clock: only the clock moves the deadlines, so nothing here depends on the machine's speed.
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createCallTimeouts, HandlerTimeoutError } from '../src/reactions/call-timeouts.js'
import { configuredReactions } from '../src/reactions/configured-reactions.js'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import type { ReactionHandler } from '../src/reactions/reaction-event.js'
import { createReactionRegistry, type ReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ReactionSetupError } from '../src/reactions/reaction-setup-error.js'
import { backoffDelayS } from '../src/reconcile/backoff-delay.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { clearReactions, reactionRecords, TEST_DISPATCHER_SETTINGS, untilEventsReadable } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'

const SETTINGS = TEST_DISPATCHER_SETTINGS
const HALF = () => 0.5

describe("a reaction handler's timeoutMs", () => {
  const database = useTestDatabase()
  let clock: FakeClock
  let dispatcher: Dispatcher | undefined
  let counter = 0

  beforeEach(() => {
    clock = new FakeClock(Date.now())
  })
  afterEach(async () => {
    await dispatcher?.stop()
    dispatcher = undefined
    await clearReactions(database.db)
  })

  const start = async (reactions: ReactionRegistry) => {
    dispatcher = createDispatcher({
      db: database.db,
      handler: reactions.handler,
      timeoutOf: reactions.timeoutOf,
      streams: reactions,
      clock,
      logger: testLogger(),
      listen: database.listen,
      settings: SETTINGS,
      random: HALF,
    })
    await dispatcher.start()
  }
  const funded = async (reactions: ReactionRegistry) => {
    const orderId = await moveNewOrder(database.db, {
      externalReference: `timeout-${++counter}`,
      statuses: ['funded'],
      handlersFor: reactions.handlersFor,
      now: () => new Date(clock.now()),
    })
    await untilEventsReadable(database.db)
    return orderId
  }
  const jobOf = async (orderId: number, handler: string) =>
    database.db.selectFrom('reactionJobs').select(['state', 'attempts', 'lastError']).where('orderId', '=', orderId).where('handler', '=', handler).executeTakeFirst()
  /** The dispatcher went to sleep: no handler runs, and nothing but the clock wakes it. */
  const idle = () => eventually(() => dispatcher!.running === 0 && clock.pendingSleepers === 2, 'the dispatcher is idle')

  /** A handler that waits `forMs` of the clock, or until its signal aborts (it then throws the signal's reason). */
  const waitingOnSignal = (calls: { attempt: number; signal: AbortSignal }[], forMs: number): ReactionHandler =>
    async (_event, { signal, attempt }) => {
      calls.push({ attempt, signal })
      await clock.sleep(forMs, signal)
    }

  it('aborts the call at timeoutMs, on the first attempt and on a retry, and retries the timed-out attempt', async () => {
    const calls: { attempt: number; signal: AbortSignal }[] = []
    const reactions = createReactionRegistry({ leaseMs: SETTINGS.leaseMs }).on('trade.funded', 'slow', waitingOnSignal(calls, 20_000), { timeoutMs: 2_000 })
    await start(reactions)
    const orderId = await funded(reactions)

    // the stream's first attempt
    await eventually(() => calls.length === 1, 'the first attempt started')
    await clock.advance(1_999)
    expect(calls[0]!.signal.aborted).toBe(false)
    await clock.advance(1)
    await eventually(() => calls[0]!.signal.aborted, 'the first call was aborted at its timeoutMs')
    expect(calls[0]!.signal.reason).toBeInstanceOf(HandlerTimeoutError)
    expect(calls[0]!.signal.reason).toMatchObject({ code: 'reaction_timeout', handler: 'slow', timeoutMs: 2_000 })
    await eventually(async () => (await jobOf(orderId, 'slow'))?.state === 'pending', 'the timed-out attempt is a retry')
    expect(await jobOf(orderId, 'slow')).toEqual({
      state: 'pending',
      attempts: 1,
      lastError: 'HandlerTimeoutError: reaction handler slow timed out after 2000 ms (its timeoutMs): its signal was aborted',
    })

    // the job loop's retry
    await idle()
    await clock.advance(backoffDelayS(1, SETTINGS.backoff, HALF) * 1000)
    await eventually(() => calls.length === 2, 'the retry started')
    expect(calls[1]!.attempt).toBe(2)
    await clock.advance(2_000)
    await eventually(() => calls[1]!.signal.aborted, 'the retry was aborted at its timeoutMs')
    expect(calls[1]!.signal.reason).toBeInstanceOf(HandlerTimeoutError)
    // (the claim counts the attempt and leaves the last error as it was: the outcome is pending again)
    await eventually(async () => {
      const job = await jobOf(orderId, 'slow')
      return job?.attempts === 2 && job.state === 'pending'
    }, 'the second attempt is written')
    expect(await jobOf(orderId, 'slow')).toMatchObject({ state: 'pending', attempts: 2, lastError: expect.stringContaining('timed out after 2000 ms') })
  })

  it('keeps the slot of a call that ignores its signal until it returns, and does not take its late success', async () => {
    let started = 0
    let answer: () => void = () => {}
    const ignoring: ReactionHandler = async () => {
      started += 1
      await new Promise<void>((resolve) => (answer = resolve))
    }
    const reactions = createReactionRegistry().on('trade.funded', 'deaf', ignoring, { timeoutMs: 2_000 })
    await start(reactions)
    const orderId = await funded(reactions)
    await eventually(() => started === 1, 'the call started')
    await clock.advance(2_000)
    // aborted, ignored: still running, in its slot
    expect(dispatcher!.running).toBe(1)
    answer()
    await eventually(async () => (await jobOf(orderId, 'deaf'))?.state === 'pending', 'the late answer is written as the timeout')
    expect(await jobOf(orderId, 'deaf')).toMatchObject({ state: 'pending', attempts: 1, lastError: expect.stringContaining('timed out after 2000 ms') })
    expect(dispatcher!.running).toBe(0)
    // not recorded done either
    expect((await reactionRecords(database.db, 'deaf')).filter((record) => record.state === 'done')).toEqual([])
  })

  it('leaves a call that returns within its timeoutMs alone', async () => {
    const calls: { attempt: number; signal: AbortSignal }[] = []
    const reactions = createReactionRegistry().on('trade.funded', 'quick', waitingOnSignal(calls, 1_000), { timeoutMs: 2_000 })
    await start(reactions)
    const orderId = await funded(reactions)
    await eventually(() => calls.length === 1, 'the call started')
    await clock.advance(1_000)
    await eventually(async () => (await reactionRecords(database.db, 'quick')).some((record) => record.orderId === orderId && record.state === 'done'), 'the call is done')
    await clock.advance(5_000)
    expect(calls[0]!.signal.aborted).toBe(false)
  })
})

describe('the deadlines of a handler', () => {
  it('share one timer, however many calls run', async () => {
    const clock = new FakeClock()
    const timeouts = createCallTimeouts(clock, 'many', 2_000)
    const batch = new AbortController()
    const calls = Array.from({ length: 5 }, () => timeouts.start(batch.signal))
    expect(clock.pendingSleepers).toBe(1)
    await clock.advance(2_000)
    expect(calls.map((call) => call.timedOut)).toEqual([true, true, true, true, true])
    for (const call of calls) call.end()
    expect(clock.pendingSleepers).toBe(0)
  })

  it("follow the batch's signal: a call stopped by the lease or the shutdown did not time out", async () => {
    const clock = new FakeClock()
    const timeouts = createCallTimeouts(clock, 'stopped', 2_000)
    const batch = new AbortController()
    const call = timeouts.start(batch.signal)
    batch.abort(new Error('the service is shutting down'))
    expect(call.signal.aborted).toBe(true)
    await clock.advance(2_000)
    expect(call.timedOut).toBe(false)
    call.end()
  })
})

describe('a timeoutMs the lease cuts off first', () => {
  const slow: ReactionHandler = async () => {}

  it('is refused when the handler is registered, with a code', () => {
    // REACTION_LEASE_S=60: a call still running 5 s before the lease's end is stopped, so 55 s is the longest timeout
    const registry = createReactionRegistry({ leaseMs: 60_000 })
    registry.on('trade.funded', 'longest', slow, { timeoutMs: 55_000 })
    expect(() => registry.on('trade.funded', 'too-long', slow, { timeoutMs: 55_001 })).toThrow(ReactionSetupError)
    expect(() => registry.on('trade.funded', 'lease-long', slow, { timeoutMs: 60_000 })).toThrow(
      'reaction handler lease-long: timeoutMs 60000 must be at most 55000 ms (REACTION_LEASE_S=60 less the 5000 ms before its end at which a running call is stopped): a call is cut off at its lease\'s end first [reaction_timeout_invalid]',
    )
    expect(registry.names).toEqual(['longest'])
    // without a lease to hold it to (a registry of a program's own), a timer's longest wait: past it, Node fires a
    // timer after 1 ms, and every call would have timed out at once
    expect(() => createReactionRegistry().on('trade.funded', 'days', slow, { timeoutMs: 2 ** 31 })).toThrow(
      expect.objectContaining({ code: 'reaction_timeout_invalid', message: expect.stringContaining('at most 2147483647') }),
    )
  })

  it('ends the start of the service: configuredReactions refuses it against REACTION_LEASE_S', () => {
    const config = testConfig({ REACTION_LEASE_S: '300' })
    const register = (reactions: ReactionRegistry) => void reactions.on('trade.funded', 'slow', slow, { timeoutMs: 300_000 })
    expect(() => configuredReactions(config, { logger: testLogger(), register, partnerHandlers: false })).toThrow(
      expect.objectContaining({ code: 'reaction_timeout_invalid', message: expect.stringMatching(/at most 295000 ms .*\[reaction_timeout_invalid\]$/) }),
    )
  })
})
