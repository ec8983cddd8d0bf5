// A handler's system coming back pulls its waiting retries forward (src/reactions/recovery-watch.ts): jobs that
// backed off while the forwarder's receiver or the RabbitMQ broker was away are run within moments of its first
// success after the outage, not after their backoff (up to an hour). Over the real database and a real receiver
// or broker; the dispatcher's clock is fake, so a backoff passes only when the test moves it, and every "before
// its backoff" below is exact: the clock has not moved since the receiver came back.
import { randomBytes } from 'node:crypto'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createMetrics } from '../src/metrics/metrics.js'
import { reactionChannel } from '../src/db/reaction-channel.js'
import { createAmqpPublisher } from '../src/reactions/amqp-publisher.js'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import type { DispatcherSettings } from '../src/reactions/dispatcher-settings.js'
import { createForwarder } from '../src/reactions/forwarder.js'
import type { ReactionHandler } from '../src/reactions/reaction-event.js'
import { pullForwardJobs } from '../src/reactions/reaction-job.repository.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { OUTAGE_MS, PULL_FORWARD_INTERVAL_MS } from '../src/reactions/recovery-watch.js'
import { backoffDelayS } from '../src/reconcile/backoff-delay.js'
import { amqpUrl, describeRabbitMq, startConsumer, uniqueName } from './helpers/amqp-broker.js'
import { FakeClock } from './helpers/fake-clock.js'
import { startForwardReceiver, type ForwardReceiver, type ReceiverAnswer } from './helpers/forward-receiver.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { clearReactions, TEST_DISPATCHER_SETTINGS, untilEventsReadable, writeJobRows } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { useTestDatabase } from './helpers/test-database.js'

const SECRET = `whsec_${randomBytes(32).toString('base64')}`
const logger = testLogger([SECRET.slice('whsec_'.length)])
// enough attempts for the backoff to grow: 7.5 s, 15 s, 30 s, 60 s ... (base 10 s, the jitter's half)
const SETTINGS: DispatcherSettings = { ...TEST_DISPATCHER_SETTINGS, maxAttempts: 10 }
const HALF = () => 0.5
const backoffMs = (attempt: number) => backoffDelayS(attempt, SETTINGS.backoff, HALF) * 1000

describe('pulling a handler’s retries forward once its system is back', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  let dispatcher: Dispatcher | undefined
  const cleanups: (() => Promise<unknown>)[] = []
  let counter = 0

  beforeEach(() => {
    clock = new FakeClock(Date.now())
  })
  afterEach(async () => {
    await dispatcher?.stop()
    dispatcher = undefined
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
    await clearReactions(database.db)
  })

  /** A dispatcher running `handler` as `name` for every type, its pulled-forward jobs counted by the service's metrics. */
  const start = async (name: string, handler: ReactionHandler) => {
    const reactions = createReactionRegistry().on('trade.*', name, handler)
    const metrics = createMetrics({}, { defaultMetrics: false })
    dispatcher = createDispatcher({
      db: database.db,
      handler: reactions.handler,
      streams: reactions,
      clock,
      logger,
      listen: database.listen,
      settings: SETTINGS,
      random: HALF,
      ...metrics.reactionHooks(reactions.names),
    })
    await dispatcher.start()
    const pulledForward = async () => {
      const sample = (await metrics.registry.getSingleMetric('reaction_jobs_pulled_forward_total')!.get()).values.find(
        (value) => value.labels.handler === name,
      )
      return sample?.value
    }
    return { reactions, pulledForward }
  }

  /** A new order moved through `statuses` now (its events readable by the stream); its id. */
  const order = async (reactions: { handlersFor(type: string): readonly string[] }, reference: string, statuses = ['created', 'funded']) => {
    const orderId = await moveNewOrder(database.db, { externalReference: reference, statuses, handlersFor: reactions.handlersFor, now: () => new Date(clock.now()) })
    await untilEventsReadable(database.db)
    return orderId
  }

  /** The order's job rows, by sequence (an event done on its first attempt has none). */
  const jobs = async (orderId: number) =>
    (
      await database.db
        .selectFrom('reactionJobs')
        .select(['sequence', 'state', 'attempts', 'runAt', 'lastError'])
        .where('orderId', '=', orderId)
        .orderBy('sequence')
        .execute()
    ).map((job) => ({ ...job, runAt: new Date(job.runAt).getTime() }))

  /** The job loop and the one stream are asleep (a timer each) and no handler runs: only the clock moves them on. */
  const idle = () => eventually(() => dispatcher!.running === 0 && clock.pendingSleepers === 2, 'the dispatcher is idle')

  /** Moves the clock by `ms` once the dispatcher is idle, and waits until `orderIds`' first jobs have failed `attempts` times. */
  const failAgain = async (orderIds: readonly number[], ms: number, attempts: number) => {
    await idle()
    await clock.advance(ms)
    await eventually(
      async () => (await Promise.all(orderIds.map(jobs))).every(([first]) => first?.state === 'pending' && first.attempts === attempts),
      `the retries failed ${attempts} times`,
    )
  }

  /** A receiver answering each event by its order's external reference. */
  const receiver = async (answer: (reference: string) => ReceiverAnswer) => {
    const started = await startForwardReceiver((request) => answer((JSON.parse(request.rawBody) as { data: { external_reference: string } }).data.external_reference))
    cleanups.push(() => started.close())
    return started
  }

  /** The sequences of the order's events in the order the receiver got them, every attempt included. */
  const arrivals = (target: ForwardReceiver, reference: string) =>
    target.received
      .map((request) => JSON.parse(request.rawBody) as { data: { external_reference: string; sequence: number } })
      .filter(({ data }) => data.external_reference === reference)
      .map(({ data }) => data.sequence)

  it('runs the jobs that backed off while the receiver answered 503 at its first 2xx, long before their backoff, each order in sequence; a job asked to wait, one refused and one failed stay as they were', async () => {
    const prefix = `back-${++counter}`
    const late = [1, 2, 3].map((n) => `${prefix}-late-${n}`)
    const askedToWait = `${prefix}-asked`
    const refused = `${prefix}-refused`
    const gone = `${prefix}-gone`
    let down = true
    const target = await receiver((reference) => {
      if (reference === gone) return 410
      // this event's own trouble, whether the receiver is up or not
      if (reference === refused) return 500
      if (!down) return 204
      return reference === askedToWait ? { status: 503, headers: { 'retry-after': '600' } } : 503
    })
    const { reactions, pulledForward } = await start('forwarder', createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000, clock }))
    const failedAt = clock.now()
    const lateIds: number[] = []
    for (const reference of late) lateIds.push(await order(reactions, reference))
    const askedId = await order(reactions, askedToWait)
    const refusedId = await order(reactions, refused)
    const goneId = await order(reactions, gone)
    const retried = [...lateIds, refusedId]

    // the first attempts (the stream's) are answered 503, the 410 fails its job at once; each second event waits behind its first
    await eventually(async () => (await jobs(goneId))[0]?.state === 'failed' && (await jobs(askedId)).length === 2, 'the first attempts failed')
    await eventually(async () => (await Promise.all(retried.map(jobs))).every((rows) => rows.length === 2 && rows[0]!.attempts === 1), 'every order has its jobs')
    expect((await jobs(askedId))[0]).toMatchObject({ state: 'pending', attempts: 1, runAt: failedAt + 600_000 })
    // the receiver stays away: the retries fail and back off further, 7.5 s, 15 s, then 30 s later
    await failAgain(retried, backoffMs(1), 2)
    await failAgain(retried, backoffMs(2), 3)
    await failAgain(retried, backoffMs(3), 4)
    const recoveredAt = clock.now()
    for (const orderId of retried) {
      expect(await jobs(orderId)).toMatchObject([
        { sequence: 1, state: 'pending', attempts: 4, runAt: recoveredAt + backoffMs(4) },
        { sequence: 2, state: 'pending', attempts: 0 },
      ])
    }
    expect(await pulledForward()).toBe(0)

    // back: a new event is forwarded, and with it the jobs that failed for the receiver's absence run at once
    down = false
    await idle()
    const fresh = `${prefix}-fresh`
    await order(reactions, fresh, ['created'])
    const allDone = async () => (await Promise.all(lateIds.map(jobs))).flat().every((job) => job.state === 'done')
    await eventually(allDone, 'the waiting jobs and the events behind them are done')
    expect(clock.now()).toBe(recoveredAt)
    for (const orderId of lateIds) expect((await jobs(orderId)).map((job) => [job.state, job.attempts])).toEqual([['done', 5], ['done', 1]])
    // each order's second event was sent only after its first got its 2xx
    for (const reference of late) expect(arrivals(target, reference)).toEqual([1, 1, 1, 1, 1, 2])
    expect(arrivals(target, fresh)).toEqual([1])
    // the receiver asked for 600 s: its job waits them out; the event refused on its own waits out its backoff
    await idle()
    expect(await jobs(askedId)).toMatchObject([
      { sequence: 1, state: 'pending', attempts: 1, runAt: failedAt + 600_000 },
      { sequence: 2, state: 'pending', attempts: 0 },
    ])
    expect(arrivals(target, askedToWait)).toEqual([1])
    expect((await jobs(refusedId))[0]).toMatchObject({ state: 'pending', attempts: 4, runAt: recoveredAt + backoffMs(4) })
    expect(arrivals(target, refused)).toEqual([1, 1, 1, 1])

    // the dead letter is the operator's: still failed, its order's next event still held back and never sent
    await idle()
    expect(await jobs(goneId)).toMatchObject([
      { sequence: 1, state: 'failed', attempts: 1 },
      { sequence: 2, state: 'pending', attempts: 0 },
    ])
    expect(arrivals(target, gone)).toEqual([1])
    expect(await pulledForward()).toBe(late.length)
    const logged = logEntries().filter((entry) => entry.msg === 'reaction handler succeeds again after failing: its waiting retries are due now')
    expect(logged.at(-1)).toMatchObject({ level: 30, handler: 'forwarder', jobs: late.length, failedForS: Math.round((recoveredAt - failedAt) / 1000) })
  })

  it(`leaves the retries to their backoff after a success sooner than ${OUTAGE_MS} ms into the failures, pulls them forward after one later, and not again within ${PULL_FORWARD_INTERVAL_MS} ms`, async () => {
    const prefix = `flap-${++counter}`
    let down = true
    const target = await receiver(() => (down ? 503 : 204))
    const { reactions, pulledForward } = await start('forwarder', createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000, clock }))
    const firstFailedAt = clock.now()
    const first = [await order(reactions, `${prefix}-1a`, ['created']), await order(reactions, `${prefix}-1b`, ['created'])]
    await eventually(async () => (await Promise.all(first.map(jobs))).every(([job]) => job?.attempts === 1), 'the first calls failed')

    // a 2xx just before OUTAGE_MS: failures among successes, not an outage that ended
    await idle()
    await clock.advance(OUTAGE_MS - 1)
    down = false
    await order(reactions, `${prefix}-ok`, ['created'])
    await eventually(() => arrivals(target, `${prefix}-ok`).length === 1, 'the 2xx came')
    await idle()
    for (const orderId of first) expect(await jobs(orderId)).toMatchObject([{ state: 'pending', attempts: 1, runAt: firstFailedAt + backoffMs(1) }])

    // failing again, now for OUTAGE_MS: the first jobs' retries fail too, and the next 2xx brings all three forward
    down = true
    const secondFailedAt = clock.now()
    const second = await order(reactions, `${prefix}-2`, ['created'])
    await eventually(async () => (await jobs(second))[0]?.attempts === 1, 'the second call failed')
    await failAgain(first, OUTAGE_MS, 2)
    const recoveredAt = clock.now()
    expect((await jobs(second))[0]!.runAt).toBe(secondFailedAt + backoffMs(1))
    for (const orderId of first) expect((await jobs(orderId))[0]!.runAt).toBe(recoveredAt + backoffMs(2))
    down = false
    await idle()
    await order(reactions, `${prefix}-ok-again`, ['created'])
    await eventually(async () => (await Promise.all([...first, second].map(jobs))).flat().every((job) => job.state === 'done'), 'the three jobs are done')
    expect(clock.now()).toBe(recoveredAt)
    expect(await pulledForward()).toBe(3)

    // away again for OUTAGE_MS and back, within PULL_FORWARD_INTERVAL_MS of that pull: the new retries keep their backoff
    down = true
    await idle()
    const thirdFailedAt = clock.now()
    const third = [await order(reactions, `${prefix}-3a`, ['created']), await order(reactions, `${prefix}-3b`, ['created'])]
    await eventually(async () => (await Promise.all(third.map(jobs))).every(([job]) => job?.attempts === 1), 'the third calls failed')
    await idle()
    await clock.advance(OUTAGE_MS)
    down = false
    await order(reactions, `${prefix}-ok-third`, ['created'])
    await eventually(() => arrivals(target, `${prefix}-ok-third`).length === 1, 'the third 2xx came')
    await idle()
    for (const orderId of third) expect(await jobs(orderId)).toMatchObject([{ state: 'pending', attempts: 1, runAt: thirdFailedAt + backoffMs(1) }])
    expect(await pulledForward()).toBe(3)
  })

  it('leaves to their backoff the events the receiver refuses on their own, however long the receiver idles between them and a 2xx', async () => {
    const prefix = `poison-${++counter}`
    const poisoned = [`${prefix}-a`, `${prefix}-b`]
    // a 500 for these two orders' events (their own trouble) and a 2xx for every other
    const target = await receiver((reference) => (poisoned.includes(reference) ? 500 : 204))
    const { reactions, pulledForward } = await start('forwarder', createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000, clock }))
    const failedAt = clock.now()
    const ids = [await order(reactions, poisoned[0]!, ['created']), await order(reactions, poisoned[1]!, ['created'])]
    await eventually(async () => (await Promise.all(ids.map(jobs))).every(([job]) => job?.attempts === 1), 'the first calls failed')
    await idle()
    // longer than OUTAGE_MS with nothing but those failures, before the retries are due
    await clock.advance(backoffMs(1) - 1)
    await order(reactions, `${prefix}-ok`, ['created'])
    await eventually(() => arrivals(target, `${prefix}-ok`).length === 1, 'the 2xx came')
    await idle()
    for (const orderId of ids) expect(await jobs(orderId)).toMatchObject([{ state: 'pending', attempts: 1, runAt: failedAt + backoffMs(1) }])
    for (const reference of poisoned) expect(arrivals(target, reference)).toEqual([1])
    expect(await pulledForward()).toBe(0)
  })

  it('leaves to their wait the events a receiver limiting its rate asked to wait (429 with Retry-After), and one order’s 503s alone', async () => {
    const prefix = `limit-${++counter}`
    const limited = [1, 2, 3].map((n) => `${prefix}-limited-${n}`)
    const lonely = `${prefix}-lonely`
    const target = await receiver((reference) => {
      if (limited.includes(reference)) return { status: 429, headers: { 'retry-after': '120' } }
      return reference === lonely ? 503 : 204
    })
    const { reactions, pulledForward } = await start('forwarder', createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000, clock }))
    const failedAt = clock.now()
    const limitedIds: number[] = []
    for (const reference of limited) limitedIds.push(await order(reactions, reference, ['created']))
    const lonelyId = await order(reactions, lonely, ['created'])
    await eventually(async () => (await Promise.all([...limitedIds, lonelyId].map(jobs))).every(([job]) => job?.attempts === 1), 'the first calls failed')
    await idle()
    await clock.advance(OUTAGE_MS + 1)
    await order(reactions, `${prefix}-let-through`, ['created'])
    await eventually(() => arrivals(target, `${prefix}-let-through`).length === 1, 'one call was let through')
    await idle()
    for (const orderId of limitedIds) expect(await jobs(orderId)).toMatchObject([{ state: 'pending', attempts: 1, runAt: failedAt + 120_000 }])
    expect(await jobs(lonelyId)).toMatchObject([{ state: 'pending', attempts: 1, runAt: failedAt + backoffMs(1) }])
    expect(await pulledForward()).toBe(0)
  })

  it('leaves to their wait the retries a receiver coming back answered 429 with Retry-After, though they failed in an outage before', async () => {
    const prefix = `back-limited-${++counter}`
    const references = [1, 2, 3].map((n) => `${prefix}-${n}`)
    let answer: ReceiverAnswer = 503
    const target = await receiver(() => answer)
    const { reactions, pulledForward } = await start('forwarder', createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000, clock }))
    const failedAt = clock.now()
    const ids: number[] = []
    for (const reference of references) ids.push(await order(reactions, reference, ['created']))
    await eventually(async () => (await Promise.all(ids.map(jobs))).every(([job]) => job?.attempts === 1), 'the first calls failed (away)')
    // past OUTAGE_MS, the receiver answers, but asks for 120 s: each retry gets its 429
    answer = { status: 429, headers: { 'retry-after': '120' } }
    await failAgain(ids, backoffMs(1), 2)
    const limitedAt = clock.now()
    // an outage as the watch counts one: only away failures, of several orders, for longer than OUTAGE_MS
    expect(limitedAt - failedAt).toBeGreaterThan(OUTAGE_MS)
    // then a call gets through: the outage is over, and the events whose last answer asked for a wait keep it
    answer = 204
    await order(reactions, `${prefix}-through`, ['created'])
    await eventually(() => arrivals(target, `${prefix}-through`).length === 1, 'one call got through')
    await idle()
    for (const orderId of ids) expect(await jobs(orderId)).toMatchObject([{ state: 'pending', attempts: 2, runAt: limitedAt + 120_000 }])
    for (const reference of references) expect(arrivals(target, reference)).toEqual([1, 1])
    expect(await pulledForward()).toBe(0)
  })

  it('moves only the handler’s pending jobs still waiting whose events failed in the outage, once, however many replicas pull at once, and wakes every dispatcher', async () => {
    const reactions = createReactionRegistry()
      .on('trade.*', 'forwarder', async () => {})
      .on('trade.*', 'amqp', async () => {})
    const now = new Date(clock.now())
    const later = new Date(clock.now() + 3_600_000)
    const orderIds: number[] = []
    for (let n = 1; n <= 7; n += 1) orderIds.push(await order(reactions, `rows-${++counter}`, ['created']))
    await writeJobRows(database.db, reactions, now)
    const set = (orderId: number, values: { state: string; runAt: Date; leaseToken?: string }) =>
      database.db.updateTable('reactionJobs').set(values).where('orderId', '=', orderId).where('handler', '=', 'forwarder').execute()
    const [waiting, alsoWaiting, due, running, failed, done, notInOutage] = orderIds as [number, number, number, number, number, number, number]
    await set(waiting, { state: 'pending', runAt: later })
    await set(alsoWaiting, { state: 'pending', runAt: later })
    await set(running, { state: 'running', runAt: later, leaseToken: 'another-replica' })
    await set(failed, { state: 'failed', runAt: later })
    await set(done, { state: 'done', runAt: later })
    await set(notInOutage, { state: 'pending', runAt: later })
    // the events that failed in the outage: every order's but the last
    const eventIds = (
      await database.db.selectFrom('reactionJobs').select('eventId').where('handler', '=', 'forwarder').where('orderId', '!=', notInOutage).execute()
    ).map((job) => job.eventId)
    await database.db.updateTable('reactionJobs').set({ runAt: later }).where('handler', '=', 'amqp').execute()
    let woken = 0
    const unlisten = await database.listen(await reactionChannel(database.db), () => {
      woken += 1
    })
    cleanups.push(unlisten)

    // two replicas at once (two connections on Postgres): each job is moved by one of them
    const other = database.kind === 'postgres' ? database.openAnother() : database
    if (other !== database) cleanups.push(() => other.close())
    const moved = await Promise.all([database.db, other.db].map((db) => pullForwardJobs(db, { handler: 'forwarder', eventIds, now })))
    expect(moved[0]! + moved[1]!).toBe(2)
    const runAt = async (orderId: number, handler = 'forwarder') =>
      new Date(
        (await database.db.selectFrom('reactionJobs').select('runAt').where('orderId', '=', orderId).where('handler', '=', handler).executeTakeFirstOrThrow()).runAt,
      ).getTime()
    expect(await runAt(waiting)).toBe(now.getTime())
    expect(await runAt(alsoWaiting)).toBe(now.getTime())
    expect(await runAt(due)).toBe(now.getTime())
    // a running job's run_at is its lease's end, a failed or done one is not the dispatcher's, another handler's not this one's
    // a job whose event did not fail in the outage is not pulled forward either
    for (const orderId of [running, failed, done, notInOutage]) expect(await runAt(orderId)).toBe(later.getTime())
    expect(await runAt(waiting, 'amqp')).toBe(later.getTime())
    await eventually(() => woken > 0, 'the dispatchers are notified')
    expect(await pullForwardJobs(database.db, { handler: 'forwarder', eventIds, now })).toBe(0)
  })

  describeRabbitMq('with the RabbitMQ publisher (RabbitMQ)', () => {
    it('publishes the jobs that backed off while the broker was cut off as soon as a publish is confirmed again, each order in sequence', async () => {
      const exchange = uniqueName('test-exchange')
      const consumer = await startConsumer({ exchange })
      cleanups.push(() => consumer.close())
      const broker = new URL(amqpUrl!)
      const gate = await startTcpProxy({ host: broker.hostname, port: Number(broker.port || 5672) })
      cleanups.push(() => gate.close())
      // (its timeout is on the real clock: a bound on a hang, so that a slow confirm on a loaded machine fails no publish)
      const publisher = createAmqpPublisher({ url: gate.rewrite(amqpUrl!), exchange, logger, timeoutMs: 60_000 })
      cleanups.push(() => publisher.close())
      const { reactions, pulledForward } = await start('amqp', publisher.handler)
      const prefix = `broker-${++counter}`
      const received = (reference: string) =>
        consumer.received
          .map((message) => JSON.parse(message.body) as { data: { external_reference: string; sequence: number } })
          .filter(({ data }) => data.external_reference === reference)
          .map(({ data }) => data.sequence)

      // connected (its publish confirmed: no job left), then cut off: the open connection dropped and new ones refused
      const before = await order(reactions, `${prefix}-before`, ['created'])
      await consumer.waitFor(() => received(`${prefix}-before`).length === 1)
      await idle()
      expect(await jobs(before)).toEqual([])
      gate.cut()
      const late = [1, 2, 3].map((n) => `${prefix}-late-${n}`)
      const lateIds: number[] = []
      for (const reference of late) lateIds.push(await order(reactions, reference))
      await eventually(async () => (await Promise.all(lateIds.map(jobs))).every((rows) => rows.length === 2 && rows[0]!.attempts === 1), 'the first publishes failed')
      expect((await jobs(lateIds[0]!))[0]!.lastError).toMatch(/^AmqpPublishError: /)
      await failAgain(lateIds, backoffMs(1), 2)
      await failAgain(lateIds, backoffMs(2), 3)
      const restoredAt = clock.now()
      for (const orderId of lateIds) expect((await jobs(orderId))[0]).toMatchObject({ state: 'pending', runAt: restoredAt + backoffMs(3) })

      // the broker reachable again: the next event's publish is confirmed, and the waiting jobs follow at once
      gate.restore()
      await idle()
      await order(reactions, `${prefix}-after`, ['created'])
      await eventually(async () => (await Promise.all(lateIds.map(jobs))).flat().every((job) => job.state === 'done'), 'the waiting jobs are published')
      expect(clock.now()).toBe(restoredAt)
      await consumer.waitFor(() => late.every((reference) => received(reference).length === 2))
      for (const reference of late) expect(received(reference)).toEqual([1, 2])
      expect(await pulledForward()).toBe(late.length)
    })
  })
})
