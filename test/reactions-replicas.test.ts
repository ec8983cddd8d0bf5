// Two replicas dispatching one stream of transitions (Postgres): 10,000 transitions over 500 orders, one
// handler that sometimes throws (and, for a few events, always does) and one that records. Every (event,
// handler) must end done or failed, no job may run twice at once, and each order's events must reach each
// handler in sequence order.
import { createHash } from 'node:crypto'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import type { DatabaseHandle } from '../src/db/open-database.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { createOrder } from './helpers/orders.js'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import type { ReactionEvent } from '../src/reactions/reaction-event.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { reactionJobStats } from '../src/reactions/reaction-job.repository.js'
import { testLogger } from './helpers/log-sink.js'
import { eventually } from './helpers/reconcile-poller.js'
import { reactionRecords } from './helpers/reaction-jobs.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const ORDERS = 500
const STATUSES = ['created', 'funded', 'delivered', ...Array.from({ length: 17 }, (_, i) => `step_${i + 4}`)]
const MAX_ATTEMPTS = 3
// the events whose 'flaky' job always throws: the last event of every 50th order (nothing waits behind it)
const alwaysFails = (event: ReactionEvent, orderIndex: number) => orderIndex % 50 === 0 && event.sequence === STATUSES.length
const hash = (text: string) => createHash('sha1').update(text).digest().readUInt32BE(0)

describePostgres('two replicas dispatching 10,000 transitions (Postgres)', () => {
  let database: TestDatabase
  const replicas: DatabaseHandle[] = []
  const dispatchers: Dispatcher[] = []
  const orderIndex = new Map<number, number>()

  const active = new Map<string, number>()
  const overlaps: string[] = []
  const outOfOrder: string[] = []
  // per (order, handler): the last sequence a call of it succeeded on
  const lastSucceeded = new Map<string, number>()
  const recorded = new Map<number, string[]>()
  const calls = { flaky: 0, recorder: 0, thrown: 0 }
  const byReplica = new Map<string, number>()

  beforeAll(async () => {
    database = await createTestDatabase({ poolSize: 8 })
  })
  afterAll(async () => {
    await Promise.all(dispatchers.map((dispatcher) => dispatcher.stop()))
    await Promise.all(replicas.map((replica) => replica.close()))
    await database.close()
  })

  it('ends every (event, handler) done or failed, never runs a job twice at once, and keeps each order in sequence', async () => {
    const handlerFor = (replica: string, name: 'flaky' | 'recorder') => async (event: ReactionEvent, { attempt }: { attempt: number }) => {
      const key = `${event.eventId}/${name}`
      const entries = (active.get(key) ?? 0) + 1
      active.set(key, entries)
      if (entries > 1) overlaps.push(key)
      byReplica.set(replica, (byReplica.get(replica) ?? 0) + 1)
      calls[name] += 1
      try {
        // a little real concurrency: the handler yields, sometimes for a few milliseconds
        await new Promise((resolve) => setTimeout(resolve, hash(key) % 3))
        if (name === 'flaky') {
          const throws = alwaysFails(event, orderIndex.get(event.orderId)!) || (attempt === 1 && hash(key) % 4 === 0)
          if (throws) {
            calls.thrown += 1
            throw new Error(`flaky on attempt ${attempt}`)
          }
        } else {
          recorded.set(event.orderId, [...(recorded.get(event.orderId) ?? []), `${event.sequence}:${event.eventId}`])
        }
        const orderKey = `${event.orderId}/${name}`
        const previous = lastSucceeded.get(orderKey) ?? 0
        if (event.sequence !== previous + 1) outOfOrder.push(`${orderKey}: ${previous} then ${event.sequence}`)
        lastSucceeded.set(orderKey, event.sequence)
      } finally {
        active.set(key, active.get(key)! - 1)
      }
    }
    const registryOf = (replica: string) =>
      createReactionRegistry().on('trade.*', 'flaky', handlerFor(replica, 'flaky')).on('trade.*', 'recorder', handlerFor(replica, 'recorder'))
    const routing = registryOf('routing')

    const orderIds: number[] = []
    for (let i = 0; i < ORDERS; i++) {
      const { order } = await createOrder(database.db, { externalReference: `replicas-${i}` })
      orderIndex.set(order.id, i)
      orderIds.push(order.id)
    }

    for (const name of ['replica-a', 'replica-b']) {
      const handle = database.openAnother()
      replicas.push(handle)
      const reactions = registryOf(name)
      const dispatcher = createDispatcher({
        db: handle.db,
        handler: reactions.handler,
        streams: reactions,
        clock: systemClock,
        logger: testLogger(),
        listen: handle.listen,
        settings: {
          concurrency: 8,
          maxAttempts: MAX_ATTEMPTS,
          leaseMs: 120_000,
          backoff: { baseS: 0.01, capS: 0.05 },
          safetyIntervalMs: 2_000,
          shutdownTimeoutMs: 5_000,
        },
      })
      await dispatcher.start()
      dispatchers.push(dispatcher)
    }

    const startedAt = Date.now()
    // round by round, every order takes its next status; 16 statements at a time
    for (const status of STATUSES) {
      let next = 0
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          while (next < orderIds.length) {
            const orderId = orderIds[next++]!
            const result = await applyObservation(
              database.db,
              { target: { orderId }, tradeId: `trd_${orderId}`, status, source: 'api', observedAt: new Date() },
              { staleAfterS: 3_600, handlersFor: routing.handlersFor },
            )
            expect(result.outcome).toBe('applied')
          }
        }),
      )
    }
    const committedAt = Date.now()
    // jobs to run, and events the streams have not taken yet, from one snapshot (read in two statements, a
    // stream's write-back committed between them counted its events in neither, and the wait ended early)
    const unfinished = async () => {
      const stats = await reactionJobStats(database.db, new Date())
      return stats.pending + stats.running
    }
    await eventually(async () => (await unfinished()) === 0, 'every job finished', 600_000)
    const finishedAt = Date.now()

    // every (event, handler): its job row, or its stream batch's record of a first attempt that succeeded
    const counted = new Map<string, number>()
    for (const { handler, state } of await reactionRecords(database.db)) counted.set(`${handler} ${state}`, (counted.get(`${handler} ${state}`) ?? 0) + 1)
    const states = [...counted].sort(([a], [b]) => a.localeCompare(b)).map(([key, n]) => ({ handler: key.split(' ')[0]!, state: key.split(' ')[1]!, n }))
    const transitions = ORDERS * STATUSES.length
    const failedOrders = Math.ceil(ORDERS / 50)
    expect(states.map((row) => [row.handler, row.state, Number(row.n)])).toEqual([
      ['flaky', 'done', transitions - failedOrders],
      ['flaky', 'failed', failedOrders],
      ['recorder', 'done', transitions],
    ])
    expect(overlaps).toEqual([])
    expect(outOfOrder).toEqual([])
    // the recorder saw every event of every order, in order (a repeat, at least once, would be allowed)
    for (const orderId of orderIds) {
      const sequences = [...new Set(recorded.get(orderId))].map((entry) => Number(entry.split(':')[0]))
      expect(sequences).toEqual(STATUSES.map((_, i) => i + 1))
    }
    expect(byReplica.get('replica-a')).toBeGreaterThan(0)
    expect(byReplica.get('replica-b')).toBeGreaterThan(0)
    console.warn(
      `reactions, two replicas: ${transitions} transitions over ${ORDERS} orders committed in ${committedAt - startedAt} ms; ` +
        `${2 * transitions} jobs finished ${finishedAt - startedAt} ms after the first commit ` +
        `(${Math.round((2 * transitions) / ((finishedAt - startedAt) / 1000))} jobs/s); handler calls ${calls.flaky + calls.recorder} ` +
        `(flaky ${calls.flaky}, of which threw ${calls.thrown}; recorder ${calls.recorder}); ` +
        `by replica a ${byReplica.get('replica-a')}, b ${byReplica.get('replica-b')}`,
    )
  })
})
