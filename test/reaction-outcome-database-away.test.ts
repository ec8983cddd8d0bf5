// A job loop's handler that returns while the database does not answer (PGlite and Postgres): its outcome's write is
// tried again under the job's lease (src/reactions/write-outcome.ts). So is a stream batch's write-back, for a handler
// that returns inside its batch (stream-worker.ts), under the stream's lease token. The database here is the test's, through a plugin
// that refuses every statement while `away` is set, as a cut connection does; time is a fake clock, so the waits
// between tries, the shutdown's grace and the lease move only when the test says. The compiled service through a cut
// TCP proxy: test/reactions-database-blip-process.test.ts.
// The same plugin also loses one statement's answer (`loseAnswerOf`): the statement runs and commits (each of these
// writes is one statement, committed on its own), and the dispatcher is handed the error a connection cut after the
// COMMIT gives instead of its answer. A proxy cannot pick that statement out of the wire deterministically (most are
// prepared, sent by name), so the fault is made at the client's boundary, over the real database.
import { PostgresQueryCompiler, type QueryId, sql } from 'kysely'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import type { AttemptResult } from '../src/reactions/dispatcher-settings.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { WRITE_BACK_MS } from '../src/reactions/stream-worker.js'
import { createReactionRegistry, type ReactionRegistry } from '../src/reactions/reaction-registry.js'
import { OUTCOME_RETRY_MAX_MS } from '../src/reactions/write-outcome.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { clearReactions, TEST_DISPATCHER_SETTINGS } from './helpers/reaction-jobs.js'
import { deferred, eventually } from './helpers/reconcile-poller.js'
import { useTestDatabase } from './helpers/test-database.js'

const SETTINGS = TEST_DISPATCHER_SETTINGS
const HANDLER = 'away-handler'
let counter = 0

describe('a reaction job whose handler returns while the database is away', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  let dispatcher: Dispatcher | undefined
  let away = false
  // statements refused so far
  let refused = 0
  // the next statement whose SQL this matches runs, and its answer is lost: an error is thrown in its place
  let loseAnswerOf: ((sql: string) => boolean) | undefined
  // answers lost so far
  let lost = 0
  const toLose = new Set<QueryId>()
  const compiler = new PostgresQueryCompiler()
  // the test's database as the dispatcher reaches it: every statement refused while `away`
  const reached = () =>
    database.db.withPlugin({
      transformQuery: (args) => {
        if (away) refused += 1
        if (away) throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' })
        if (loseAnswerOf?.(compiler.compileQuery(args.node, args.queryId).sql)) {
          loseAnswerOf = undefined
          toLose.add(args.queryId)
        }
        return args.node
      },
      transformResult: async (args) => {
        // (the statement ran and committed: only its answer does not come back)
        if (toLose.delete(args.queryId)) {
          lost += 1
          throw new Error('Connection terminated unexpectedly')
        }
        return args.result
      },
    })

  /** A dispatcher of `reactions` on the database as `reached()` lets it through, its attempts' results kept in `results`. */
  const startDispatcher = async (reactions: ReactionRegistry, results: AttemptResult[]) => {
    dispatcher = createDispatcher({
      db: reached(),
      handler: reactions.handler,
      streams: reactions,
      clock,
      logger: testLogger(),
      settings: SETTINGS,
      random: () => 0.5,
      onAttempt: (_handler, result) => void results.push(result),
    })
    await dispatcher.start()
  }

  beforeEach(() => {
    clock = new FakeClock(Date.now())
    away = false
    refused = 0
    loseAnswerOf = undefined
    lost = 0
    toLose.clear()
  })
  afterEach(async () => {
    away = false
    loseAnswerOf = undefined
    // the clock moves on while the stop lasts: a test that failed midway may leave its stop waiting on the fake clock
    // (a grace, a lease), and it ends here rather than at the hook's timeout
    let stopped = false
    const stopping = dispatcher?.stop().finally(() => void (stopped = true))
    for (let step = 0; stopping && !stopped && step < 600; step += 1) await clock.advance(1_000)
    await stopping
    dispatcher = undefined
    await clearReactions(database.db)
  })

  /**
   * Until `history` (a stream position) is below the snapshot's xmin: a stream begins at, and reads only below, that
   * xmin, which a transaction open anywhere in the cluster holds back (on Postgres, another test file's).
   */
  const behindTheHorizon = (what: string, history: ReturnType<typeof sql<number>>) =>
    eventually(async () => {
      const { rows } = await sql<{ readable: boolean | null }>`select ${history} < pg_snapshot_xmin(pg_current_snapshot()) as readable`.execute(database.db)
      return rows[0]?.readable !== false
    }, what, 120_000)

  /**
   * One order's transition, left as a retry due now (its first attempt failed): the job loop claims it, and its handler
   * waits until the test lets it return. The dispatcher runs on the database as `reached` gives it.
   */
  const heldRetry = async ({ throws = false }: { throws?: boolean } = {}) => {
    const calls: number[] = []
    const returns = deferred<void>()
    const results: AttemptResult[] = []
    const reactions = createReactionRegistry().on('trade.*', HANDLER, async (_event, { attempt }) => {
      calls.push(attempt)
      await returns.promise
      if (throws) throw new Error('the receiver answered 503')
    })
    const orderId = await moveNewOrder(database.db, { externalReference: `away-${++counter}`, statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date(clock.now()) })
    const event = await database.db.selectFrom('orderStatusHistory').select(['id', 'eventId', 'sequence']).where('orderId', '=', orderId).executeTakeFirstOrThrow()
    // the stream begins after the transition: only the job loop runs it (begun while a transaction elsewhere in the
    // cluster held the horizon back, the stream took the transition too, and called the handler a second time)
    await behindTheHorizon('the transition is readable', sql<number>`(select stream_position from order_status_history where id = ${event.id})`)
    await ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))
    await database.db
      .insertInto('reactionJobs')
      .values({ eventId: event.eventId, orderId, sequence: event.sequence!, handler: HANDLER, state: 'pending', attempts: 1, runAt: new Date(clock.now() - 1_000), lastError: 'Error: the first attempt failed' })
      .execute()
    await startDispatcher(reactions, results)
    const job = () =>
      database.db.selectFrom('reactionJobs').select(['state', 'attempts', 'leaseToken', 'finishedAt', 'runAt']).where('eventId', '=', event.eventId).executeTakeFirstOrThrow()
    await eventually(async () => calls.length === 1 && (await job()).state === 'running', 'the retry is claimed and its handler runs')
    return { calls, returns, results, job, eventId: event.eventId }
  }

  /** Stops the dispatcher: `waiting` resolves once the stop waits for the job in flight (or has ended), `done` when it ends. */
  const stopInFlight = () => {
    const stopping = dispatcher!
    dispatcher = undefined
    let ended = false
    const done = stopping.stop().then(() => void (ended = true))
    const waiting = eventually(() => ended || stopping.waitingOn() === 'the handlers in flight', 'the stop waits for the job in flight')
    return { done, waiting }
  }

  const linesOf = (eventId: string, msg: string) => logEntries().filter((line) => line.eventId === eventId && line.msg === msg)
  const TRYING_AGAIN = 'could not record a reaction job outcome; trying again while its lease lasts'
  /** The handler's outcome met the database away: its first write failed. */
  const writeFailed = (eventId: string) =>
    eventually(
      () => logEntries().some((line) => line.eventId === eventId && String(line.msg).startsWith('could not record a reaction job outcome')),
      'the outcome’s first write failed',
    )

  it('writes the outcome once the database answers again, within the lease, and does not call the handler again', async () => {
    const { calls, returns, results, job, eventId } = await heldRetry()
    const claimed = await job()
    away = true
    returns.resolve()
    await writeFailed(eventId)
    // away for 15 s of the clock (well within the 60-s lease): the job stays running under its claim
    for (let waited = 0; waited < 15_000; waited += 1_000) await clock.advance(1_000)
    expect(await job()).toMatchObject({ state: 'running', leaseToken: claimed.leaseToken })
    away = false
    await clock.advance(OUTCOME_RETRY_MAX_MS)
    await eventually(async () => (await job()).state === 'done', 'the outcome is written')
    expect(await job()).toMatchObject({ state: 'done', attempts: 2, leaseToken: null })
    expect(calls).toEqual([2])
    expect(results).toEqual(['done'])
    expect(linesOf(eventId, 'recorded a reaction job outcome once the database answered again')).toHaveLength(1)
    expect(linesOf(eventId, TRYING_AGAIN)).toHaveLength(1)
  })

  it('on stop, keeps trying through the shutdown’s grace: the database back within it, the outcome is written, not given back', async () => {
    const { calls, returns, job, eventId } = await heldRetry()
    away = true
    returns.resolve()
    await writeFailed(eventId)
    const stopped = stopInFlight()
    await stopped.waiting
    away = false
    await clock.advance(OUTCOME_RETRY_MAX_MS)
    await stopped.done
    expect(await job()).toMatchObject({ state: 'done', attempts: 2, leaseToken: null })
    expect(calls).toEqual([2])
  })

  it('on stop with the database still away, ends after the grace and leaves the job to its lease, not given back to run again at once', async () => {
    const { calls, returns, job, eventId } = await heldRetry()
    const claimed = await job()
    away = true
    returns.resolve()
    await writeFailed(eventId)
    const stopped = stopInFlight()
    await stopped.waiting
    await clock.advance(SETTINGS.shutdownTimeoutMs)
    await stopped.done
    away = false
    expect(await job()).toMatchObject({ state: 'running', attempts: 2, leaseToken: claimed.leaseToken })
    expect(linesOf(eventId, 'could not record a reaction job outcome; it runs again after its lease')).toHaveLength(1)
    expect(calls).toEqual([2])
  })

  it('writes nothing once another claim holds the job: the lease token fences every try', async () => {
    const { returns, results, job, eventId } = await heldRetry()
    away = true
    returns.resolve()
    await writeFailed(eventId)
    // meanwhile another replica claimed the job (as after this lease ran out by its clock)
    await database.db
      .updateTable('reactionJobs')
      .set((eb) => ({ leaseToken: 'another-replica', attempts: eb('attempts', '+', 1) }))
      .where('eventId', '=', eventId)
      .execute()
    away = false
    await clock.advance(OUTCOME_RETRY_MAX_MS)
    await eventually(() => results.length === 1, 'the write is tried, and finds the lease lost')
    expect(results).toEqual(['lease_lost'])
    expect(await job()).toMatchObject({ state: 'running', attempts: 3, leaseToken: 'another-replica' })
  })

  const TAKEN_OVER = 'reaction handled, but its lease had been taken over: the job ran again elsewhere'

  it('an outcome whose commit landed but whose answer was lost is its own when tried again: done, not lease_lost', async () => {
    const { calls, returns, results, job, eventId } = await heldRetry()
    loseAnswerOf = (text) => /^\/\* prepared \*\/\s*update reaction_jobs job set\s+state = 'done'/.test(text)
    returns.resolve()
    await writeFailed(eventId)
    expect(lost).toBe(1)
    // the first try's commit landed
    expect(await job()).toMatchObject({ state: 'done', attempts: 2, leaseToken: null })
    await clock.advance(OUTCOME_RETRY_MAX_MS)
    await eventually(() => results.length === 1, 'the write is tried again')
    expect(results).toEqual(['done'])
    expect(linesOf(eventId, TAKEN_OVER)).toEqual([])
    expect(linesOf(eventId, 'recorded a reaction job outcome once the database answered again')).toHaveLength(1)
    expect(calls).toEqual([2])
  })

  it('a retry’s write whose answer was lost is its own when tried again: retry, and the run_at it wrote stands', async () => {
    const { calls, returns, results, job, eventId } = await heldRetry({ throws: true })
    loseAnswerOf = (text) => /^update "reaction_jobs" set "state" = \$1/.test(text)
    returns.resolve()
    await writeFailed(eventId)
    expect(lost).toBe(1)
    const written = await job()
    expect(written).toMatchObject({ state: 'pending', attempts: 2, leaseToken: null })
    await clock.advance(OUTCOME_RETRY_MAX_MS)
    await eventually(() => results.length === 1, 'the write is tried again')
    expect(results).toEqual(['retry'])
    expect(await job()).toEqual(written)
    expect(logEntries().filter((line) => line.eventId === eventId && String(line.msg).includes('lease had been taken over'))).toEqual([])
    expect(calls).toEqual([2])
  })

  /**
   * One order's transition, taken by the handler's stream (its first attempt, inside a batch): the handler waits until
   * the test lets it return, as a receiver answering while the database connection is cut.
   */
  const heldFirstAttempt = async () => {
    const calls: string[] = []
    const returns = deferred<void>()
    const results: AttemptResult[] = []
    const reactions = createReactionRegistry().on('trade.*', HANDLER, async (event) => {
      calls.push(event.eventId)
      await returns.promise
    })
    // A stream begins at, and reads only below, its snapshot's xmin, which a transaction open anywhere in the cluster
    // holds back (on Postgres, another test file's, in another database). Begun then, the stream took the earlier
    // tests' transitions too; reading then, it found nothing and looked again only after a wait on this test's clock,
    // which nothing moves here (both failed so in CI). So it begins after every earlier transition, and the dispatcher
    // starts once this one is readable.
    await behindTheHorizon('the earlier transitions are readable', sql<number>`(select max(stream_position) from order_status_history)`)
    await ensureReactionStreams(database.db, reactions.names, new Date(clock.now()))
    const orderId = await moveNewOrder(database.db, { externalReference: `away-${++counter}`, statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date(clock.now()) })
    const event = await database.db.selectFrom('orderStatusHistory').select(['id', 'eventId']).where('orderId', '=', orderId).executeTakeFirstOrThrow()
    await behindTheHorizon('the transition is readable', sql<number>`(select stream_position from order_status_history where id = ${event.id})`)
    await startDispatcher(reactions, results)
    await eventually(() => calls.length === 1, 'the stream runs the transition')
    const stream = () => database.db.selectFrom('reactionStreams').select(['historyId', 'leaseToken']).where('handler', '=', HANDLER).executeTakeFirstOrThrow()
    const recorded = async () => {
      const batches = await database.db.selectFrom('reactionStreamBatches').select('done').where('handler', '=', HANDLER).execute()
      return batches.some((batch) => batch.done.map(String).includes(String(event.id)))
    }
    const jobs = () => database.db.selectFrom('reactionJobs').select('state').where('eventId', '=', event.eventId).execute()
    return { calls, returns, results, stream, recorded, jobs, historyId: String(event.id), reactions }
  }
  /** Until `recorded()`, the clock moving on meanwhile: the stream's loop reads again as its waits fall due. */
  const untilWrittenBack = (recorded: () => Promise<boolean>) =>
    eventually(async () => {
      if (await recorded()) return true
      await clock.advance(500)
      return false
    }, 'the batch is written back')
  /** A statement of the dispatcher's met the database away. */
  const statementRefused = () => eventually(() => refused > 0, 'a statement met the database away')
  /** Moves the clock `ms` on, a second at a time (the stream's retries and its loop's waits wake as they fall due). */
  const advanceBy = async (ms: number) => {
    for (let waited = 0; waited < ms; waited += 1_000) await clock.advance(Math.min(1_000, ms - waited))
  }

  it('a handler returning inside its batch: the batch’s write-back is written once the database answers again, and the handler is not called again', async () => {
    const { calls, returns, results, recorded, jobs, stream } = await heldFirstAttempt()
    // (past WRITE_BACK_MS: the batch is written back as it ends, not held for a later one's)
    await clock.advance(WRITE_BACK_MS)
    away = true
    returns.resolve()
    await statementRefused()
    // away for 15 s of the clock (within the 60-s lease, past half the stream's 30-s one)
    await advanceBy(15_000)
    expect(await recorded()).toBe(false)
    away = false
    await advanceBy(OUTCOME_RETRY_MAX_MS)
    await untilWrittenBack(recorded)
    // the stream reads on from the place written: nothing more for the handler
    await advanceBy(2_000)
    await eventually(async () => (await stream()).leaseToken !== null, 'the stream is read again')
    expect(calls).toHaveLength(1)
    expect(results).toEqual(['done'])
    expect(await jobs()).toEqual([])
    expect(logEntries().filter((line) => line.msg === 'recorded a reaction stream batch once the database answered again')).toHaveLength(1)
  })

  it('the read-ahead meeting the database away while a handler runs ends the read-ahead, not the batch: its handler is called once', async () => {
    const { calls, returns, results, recorded } = await heldFirstAttempt()
    away = true
    // the read-ahead's read falls due (gatherMs after the batch's read) and is refused
    await clock.advance(20)
    await statementRefused()
    await clock.advance(WRITE_BACK_MS)
    returns.resolve()
    await advanceBy(10_000)
    away = false
    await advanceBy(OUTCOME_RETRY_MAX_MS)
    await untilWrittenBack(recorded)
    await advanceBy(2_000)
    expect(calls).toHaveLength(1)
    expect(results).toEqual(['done'])
  })

  it('a batch’s write-back tried again writes nothing once another replica holds the stream: its lease token fences every try', async () => {
    const { returns, recorded, stream, historyId } = await heldFirstAttempt()
    const before = await stream()
    await clock.advance(WRITE_BACK_MS)
    away = true
    returns.resolve()
    await statementRefused()
    // meanwhile another replica took the stream (its lease ran out by that replica's clock)
    await database.db.updateTable('reactionStreams').set({ leaseToken: 'another-replica' }).where('handler', '=', HANDLER).execute()
    away = false
    await advanceBy(OUTCOME_RETRY_MAX_MS)
    await eventually(
      () => logEntries().some((line) => line.msg === 'reaction stream lease was taken over: the batch runs again elsewhere'),
      'the write-back is tried, and finds the stream taken',
    )
    expect(await recorded()).toBe(false)
    expect(await stream()).toEqual({ historyId: before.historyId, leaseToken: 'another-replica' })
    expect(historyId).not.toBe(before.historyId)
  })
  /** The stream's write-back statement (writeReactionStream). */
  const isWriteBack = (text: string) => /^\/\* prepared \*\/\s*with moved as/.test(text)

  it('a batch’s write-back whose answer was lost is its own when tried again: its events are recorded once', async () => {
    const { calls, returns, results, historyId } = await heldFirstAttempt()
    const logged = logEntries().length
    await clock.advance(WRITE_BACK_MS)
    loseAnswerOf = isWriteBack
    returns.resolve()
    await eventually(() => lost === 1, 'the write-back’s answer is lost')
    await advanceBy(OUTCOME_RETRY_MAX_MS)
    await eventually(
      () => logEntries().slice(logged).some((line) => line.msg === 'recorded a reaction stream batch once the database answered again'),
      'the write-back is tried again',
    )
    await advanceBy(2_000)
    const batches = await database.db.selectFrom('reactionStreamBatches').select('done').where('handler', '=', HANDLER).execute()
    expect(batches.flatMap((batch) => batch.done.map(String)).filter((id) => id === historyId)).toHaveLength(1)
    expect(logEntries().slice(logged).filter((line) => line.msg === 'reaction stream lease was taken over: the batch runs again elsewhere')).toEqual([])
    expect(calls).toHaveLength(1)
    expect(results).toEqual(['done'])
  })

  it('a batch’s write-back whose answer was lost hands its running call’s job on: the call’s outcome is written when it returns', async () => {
    const { calls, returns, results, jobs } = await heldFirstAttempt()
    const logged = logEntries().length
    loseAnswerOf = isWriteBack
    // none of the batch's handlers returns for HANDOFF_MS: the batch is written back with the call as a running job
    await eventually(async () => {
      if (lost === 1) return true
      await clock.advance(100)
      return false
    }, 'the write-back’s answer is lost')
    expect(await jobs()).toEqual([{ state: 'running' }])
    await advanceBy(OUTCOME_RETRY_MAX_MS)
    await eventually(
      () => logEntries().slice(logged).some((line) => line.msg === 'recorded a reaction stream batch once the database answered again'),
      'the write-back is tried again',
    )
    returns.resolve()
    await eventually(async () => (await jobs())[0]?.state === 'done', 'the handed-off call’s outcome is written')
    expect(results).toEqual(['done'])
    expect(calls).toHaveLength(1)
  })
  it('held batches whose write-back’s answer was lost are not recorded again with the next batch’s', async () => {
    const { calls, returns, reactions, historyId } = await heldFirstAttempt()
    // the handler returns at once: its batch is held in memory (WRITE_BACK_MS), and the next read, finding nothing,
    // writes it back; that write-back's answer is lost
    loseAnswerOf = isWriteBack
    returns.resolve()
    await eventually(() => lost === 1, 'the held batch’s write-back’s answer is lost')
    // a transition meanwhile: the next batch reads it on from the held place, and writes both back
    const orderId = await moveNewOrder(database.db, { externalReference: `away-${++counter}`, statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date(clock.now()) })
    const next = await database.db.selectFrom('orderStatusHistory').select('id').where('orderId', '=', orderId).executeTakeFirstOrThrow()
    const recordedIds = async () => {
      const batches = await database.db.selectFrom('reactionStreamBatches').select('done').where('handler', '=', HANDLER).execute()
      return batches.flatMap((batch) => batch.done.map(String))
    }
    await eventually(async () => {
      if ((await recordedIds()).includes(String(next.id))) return true
      await clock.advance(500)
      return false
    }, 'the next batch is written back')
    expect((await recordedIds()).filter((id) => id === historyId || id === String(next.id)).sort()).toEqual([historyId, String(next.id)].sort())
    expect(calls).toHaveLength(2)
  })
})
