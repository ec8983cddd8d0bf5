// A stream batch whose handlers still run reads on (read-ahead): gatherMs after its last read, once its queue of
// orders runs short, it reads the events committed since and runs them in the same batch, so they wait for
// the queue and not for the batch's last handler. One order's events still run one after another, and
// behind a failure they wait as job rows. It reads ahead for WRITE_BACK_MS after the batch's first read at
// most, and never under another replica's lease. Time is a fake clock.
import { afterEach, describe, expect, it } from 'vitest'
import { createSlots } from '../src/reactions/handler-slots.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import type { ReactionHandler } from '../src/reactions/reaction-event.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { gatherMs, WRITE_BACK_MS } from '../src/reactions/stream-worker.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries } from './helpers/log-sink.js'
import { processWarningsDuring } from './helpers/process-warnings.js'
import { moveNewOrder } from './helpers/orders.js'
import { clearReactions, reactionRecords, TEST_DISPATCHER_SETTINGS, testStreamWorker, untilEventsReadable } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { useTestDatabase } from './helpers/test-database.js'

const SETTINGS = TEST_DISPATCHER_SETTINGS

describe('the read-ahead of a reaction stream batch', () => {
  const database = useTestDatabase()
  let counter = 0

  afterEach(async () => {
    await clearReactions(database.db)
  })

  const setUp = async () => {
    const clock = new FakeClock(Date.now())
    // what the handler saw, in order: `start <id>` and `end <id>`; a call whose event id is in `gates` waits
    // until the test opens its gate; trade.funded throws
    const seen: string[] = []
    const waiting = new Map<string, Promise<void>>()
    const handler: ReactionHandler = async (event) => {
      seen.push(`start ${event.eventId}`)
      await waiting.get(event.eventId)
      seen.push(`end ${event.eventId}`)
      if (event.type === 'trade.funded') throw new Error('the partner system is down')
    }
    /** The next call for `eventId` waits until the function returned is called. */
    const gate = (eventId: string) => {
      let open = () => {}
      waiting.set(eventId, new Promise<void>((resolve) => (open = resolve)))
      return () => open()
    }
    const reactions = createReactionRegistry().on('trade.*', 'ledger', handler)
    await ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))
    const worker = (leaseToken: string, workerClock = clock) =>
      testStreamWorker(database.db, { name: 'ledger', handler, clock: workerClock, leaseToken, settings: SETTINGS })
    const history = async (orderId: number) => {
      await untilEventsReadable(database.db)
      const rows = await database.db.selectFrom('orderStatusHistory').select('eventId').where('orderId', '=', orderId).orderBy('id').execute()
      return rows.map((row) => row.eventId)
    }
    /** One new order moved through `statuses`: its id and its events' ids, in order. */
    const order = async (statuses: string[]) => {
      const externalReference = `read-ahead-${++counter}`
      const orderId = await moveNewOrder(database.db, {
        externalReference,
        statuses,
        handlersFor: reactions.handlersFor,
        now: () => new Date(clock.now()),
      })
      return { orderId, externalReference, events: await history(orderId) }
    }
    /** Moves an order on to `status`: the new event's id. */
    const move = async ({ orderId, externalReference }: { orderId: number; externalReference: string }, status: string) => {
      const result = await applyObservation(
        database.db,
        { target: { orderId }, tradeId: `trd_${externalReference}`, status, source: 'api', observedAt: new Date(clock.now()) },
        { staleAfterS: 3_600, handlersFor: reactions.handlersFor },
      )
      expect(result.outcome).toBe('applied')
      return (await history(orderId)).at(-1)!
    }
    const stop = new AbortController()
    /** lease-a's batch, running one new order's event whose call waits until `open` is called. */
    const slowBatch = async () => {
      const stream = worker('lease-a')
      const slow = await order(['created'])
      const open = gate(slow.events[0]!)
      const batch = stream.batch(stop.signal)
      await eventually(() => seen.length === 1, 'the slow handler started')
      return { stream, slow, open, batch }
    }
    return { clock, seen, gate, worker, order, move, slowBatch, stop: stop.signal }
  }

  /** Each event's record for the handler: its state, by event id. */
  const states = async () => new Map((await reactionRecords(database.db, 'ledger')).map((record) => [record.eventId, record.state]))

  it('lets more than ten of its orders wait for slots held elsewhere without a listener warning', async () => {
    // every slot taken by the job loop's retries (a receiver slow again after an outage): each lane of the batch
    // waits for one under the batch's one hand-off signal, up to REACTION_CONCURRENCY listeners, past Node's
    // default of 10 (an outside attack saw "Possible EventTarget memory leak detected" in the service's log)
    const { clock, seen, order, stop } = await setUp()
    const concurrency = 12
    const slots = createSlots(concurrency)
    for (let i = 0; i < concurrency; i++) expect(slots.tryTake()).toBe(true)
    let waits = 0
    const whenFree = slots.whenFree
    slots.whenFree = (signal) => {
      waits += 1
      return whenFree(signal)
    }
    const events: string[] = []
    for (let i = 0; i < concurrency; i++) events.push(...(await order(['created'])).events)
    const warnings = await processWarningsDuring(async () => {
      const stream = testStreamWorker(database.db, {
        name: 'ledger',
        handler: async (event) => void seen.push(event.eventId),
        clock,
        leaseToken: 'lease-a',
        settings: { ...SETTINGS, concurrency },
        slots,
      })
      const batch = stream.batch(stop)
      await eventually(() => waits === concurrency, 'every lane waits for a slot')
      expect(seen).toEqual([])
      for (let i = 0; i < concurrency; i++) slots.give()
      expect(await batch).toMatchObject({ read: concurrency })
    })
    expect(seen.sort()).toEqual(events.sort())
    expect(warnings.filter((warning) => warning.startsWith('MaxListenersExceededWarning'))).toEqual([])
  })

  it('reads the events committed while its handlers run, and runs them before the slow one returns', async () => {
    const { clock, seen, order, slowBatch, stop } = await setUp()
    const { stream, slow, open, batch } = await slowBatch()

    const fast = await order(['created'])
    // (not before the read's gather wait)
    await clock.advance(Math.ceil(gatherMs(1)))
    await eventually(() => seen.includes(`end ${fast.events[0]}`), 'the event read ahead ran')
    expect(seen).toEqual([`start ${slow.events[0]}`, `start ${fast.events[0]}`, `end ${fast.events[0]}`])

    open()
    expect(await batch).toMatchObject({ read: 2, full: false })
    // one batch: the next read finds nothing, and writes back the record of both
    expect(await stream.batch(stop)).toMatchObject({ read: 0 })
    expect(await states()).toEqual(
      new Map([
        [slow.events[0], 'done'],
        [fast.events[0], 'done'],
      ]),
    )
  })

  it('runs an order event read ahead after the one before it, and not at all behind its failure', async () => {
    const { clock, seen, gate, worker, order, move, stop } = await setUp()
    const stream = worker('lease-a')
    const first = await order(['created'])
    const second = await order(['created'])
    const openFirst = gate(first.events[0]!)
    const openSecond = gate(second.events[0]!)
    const batch = stream.batch(stop)
    await eventually(() => seen.length === 2, 'both handlers started')

    // each order moves on while its first event's handler runs
    const firstNext = await move(first, 'delivered')
    const secondNext = await move(second, 'funded')
    const secondLast = await move(second, 'delivered')
    await clock.advance(Math.ceil(gatherMs(2)))
    // the read ahead takes them; the slow calls still hold both orders back
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(seen).toEqual([`start ${first.events[0]}`, `start ${second.events[0]}`])

    openFirst()
    await eventually(() => seen.includes(`end ${firstNext}`), "the first order's next event ran")
    openSecond()
    // the second order's funded throws: its delivered waits behind it, not called
    expect(await batch).toMatchObject({ read: 5 })
    expect(seen).toEqual([
      `start ${first.events[0]}`,
      `start ${second.events[0]}`,
      `end ${first.events[0]}`,
      `start ${firstNext}`,
      `end ${firstNext}`,
      `end ${second.events[0]}`,
      `start ${secondNext}`,
      `end ${secondNext}`,
    ])
    expect(await states()).toEqual(
      new Map([
        [first.events[0], 'done'],
        [second.events[0], 'done'],
        [firstNext, 'done'],
        [secondNext, 'pending'],
        [secondLast, 'pending'],
      ]),
    )
  })

  it("holds an order's event read ahead behind its failure in the batch, once the order's chain has ended", async () => {
    const { clock, seen, gate, worker, order, move, stop } = await setUp()
    const stream = worker('lease-a')
    const failing = await order(['created', 'funded'])
    const slow = await order(['created'])
    const open = gate(slow.events[0]!)
    const batch = stream.batch(stop)
    // the failing order's funded threw; the slow order's call keeps the batch reading ahead
    await eventually(() => seen.includes(`end ${failing.events[1]}`) && seen.includes(`start ${slow.events[0]}`), 'both orders ran')

    const delivered = await move(failing, 'delivered')
    await clock.advance(Math.ceil(gatherMs(3)))
    await new Promise((resolve) => setTimeout(resolve, 50))
    open()
    expect(await batch).toMatchObject({ read: 4 })
    expect(seen).not.toContain(`start ${delivered}`)
    expect(await states()).toEqual(
      new Map([
        [failing.events[0], 'done'],
        [failing.events[1], 'pending'],
        [slow.events[0], 'done'],
        [delivered, 'pending'],
      ]),
    )
  })

  it(`stops reading ahead ${WRITE_BACK_MS} ms after the batch's first read: the next batch reads the rest`, async () => {
    const { clock, seen, order, slowBatch, stop } = await setUp()
    const { stream, slow, open, batch } = await slowBatch()

    await clock.advance(WRITE_BACK_MS)
    const later = await order(['created'])
    await clock.advance(Math.ceil(gatherMs(1)))
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(seen).toEqual([`start ${slow.events[0]}`])

    open()
    expect(await batch).toMatchObject({ read: 1 })
    expect(await stream.batch(stop)).toMatchObject({ read: 1 })
    expect(seen).toEqual([`start ${slow.events[0]}`, `end ${slow.events[0]}`, `start ${later.events[0]}`, `end ${later.events[0]}`])
  })

  it('does not read ahead under another lease token: the batch writes nothing back, and the other replica runs its events', async () => {
    const { clock, seen, gate, worker, order, slowBatch, stop } = await setUp()
    const { stream, slow, open, batch } = await slowBatch()

    // a replica whose clock is past lease-a's end takes the stream, and runs the slow event again (at least once)
    const other = worker('lease-b', new FakeClock(clock.now() + SETTINGS.leaseMs + 1))
    const again = gate(`${slow.events[0]}`)
    const taken = other.batch(stop)
    await eventually(() => seen.length === 2, "the other replica's call started")
    again()
    await eventually(() => seen.filter((line) => line === `end ${slow.events[0]}`).length === 1, "the other replica's call ended")
    expect(await taken).toMatchObject({ read: 1 })

    await order(['created'])
    await clock.advance(Math.ceil(gatherMs(1)))
    await new Promise((resolve) => setTimeout(resolve, 50))
    open()
    expect(await batch).toMatchObject({ read: 1 })
    // lease-a read nothing more, and wrote nothing: the row is lease-b's
    expect(seen.filter((line) => line.startsWith('start'))).toHaveLength(2)
    expect(stream.leased).toBe(false)
    const row = await database.db.selectFrom('reactionStreams').select('leaseToken').where('handler', '=', 'ledger').executeTakeFirstOrThrow()
    expect(row.leaseToken).toBe('lease-b')
    expect(logEntries().some((entry) => entry.msg === 'reaction stream lease was taken over: the batch runs again elsewhere' && entry.events === 1)).toBe(true)
  })
})
