// `reactions release-stream HANDLER`: gives back a stream's lease, one a replica killed with its clock far ahead left
// holding every replica's new transitions of the handler back until it ends; a holder still running writes nothing of
// its batch in flight after it (the write-back checks the row's lease token).
import { sql } from 'kysely'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { applyObservation } from '../src/orders/apply-observation.js'
import { claimReactionJobs } from '../src/reactions/reaction-job.repository.js'
import { ensureReactionStreams, readReactionStream, writeReactionStream } from '../src/reactions/reaction-stream.repository.js'
import { runCommand } from './helpers/cli-in-process.js'
import { createOrder } from './helpers/orders.js'
import { untilEventsReadable } from './helpers/reaction-jobs.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const DAY_MS = 86_400_000
const STREAM_LEASE_MS = 30_000
const JOB_LEASE_MS = 300_000
const LIVE_LEASE_WARNING =
  "warning: that lease had not run out: if the replica holding it still runs, the batch it is reading and the jobs it handed off run again elsewhere (at least once, each with its event id); a replica stopped or killed loses nothing"

describe('reactions release-stream', () => {
  let database: TestDatabase
  const run = (...args: string[]) => runCommand(['reactions', 'release-stream', ...args], database.db)
  const stream = async (handler: string) => {
    const row = await database.db
      .selectFrom('reactionStreams')
      .select(['position', 'historyId', 'leaseToken', 'leaseExpiresAt'])
      .where('handler', '=', handler)
      .executeTakeFirstOrThrow()
    // (a bigint: a number on PGlite, text on Postgres)
    return { ...row, position: String(row.position), historyId: String(row.historyId) }
  }
  /** A replica's read of the handler's stream at `now` (its lease to 30 s after), from its written place or `after`. */
  const read = (handler: string, leaseToken: string, now: number, after?: { position: string; historyId: string }) =>
    readReactionStream(database.db, { handler, leaseToken, now: new Date(now), leaseEnd: new Date(now + STREAM_LEASE_MS), limit: 10, after })

  beforeAll(async () => {
    database = await createTestDatabase()
    await ensureReactionStreams(database.db, ['amqp', 'forwarder'], new Date())
    const { order } = await createOrder(database.db, { externalReference: 'release-1' })
    for (const status of ['created', 'funded']) {
      await applyObservation(
        database.db,
        { target: { orderId: order.id }, tradeId: 'trd_release-1', status, source: 'webhook', observedAt: new Date() },
        { staleAfterS: 3_600, handlersFor: () => ['amqp', 'forwarder'] },
      )
    }
    // a transaction of another suite on the same server withholds the events from the reads until it ends
    await untilEventsReadable(database.db)
  })
  afterAll(async () => {
    await database.close()
  })
  beforeEach(async () => {
    await database.db.updateTable('reactionStreams').set({ leaseToken: null, leaseExpiresAt: null }).execute()
  })

  it('refuses a handler that has no stream with a code, naming the streams there are', async () => {
    expect(await run('forwarder-typo')).toMatchObject({
      code: 1,
      stdout: '',
      stderr: 'No reaction stream of handler forwarder-typo: the streams are amqp, forwarder [stream_not_found]\n',
    })
    const json = await run('forwarder-typo', '--json')
    expect([json.code, JSON.parse(json.stdout), json.stderr]).toEqual([1, { handler: 'forwarder-typo', result: 'not_found', handlers: ['amqp', 'forwarder'] }, ''])
    // an empty name is a usage error, before the database is asked
    for (const name of ['', ' ']) {
      const empty = await run(name)
      expect([empty.code, empty.stdout], JSON.stringify(name)).toEqual([2, ''])
      expect(empty.stderr).toContain('must name a handler')
    }
    // a name with a control character is shown escaped
    expect((await run('a\u001b[31mb')).stderr).toBe('No reaction stream of handler a\\u001b[31mb: the streams are amqp, forwarder [stream_not_found]\n')
  })

  it('says so when the stream holds no lease, and changes nothing', async () => {
    const before = await stream('forwarder')
    expect(await run('forwarder')).toMatchObject({ code: 0, stdout: 'reaction stream forwarder holds no lease: nothing to release\n', stderr: '' })
    expect(JSON.parse((await run('forwarder', '--json')).stdout)).toEqual({ handler: 'forwarder', result: 'not_held' })
    expect(await stream('forwarder')).toEqual(before)
  })

  it('releases the lease a replica a day ahead left, saying until when it held it; another replica then reads the stream at once', async () => {
    // a replica whose clock ran a day ahead took the stream, and was killed
    const aheadAt = Date.now() + DAY_MS
    expect((await read('forwarder', 'replica-ahead', aheadAt)).leased).toBe(true)
    const refused = await read('forwarder', 'replica-right', Date.now())
    expect(refused.leased).toBe(false)
    expect(refused.heldUntil?.getTime()).toBe(aheadAt + STREAM_LEASE_MS)

    const released = await run('forwarder')
    expect(released.code).toBe(0)
    const said = /^released the lease on reaction stream forwarder, held until (\S+) \((\d+) s from now by the database's clock\): the next replica to read it takes it\nno job was running under that lease\n$/.exec(
      released.stdout,
    )
    expect(said, released.stdout).not.toBeNull()
    expect(said![1]).toBe(new Date(aheadAt + STREAM_LEASE_MS).toISOString())
    expect(Math.abs(Number(said![2]) - (DAY_MS + STREAM_LEASE_MS) / 1000)).toBeLessThan(120)
    // a lease that had not run out: allowed, and said
    expect(released.stderr).toBe(`${LIVE_LEASE_WARNING}\n`)
    expect(await stream('forwarder')).toMatchObject({ leaseToken: null, leaseExpiresAt: null })

    const taken = await read('forwarder', 'replica-right', Date.now())
    expect(taken.leased).toBe(true)
    expect(taken.events.map((entry) => entry.event.type)).toEqual(['trade.created', 'trade.funded'])
  })

  it('says when a released lease had run out already, and prints JSON', async () => {
    const pastAt = Date.now() - 120_000
    expect((await read('amqp', 'replica-gone', pastAt)).leased).toBe(true)
    const json = await run('amqp', '--json')
    // run out: nothing of its holder's runs twice, and nothing is said of it
    expect(json.stderr).toBe('')
    const released = JSON.parse(json.stdout) as { handler: string; result: string; leaseExpiresAt: string; leftS: number }
    expect(released).toMatchObject({ handler: 'amqp', result: 'released', leaseExpiresAt: new Date(pastAt + STREAM_LEASE_MS).toISOString(), freedJobs: 0 })
    expect(released.leftS).toBeLessThan(-80)
    expect((await run('amqp')).stdout).toBe('reaction stream amqp holds no lease: nothing to release\n')
  })

  // Found from outside: release-stream gave the lease back, but the calls its killed holder had handed off (running
  // rows under that lease) stayed running until their own lease ran out, REACTION_LEASE_S (300 s by default),
  // holding back their orders' later events.
  it('gives back the jobs its holder had handed off, pending and due now with their attempts, and no other', async () => {
    const places = { forwarder: await stream('forwarder'), amqp: await stream('amqp') }
    const holderAt = Date.now()
    const holder = await read('forwarder', 'holder', holderAt)
    const [created, funded] = holder.events
    // its batch written back with both calls still running: handed off under the stream's lease (stream-worker.ts)
    const handedOff = (entry: NonNullable<typeof created>) => ({
      event: entry.event,
      createdAt: entry.recordedAt,
      state: 'running' as const,
      attempts: 1,
      runAt: new Date(holderAt + JOB_LEASE_MS),
      lastError: null,
      leaseToken: 'holder',
      leaseExpiresAt: new Date(holderAt + JOB_LEASE_MS),
    })
    const writeBack = (handler: string, leaseToken: string) =>
      writeReactionStream(database.db, {
        handler,
        leaseToken,
        place: funded!,
        outcomes: [handedOff(created!), handedOff(funded!)],
        now: new Date(holderAt),
        leaseEnd: new Date(holderAt + STREAM_LEASE_MS),
      })
    expect(await writeBack('forwarder', 'holder')).toBeDefined()
    // the same process's other stream (one lease token for its streams), whose lease is not released
    expect((await read('amqp', 'holder', holderAt)).leased).toBe(true)
    expect(await writeBack('amqp', 'holder')).toBeDefined()
    const jobs = (handler: string) =>
      database.db.selectFrom('reactionJobs').select(['id', 'state', 'attempts', 'runAt', 'leaseToken', 'leaseExpiresAt']).where('handler', '=', handler).orderBy('id').execute()
    expect((await jobs('forwarder')).map((job) => job.state)).toEqual(['running', 'running'])
    // what `reactions show` says of such a job: nothing told the operator that release-stream ends its wait
    const handed = String((await jobs('forwarder'))[0]!.id)
    const shown = await runCommand(['reactions', 'show', handed], database.db)
    expect(shown.stdout).toMatch(
      /\nnext run {3}\S+ \(its lease's end: it runs again then if the replica running it is gone; it was handed off under the forwarder stream's lease: if that replica was killed, `reactions release-stream forwarder` gives it back now\)\n/,
    )
    expect(JSON.parse((await runCommand(['reactions', 'show', handed, '--json'], database.db)).stdout)).toMatchObject({ state: 'running', underStreamLease: true })

    const released = await run('forwarder')
    expect(released.code).toBe(0)
    expect(released.stdout).toMatch(/^released the lease on reaction stream forwarder, held until .*\ngave back 2 jobs its holder had handed off \(running under that lease\): pending, due now, attempts as they were\n$/)
    expect(released.stderr).toBe(`${LIVE_LEASE_WARNING}\n`)
    const { rows } = await sql<{ now: Date }>`select now() as now`.execute(database.db)
    for (const job of await jobs('forwarder')) {
      expect(job).toMatchObject({ state: 'pending', attempts: 1, leaseToken: null, leaseExpiresAt: null })
      expect(new Date(job.runAt).getTime()).toBeLessThanOrEqual(new Date(rows[0]!.now).getTime())
    }
    expect((await jobs('amqp')).map((job) => [job.state, job.leaseToken])).toEqual([['running', 'holder'], ['running', 'holder']])
    // a replica's job loop claims them at once (in order: the second waits behind the first of its order)
    const claimed = await claimReactionJobs(database.db, { now: new Date(), limit: 10, leaseMs: JOB_LEASE_MS, leaseToken: 'other', handlers: ['forwarder'] })
    expect(claimed.map((job) => [job.event.eventId, job.attempt])).toEqual([[created!.event.eventId, 2]])
    // claimed by a job loop, under a lease of its own: release-stream does not give it back, and show says only when it ends
    const own = await runCommand(['reactions', 'show', claimed[0]!.id], database.db)
    expect(own.stdout).toMatch(/\nnext run {3}\S+ \(its lease's end: it runs again then if the replica running it is gone\)\n/)

    // and --json says how many
    await database.db.updateTable('reactionJobs').set({ state: 'running', leaseToken: 'holder' }).where('handler', '=', 'forwarder').execute()
    await database.db.updateTable('reactionStreams').set({ leaseToken: 'holder', leaseExpiresAt: new Date(Date.now() - 60_000) }).where('handler', '=', 'forwarder').execute()
    const json = await run('forwarder', '--json')
    expect([JSON.parse(json.stdout).freedJobs, json.stderr]).toEqual([2, ''])
    // the streams back at their places, for the next test
    await database.db.deleteFrom('reactionJobs').execute()
    for (const [handler, { position, historyId }] of Object.entries(places)) {
      await sql`update reaction_streams set position = ${position}::xid8, history_id = ${historyId}::bigint where handler = ${handler}`.execute(database.db)
    }
  })

  it("lets a holder still running write nothing of its batch in flight: neither over another replica's write-back nor over the written place", async () => {
    const start = await stream('forwarder')
    const holderAt = Date.now()
    const holder = await read('forwarder', 'holder', holderAt)
    expect(holder.events).toHaveLength(2)
    const [created, funded] = holder.events
    const writeHolderBack = () =>
      writeReactionStream(database.db, {
        handler: 'forwarder',
        leaseToken: 'holder',
        place: funded!,
        outcomes: [{ event: funded!.event, createdAt: funded!.recordedAt, state: 'pending', attempts: 1, runAt: new Date(holderAt + 60_000), lastError: 'Error: 503' }],
        done: [created!.historyId],
        now: new Date(holderAt),
        leaseEnd: new Date(holderAt + STREAM_LEASE_MS),
      })

    // released while the holder's batch runs: its write-back writes nothing, and the place stays where it was written
    expect((await run('forwarder')).code).toBe(0)
    expect(await writeHolderBack()).toBeUndefined()
    expect(await stream('forwarder')).toMatchObject({ position: start.position, historyId: start.historyId, leaseToken: null })
    // its read on from the place it had not written back starts from the written place instead
    const again = await read('forwarder', 'holder', Date.now(), funded!)
    expect([again.leased, again.fromAfter, again.events.length]).toEqual([true, false, 2])

    // released again; another replica takes the stream and writes its batch back; the first holder's comes after it
    expect((await run('forwarder')).code).toBe(0)
    const otherAt = Date.now()
    const other = await read('forwarder', 'other', otherAt)
    expect(other.events).toHaveLength(2)
    const written = await writeReactionStream(database.db, {
      handler: 'forwarder',
      leaseToken: 'other',
      place: { position: other.events[0]!.position, historyId: other.events[0]!.historyId },
      outcomes: [],
      done: [other.events[0]!.historyId],
      now: new Date(otherAt),
      leaseEnd: new Date(otherAt + STREAM_LEASE_MS),
    })
    expect(written).toBeDefined()
    expect(await writeHolderBack()).toBeUndefined()
    expect(await stream('forwarder')).toMatchObject({ position: other.events[0]!.position, historyId: other.events[0]!.historyId, leaseToken: 'other' })
    expect(await database.db.selectFrom('reactionJobs').select('id').execute()).toEqual([])
  })
})
