// The record of first attempts that succeeded (migrations/0011_reaction_stream_batches.ts): a stream batch
// writes no job row for an event its handler took on its first call; the batch's own row holds it, and the
// operator's views (the CLI's list, an order's timeline, the console, retention) read it from there.
import { sql } from 'kysely'
import request from 'supertest'
import { afterEach, describe, expect, it } from 'vitest'
import type { ReactionHandler } from '../src/reactions/reaction-event.js'
import {
  countDoneJobsBefore,
  firstAttemptsOfEventsQuery,
  jobsOfEvents,
  listFirstAttemptsDone,
  listJobs,
} from '../src/reactions/reaction-job.repository.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { runPrunePass } from '../src/retention/prune.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { clearReactions, TEST_DISPATCHER_SETTINGS, testStreamWorker, untilEventsReadable } from './helpers/reaction-jobs.js'
import { testConfig } from './helpers/test-config.js'
import { describePostgres, useTestDatabase } from './helpers/test-database.js'

const SETTINGS = TEST_DISPATCHER_SETTINGS

describe('reactions done on the first attempt', () => {
  const database = useTestDatabase()
  let counter = 0

  afterEach(async () => {
    await clearReactions(database.db)
  })

  /** Two handlers of every transition, each with its stream worker: `ledger` always returns, `flaky` throws on `trade.funded`. */
  const setUp = async () => {
    const clock = new FakeClock(Date.now())
    const ledger: ReactionHandler = async () => {}
    const flaky: ReactionHandler = async (event) => {
      if (event.type === 'trade.funded') throw new Error('the partner system is down')
    }
    const reactions = createReactionRegistry().on('trade.*', 'ledger', ledger).on('trade.*', 'flaky', flaky)
    await ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))
    const worker = (name: string, handler: ReactionHandler) => testStreamWorker(database.db, { name, handler, clock, leaseToken: `lease-${name}`, settings: SETTINGS })
    const stop = new AbortController()
    const workers = [worker('ledger', ledger), worker('flaky', flaky)]
    /** One order moved through `statuses`; its history rows' event ids, in order. */
    const order = async (statuses: string[]) => {
      const now = () => new Date(clock.now())
      const orderId = await moveNewOrder(database.db, { externalReference: `first-${++counter}`, statuses, handlersFor: reactions.handlersFor, now })
      const history = await database.db.selectFrom('orderStatusHistory').select('eventId').where('orderId', '=', orderId).orderBy('id').execute()
      await untilEventsReadable(database.db)
      return { orderId, eventIds: history.map((row) => row.eventId) }
    }
    /**
     * Every worker reads and runs one batch, then reads again: a batch whose every event was done is written back
     * with the next one's, or at the next read that finds nothing new (as here).
     */
    const batches = async () => {
      for (const each of workers) {
        await each.batch(stop.signal)
        expect(await each.batch(stop.signal)).toMatchObject({ read: 0 })
      }
    }
    return { clock, order, batches }
  }

  it('writes no job row for it: its batch records it, and the list and the order timeline show it done', async () => {
    const { order, batches } = await setUp()
    const { orderId, eventIds } = await order(['created', 'funded', 'delivered'])
    await batches()

    // ledger: every event done on its first call, no job row; flaky: created done, funded retried later, delivered held behind it
    const rows = await database.db.selectFrom('reactionJobs').select(['handler', 'eventId', 'state', 'attempts']).orderBy('sequence').execute()
    expect(rows).toEqual([
      { handler: 'flaky', eventId: eventIds[1], state: 'pending', attempts: 1 },
      { handler: 'flaky', eventId: eventIds[2], state: 'pending', attempts: 0 },
    ])
    const recorded = await database.db.selectFrom('reactionStreamBatches').select(['handler', 'events']).orderBy('handler').execute()
    expect(recorded).toEqual([
      { handler: 'flaky', events: 1 },
      { handler: 'ledger', events: 3 },
    ])

    const done = await listJobs(database.db, { state: 'done' })
    expect(done.map((job) => [job.id, job.handler, job.eventId, job.attempts]).sort()).toEqual(
      [
        [null, 'flaky', eventIds[0], 1],
        [null, 'ledger', eventIds[0], 1],
        [null, 'ledger', eventIds[1], 1],
        [null, 'ledger', eventIds[2], 1],
      ].sort(),
    )
    expect(done.every((job) => job.orderId === orderId && job.finishedAt instanceof Date)).toBe(true)
    // without a state: the rows beside them
    expect(await listJobs(database.db)).toHaveLength(6)
    expect(await listJobs(database.db, { state: 'pending' })).toHaveLength(2)
    expect((await listJobs(database.db, { handler: 'ledger' })).map((job) => job.state)).toEqual(['done', 'done', 'done'])

    const timeline = await jobsOfEvents(database.db, eventIds)
    const byEvent = (eventId: string) =>
      timeline
        .filter((job) => job.eventId === eventId)
        .map(({ id, handler, state }) => `${handler} ${state}${id === null ? '' : ' (job)'}`)
        .sort()
    expect(byEvent(eventIds[0]!)).toEqual(['flaky done', 'ledger done'])
    expect(byEvent(eventIds[1]!)).toEqual(['flaky pending (job)', 'ledger done'])
    expect(byEvent(eventIds[2]!)).toEqual(['flaky pending (job)', 'ledger done'])
  })

  it('pages through the first attempts, newest first, across batches', async () => {
    const { order, batches } = await setUp()
    const first = await order(['created', 'funded'])
    await batches()
    const second = await order(['created'])
    await batches()
    const all = await listFirstAttemptsDone(database.db, { handler: 'ledger', limit: 10 })
    expect(all.map((job) => job.eventId)).toEqual([second.eventIds[0], first.eventIds[1], first.eventIds[0]])
    // two a page: the cursor of the last one shown goes on within the first batch
    const page1 = await listFirstAttemptsDone(database.db, { handler: 'ledger', limit: 2 })
    expect(page1.map((job) => job.eventId)).toEqual(all.slice(0, 2).map((job) => job.eventId))
    const page2 = await listFirstAttemptsDone(database.db, { handler: 'ledger', limit: 2, before: page1.at(-1)!.cursor })
    expect(page2.map((job) => job.eventId)).toEqual([first.eventIds[0]])
  })

  it('lists them in the console, with a page cursor it checks', async () => {
    const { order, batches } = await setUp()
    const { eventIds } = await order(['created'])
    await batches()
    const token = 'console-token-0123456789abcdef0123'
    const admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: token }), db: database.db, logger: testLogger([token]) })
    const get = (path: string) => request(admin).get(path).set('Authorization', `Bearer ${token}`)
    const page = await get('/console/reactions/first-attempts?handler=ledger')
    expect(page.status).toBe(200)
    expect(page.text).toContain('Reactions done on the first attempt')
    expect(page.text).toContain(eventIds[0])
    expect((await get('/console/reactions/first-attempts?handler=nobody')).text).toContain('None recorded for this handler')
    const bad = await get('/console/reactions/first-attempts?before=%3Cscript%3E')
    expect(bad.status).toBe(400)
    expect(bad.text).not.toContain('<script>')
  })

  it('deletes them with their batch once older than the retention, counted as the jobs they stand for', async () => {
    const { clock, order, batches } = await setUp()
    await order(['created', 'funded'])
    await batches()
    // the batches were written back 40 days ago
    await sql`update reaction_stream_batches set finished_at = finished_at - interval '40 days'`.execute(database.db)
    await order(['created'])
    await batches()
    const cutoff = new Date(clock.now() - 30 * 86_400_000)
    // ledger 2 + flaky 1 (its funded call failed: a job row, pending)
    expect(await countDoneJobsBefore(database.db, cutoff)).toBe(3)
    const result = await runPrunePass({ db: database.db, holdLock: database.holdLock, clock }, { bodyDays: 30, deliveryDays: 30, batchSize: 1, pauseMs: 0 })
    expect(result.counts.reaction_job).toBe(3)
    expect(await database.db.selectFrom('reactionStreamBatches').select('events').orderBy('handler').execute()).toEqual([{ events: 1 }, { events: 1 }])
  })

  describePostgres('on Postgres', () => {
    it('finds an event’s first attempt with one probe of the batches’ place index per stream', async () => {
      const { order, batches } = await setUp()
      const { eventIds } = await order(['created'])
      await batches()
      // many batches of other events, so a scan would cost more than the probe
      await sql`insert into reaction_stream_batches (handler, to_position, to_history_id, done, events, finished_at)
        select 'ledger', '1'::xid8, i, array[i]::bigint[], 1, now() from generate_series(1, 20000) i`.execute(database.db)
      await sql`analyze reaction_stream_batches`.execute(database.db)
      const compiled = firstAttemptsOfEventsQuery(eventIds).compile(database.db)
      const { rows } = await database.db.executeQuery<{ 'QUERY PLAN': string }>({
        ...compiled,
        sql: `explain ${compiled.sql}`,
      })
      const plan = rows.map((row) => row['QUERY PLAN']).join('\n')
      expect(plan).toMatch(/Index (Only )?Scan using reaction_stream_batches_place_idx/)
      expect(plan).not.toMatch(/Seq Scan on reaction_stream_batches/)
    })
  })
})
