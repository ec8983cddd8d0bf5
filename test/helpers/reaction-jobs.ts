// Reactions in tests: a dispatcher's settings, a stream worker, and what the reactions' tables hold (how many are
// not done yet).
import { type Kysely, sql } from 'kysely'
import { onTestFinished } from 'vitest'
import type { Clock } from '../../src/clock.js'
import type { Database } from '../../src/db/database.js'
import type { AttemptResult, DispatcherSettings } from '../../src/reactions/dispatcher-settings.js'
import { createSlots, type Slots } from '../../src/reactions/handler-slots.js'
import type { ReactionHandler } from '../../src/reactions/reaction-event.js'
import { reactionJobStats } from '../../src/reactions/reaction-job.repository.js'
import { createRetryLines } from '../../src/reactions/retry-lines.js'
import { createStreamWorker, type StreamWorker } from '../../src/reactions/stream-worker.js'
import { testLogger } from './log-sink.js'
import { eventually } from './reconcile-poller.js'

/**
 * A dispatcher's settings in tests: a lease and a backoff long enough that nothing is retried or taken back
 * unless the test moves its clock there.
 */
export const TEST_DISPATCHER_SETTINGS: DispatcherSettings = {
  concurrency: 4,
  maxAttempts: 3,
  leaseMs: 60_000,
  backoff: { baseS: 10, capS: 1_000 },
  safetyIntervalMs: 30_000,
  shutdownTimeoutMs: 5_000,
}

/**
 * One handler's stream worker, taking every event type, with slots of its own (`settings.concurrency`) or those given, the
 * test's clock, and no dispatcher around it: no job loop to wake, metrics only through `report`. Made within a test: its
 * "retrying later" line held back for the end of its second is written as that test finishes (a dispatcher's stop
 * writes its own), not into whatever test runs next in the worker.
 */
export function testStreamWorker(
  db: Kysely<Database>,
  {
    name,
    handler,
    clock,
    leaseToken,
    settings = TEST_DISPATCHER_SETTINGS,
    report = () => {},
    slots = createSlots(settings.concurrency),
  }: {
    name: string
    handler: ReactionHandler
    clock: Clock
    leaseToken: string
    settings?: DispatcherSettings
    report?: (handler: string, result: AttemptResult, count?: number) => void
    /** The handler's slots, shared with whatever else the test has take them (a dispatcher's job loop does). */
    slots?: Slots
  },
): StreamWorker {
  const retryingLater = createRetryLines()
  onTestFinished(() => retryingLater.flush())
  return createStreamWorker({
    db,
    name,
    handler,
    takes: () => true,
    clock,
    logger: testLogger(),
    settings,
    leaseToken,
    random: () => 0.5,
    report,
    jobsWritten: () => {},
    slots,
    describeFailure: String,
    retryingLater,
  })
}

/**
 * Waits until a stream can read every event in the history. A stream reads only events below its snapshot's
 * xmin, and on Postgres that xmin is the whole cluster's: a transaction open in another database (another test
 * file's, another suite's run beside this one) withholds the events committed after it began, until it ends.
 * A test that reads a batch right after writing its transitions waits here first, rather than reading fewer
 * events than it wrote. (On PGlite nothing else is open, and it returns at once.)
 */
export async function untilEventsReadable(db: Kysely<Database>, timeoutMs = 30_000): Promise<void> {
  const readable = async () => {
    const { rows } = await sql<{ withheld: boolean }>`
      select exists (select 1 from order_status_history
        where stream_position is not null and stream_position >= pg_snapshot_xmin(pg_current_snapshot())) as withheld`.execute(db)
    return !rows[0]!.withheld
  }
  await eventually(readable, 'no transaction in the cluster withholds the events', timeoutMs)
}

/**
 * Reaction jobs pending, running or failed, and the events committed that a handler's stream has not taken
 * yet: the service's own count (reactionJobStats), which reads them from one snapshot. Counted in two
 * statements, a stream's write-back committed between them put its events in neither, and the count said 0
 * with 164 jobs still to run (test/reactions-crash.test.ts failed 4 times in 11).
 */
export async function unfinishedReactionJobs(db: Kysely<Database>): Promise<number> {
  const { pending, running, failed } = await reactionJobStats(db, new Date())
  return pending + running + failed
}

/**
 * The job rows the handlers' streams would write for every event in the history (one per event and matching
 * handler, in event order), pending and not yet attempted: what a test of the operator's views starts from.
 * The streams themselves are not moved (no dispatcher runs in such a test).
 */
export async function writeJobRows(db: Kysely<Database>, routing: { handlersFor(type: string): readonly string[] }, now = new Date()): Promise<void> {
  const events = await db.selectFrom('orderStatusHistory').select(['eventId', 'orderId', 'sequence', 'toStatus']).orderBy('id').execute()
  for (const event of events) {
    for (const handler of routing.handlersFor(`trade.${event.toStatus}`)) {
      await db
        .insertInto('reactionJobs')
        .values({ eventId: event.eventId, orderId: event.orderId, sequence: event.sequence ?? 0, handler, runAt: now, createdAt: now, updatedAt: now })
        .onConflict((conflict) => conflict.columns(['eventId', 'handler']).doNothing())
        .execute()
    }
  }
}

export interface ReactionRecord {
  eventId: string
  orderId: number
  sequence: number
  handler: string
  state: string
  attempts: number
}

/**
 * Every (event, handler) the reactions have a record of: the job rows, and the events handled on their first
 * attempt, which have none (their stream batch holds them: migrations/0011_reaction_stream_batches.ts).
 */
export async function reactionRecords(db: Kysely<Database>, handler?: string): Promise<ReactionRecord[]> {
  const ofHandler = (column: string) => (handler === undefined ? sql`true` : sql`${sql.ref(column)} = ${handler}`)
  const { rows } = await sql<ReactionRecord>`
    select j.event_id, j.order_id, j.sequence, j.handler, j.state, j.attempts from reaction_jobs j where ${ofHandler('j.handler')}
    union all
    select h.event_id, h.order_id, h.sequence, b.handler, 'done', 1
    from reaction_stream_batches b cross join lateral unnest(b.done) as d(history_id)
    join order_status_history h on h.id = d.history_id
    where ${ofHandler('b.handler')}
      and not exists (select 1 from reaction_jobs j where j.event_id = h.event_id and j.handler = b.handler)`.execute(db)
  return rows
}

/** Empties the reactions' tables (jobs, batch records, streams) between tests. */
export async function clearReactions(db: Kysely<Database>): Promise<void> {
  await db.deleteFrom('reactionJobs').execute()
  await db.deleteFrom('reactionStreamBatches').execute()
  await db.deleteFrom('reactionStreams').execute()
}
