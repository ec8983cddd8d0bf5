// A transaction left open anywhere on the server holds every handler's stream back (the readable end is the
// snapshot's xmin): events committed after it began wait until it ends. Another application's transaction held
// every stream for minutes with nothing in the log to say why. The dispatcher now says so once the wait passes
// HELD_BACK_WARN_MS (here 200 ms), naming the oldest open transaction on the server, never its query.
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { TEST_DISPATCHER_SETTINGS } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const MESSAGE = /^reaction stream held back: /

describePostgres('a stream held back by an open transaction (Postgres)', () => {
  let database: TestDatabase
  let dispatcher: Dispatcher | undefined
  const blocker = new pg.Client({ connectionString: postgresUrl, application_name: 'held-back-blocker' })

  beforeAll(async () => {
    database = await createTestDatabase()
    await blocker.connect()
  })
  afterAll(async () => {
    await dispatcher?.stop()
    await blocker.end()
    await database.close()
  })

  it('says so past the warning time, naming the oldest open transaction, and hands the events over once it ends', async () => {
    const handled: string[] = []
    const reactions = createReactionRegistry().on('trade.*', 'recorder', async (event) => {
      handled.push(event.eventId)
    })
    await ensureReactionStreams(database.db, reactions.names, new Date())
    // a transaction with an id of its own, open from before the transitions commit
    await blocker.query('begin')
    await blocker.query('select pg_current_xact_id()')
    await moveNewOrder(database.db, { externalReference: 'held-back-1', statuses: ['created', 'funded'], handlersFor: reactions.handlersFor, now: () => new Date() })
    dispatcher = createDispatcher({
      db: database.db,
      handler: reactions.handler,
      streams: reactions,
      clock: systemClock,
      logger: testLogger(),
      listen: database.listen,
      settings: { ...TEST_DISPATCHER_SETTINGS, heldBackWarnMs: 200 },
    })
    await dispatcher.start()

    const warned = () => logEntries().filter((entry) => MESSAGE.test(String(entry.msg)) && entry.handler === 'recorder')
    await eventually(() => warned().length > 0, 'the held-back stream is said', 30_000)
    expect(handled).toEqual([])
    const [line] = warned()
    const oldest = line!.oldestTransaction as Record<string, unknown>
    // the oldest on the whole server: ours, or an older one of a test running beside this one
    expect(oldest).toEqual(expect.objectContaining({ pid: expect.any(Number), openForS: expect.any(Number) }))
    expect(line!.heldForS).toEqual(expect.any(Number))
    expect(JSON.stringify(line)).not.toContain('pg_current_xact_id')

    await blocker.query('commit')
    await eventually(() => handled.length === 2, 'the events are handed over once the transaction ended', 30_000)
  })
})
