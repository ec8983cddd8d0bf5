// A stream batch whose every event was done leaves no job row, only its record and the stream's new place: that
// write-back waits (at most WRITE_BACK_MS) and goes with a later batch's, the next read starting from the place
// held in memory. What is held is written at the next read that finds nothing new, with the first batch that
// writes job rows, at the shutdown's release, or dropped when another replica took the stream meanwhile (which
// reads those events again: at least once). Time is a fake clock.
import { sql } from 'kysely'
import { afterEach, describe, expect, it } from 'vitest'
import type { ReactionHandler } from '../src/reactions/reaction-event.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ensureReactionStreams, readReactionStream } from '../src/reactions/reaction-stream.repository.js'
import { WRITE_BACK_MS } from '../src/reactions/stream-worker.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { clearReactions, reactionRecords, TEST_DISPATCHER_SETTINGS, testStreamWorker, untilEventsReadable } from './helpers/reaction-jobs.js'
import { useTestDatabase } from './helpers/test-database.js'

const SETTINGS = TEST_DISPATCHER_SETTINGS

describe('the write-back of a reaction stream batch', () => {
  const database = useTestDatabase()
  let counter = 0

  afterEach(async () => {
    await clearReactions(database.db)
  })

  const setUp = async () => {
    const clock = new FakeClock(Date.now())
    // every call, by event id; trade.funded throws
    const calls: string[] = []
    const handler: ReactionHandler = async (event) => {
      calls.push(event.eventId)
      if (event.type === 'trade.funded') throw new Error('the partner system is down')
    }
    const reactions = createReactionRegistry().on('trade.*', 'ledger', handler)
    await ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))
    const worker = (leaseToken: string) => testStreamWorker(database.db, { name: 'ledger', handler, clock, leaseToken, settings: SETTINGS })
    /** One new order moved through `statuses`; its events' ids, in order. */
    const order = async (statuses: string[]) => {
      const orderId = await moveNewOrder(database.db, {
        externalReference: `write-back-${++counter}`,
        statuses,
        handlersFor: reactions.handlersFor,
        now: () => new Date(clock.now()),
      })
      await untilEventsReadable(database.db)
      const history = await database.db.selectFrom('orderStatusHistory').select(['eventId', 'id']).where('orderId', '=', orderId).orderBy('id').execute()
      return history.map((row) => ({ eventId: row.eventId, historyId: String(row.id) }))
    }
    /** The stream's row (its place and lease) and the batch records written back, oldest first. */
    const written = async () => {
      const stream = await database.db.selectFrom('reactionStreams').select(['historyId', 'leaseToken']).where('handler', '=', 'ledger').executeTakeFirstOrThrow()
      const batches = await database.db.selectFrom('reactionStreamBatches').select(['done', 'toHistoryId']).where('handler', '=', 'ledger').orderBy('id').execute()
      return {
        place: String(stream.historyId),
        leaseToken: stream.leaseToken,
        batches: batches.map((batch) => ({ done: batch.done.map(String), to: String(batch.toHistoryId) })),
      }
    }
    const stop = new AbortController()
    return { clock, calls, worker, order, written, stop: stop.signal }
  }

  it('holds a batch whose every event was done, reads on from its place, and writes both at the next read that finds nothing', async () => {
    const { calls, worker, order, written, stop } = await setUp()
    const stream = worker('lease-a')
    const before = await written()
    const [first] = await order(['created'])

    expect(await stream.batch(stop)).toMatchObject({ read: 1 })
    // nothing written yet: the place is where it was, no record
    expect(await written()).toEqual({ ...before, leaseToken: 'lease-a' })

    const [second] = await order(['created'])
    // the read starts after the held batch: the first event is not read (nor run) again
    expect(await stream.batch(stop)).toMatchObject({ read: 1 })
    expect(calls).toEqual([first!.eventId, second!.eventId])
    expect((await written()).batches).toEqual([])

    expect(await stream.batch(stop)).toMatchObject({ read: 0 })
    expect(await written()).toEqual({
      place: second!.historyId,
      leaseToken: 'lease-a',
      batches: [{ done: [first!.historyId, second!.historyId], to: second!.historyId }],
    })
    expect((await reactionRecords(database.db, 'ledger')).map((record) => [record.eventId, record.state])).toEqual([
      [first!.eventId, 'done'],
      [second!.eventId, 'done'],
    ])
  })

  it('writes back the batches it holds once the first of them waited WRITE_BACK_MS, with the batch then read', async () => {
    const { clock, worker, order, written, stop } = await setUp()
    const stream = worker('lease-a')
    const [first] = await order(['created'])
    await stream.batch(stop)
    await clock.advance(WRITE_BACK_MS - 1)
    const [second] = await order(['created'])
    await stream.batch(stop)
    expect((await written()).batches).toEqual([])

    await clock.advance(1)
    const [third] = await order(['created'])
    expect(await stream.batch(stop)).toMatchObject({ read: 1 })
    expect(await written()).toMatchObject({
      place: third!.historyId,
      batches: [{ done: [first, second, third].map((event) => event!.historyId), to: third!.historyId }],
    })
  })

  it('writes the batches it holds with the first batch that leaves a job row', async () => {
    const { worker, order, written, stop } = await setUp()
    const stream = worker('lease-a')
    const [created] = await order(['created'])
    await stream.batch(stop)

    // created is done; funded throws: a job row to retry it, written with the held batch's record
    const [otherCreated, funded] = await order(['created', 'funded'])
    expect(await stream.batch(stop)).toMatchObject({ read: 2 })
    expect(await written()).toMatchObject({
      place: funded!.historyId,
      batches: [{ done: [created!.historyId, otherCreated!.historyId], to: funded!.historyId }],
    })
    const records = await reactionRecords(database.db, 'ledger')
    expect(records.map((record) => [record.eventId, record.state, record.attempts]).sort()).toEqual(
      [
        [created!.eventId, 'done', 1],
        [otherCreated!.eventId, 'done', 1],
        [funded!.eventId, 'pending', 1],
      ].sort(),
    )
  })

  it('writes back once it holds more than four full batches of events, however little time passed', async () => {
    const { calls, worker, order, written, stop } = await setUp()
    const stream = worker('lease-a')
    // one order with 2,600 events (a batch reads 512 at most with this concurrency)
    const [first] = await order(['created'])
    const { orderId } = await database.db.selectFrom('orderStatusHistory').select('orderId').where('eventId', '=', first!.eventId).executeTakeFirstOrThrow()
    await sql`insert into order_status_history (order_id, from_status, to_status, source, sequence, trade_id, external_reference, stream_position)
      select ${orderId}, 'created', 'created', 'api', 1 + g, 'trd_bulk', 'bulk', pg_current_xact_id() from generate_series(1, 2599) g`.execute(database.db)
    await untilEventsReadable(database.db)

    for (let held = 1; held <= 4; held++) expect(await stream.batch(stop)).toMatchObject({ read: 512, full: true })
    expect((await written()).batches).toEqual([])
    expect(await stream.batch(stop)).toMatchObject({ read: 512, full: true })
    const { batches } = await written()
    expect(batches.map((batch) => batch.done.length)).toEqual([5 * 512])
    expect(calls).toHaveLength(5 * 512)
  })

  it('writes back what it holds when it gives the lease back at the shutdown', async () => {
    const { worker, order, written, stop } = await setUp()
    const stream = worker('lease-a')
    const [created] = await order(['created'])
    await stream.batch(stop)

    await stream.release()
    expect(await written()).toEqual({ place: created!.historyId, leaseToken: null, batches: [{ done: [created!.historyId], to: created!.historyId }] })
  })

  it('drops what it holds when another replica took the stream meanwhile: that one runs those events again, and the place never moves back', async () => {
    const { clock, calls, worker, order, written, stop } = await setUp()
    const a = worker('lease-a')
    const b = worker('lease-b')
    const [created] = await order(['created'])
    await a.batch(stop)

    // a stalls past its lease; b takes the stream from the place last written and runs the event again
    await clock.advance(SETTINGS.leaseMs + 1)
    expect(await b.batch(stop)).toMatchObject({ read: 1 })
    expect(await b.batch(stop)).toMatchObject({ read: 0 })
    expect(calls).toEqual([created!.eventId, created!.eventId])
    const byB = await written()
    expect(byB).toEqual({ place: created!.historyId, leaseToken: 'lease-b', batches: [{ done: [created!.historyId], to: created!.historyId }] })

    // a reads again: b holds the stream, so a drops what it held and writes nothing
    expect(await a.batch(stop)).toMatchObject({ read: 0 })
    expect(a.leased).toBe(false)
    await a.release()
    expect(await written()).toEqual(byB)
    expect(logEntries().some((entry) => entry.msg === 'reaction stream lease was taken over: the batch runs again elsewhere' && entry.events === 1)).toBe(true)
  })

  it('reads from a place held in memory only while the stream is still under the same lease token', async () => {
    const { clock, order } = await setUp()
    const [first, second, third] = await order(['created', 'funded', 'delivered'])
    const at = () => new Date(clock.now())
    const lease = (leaseToken: string) => ({ handler: 'ledger', leaseToken, now: at(), leaseEnd: new Date(clock.now() + SETTINGS.leaseMs), limit: 1 })

    const one = await readReactionStream(database.db, lease('lease-a'))
    expect(one).toMatchObject({ leased: true, fromAfter: false })
    expect(one.events.map((entry) => entry.historyId)).toEqual([first!.historyId])
    // on from the place not written back (the row still holds the one before the first event)
    const two = await readReactionStream(database.db, { ...lease('lease-a'), after: one.events[0] })
    expect(two).toMatchObject({ leased: true, fromAfter: true })
    expect(two.events.map((entry) => entry.historyId)).toEqual([second!.historyId])
    // the lease ran out and is renewed by the same token: still its place
    await clock.advance(SETTINGS.leaseMs + 1)
    const three = await readReactionStream(database.db, { ...lease('lease-a'), after: two.events[0] })
    expect(three).toMatchObject({ leased: true, fromAfter: true })
    expect(three.events.map((entry) => entry.historyId)).toEqual([third!.historyId])
    // another token takes it: the row's place, whatever place it is given
    await clock.advance(SETTINGS.leaseMs + 1)
    const taken = await readReactionStream(database.db, { ...lease('lease-b'), after: three.events[0] })
    expect(taken).toMatchObject({ leased: true, fromAfter: false })
    expect(taken.events.map((entry) => entry.historyId)).toEqual([first!.historyId])
  })
})
