// The queries on reaction_jobs: one row per (event, handler), written by the handler's stream once it has made
// the first attempt (reaction-stream.repository.ts writes them). This file is the rest: the retries' claim and
// write-backs, and the operator's views. Row types never leave this file.
//
// States: pending (waiting for run_at) → running (claimed: a lease token and its end) → done, or back to
// pending with a later run_at after a throw, or failed after the last attempt (the dead letter), or skipped
// uncalled when its handler no longer takes its event's type. An operator moves a failed job back to pending
// (retry) or to skipped.
//
// The claim is the poller's pattern (orders/poll-schedule.repository.ts): FOR UPDATE SKIP LOCKED and, in the
// same statement, a lease. A claimed job's run_at is set to its lease end, so "pending and due" and
// "running but its lease ran out" are one condition, run_at <= now, on one partial index. A job is only
// claimable when no job of the same (order, handler) with a smaller sequence is unfinished (not done or
// skipped): one order's events reach one handler strictly in order, and a failed job holds back the rest.
// Every write-back of a claimed job checks its lease token: a dispatcher whose lease ran out (and whose
// job was claimed again) cannot overwrite what the newer claim writes. Each outcome's write also leaves the claim's
// token in outcome_token (migrations/0022), which the next claim does not touch: a write tried again after its answer
// was lost (the connection cut after its COMMIT) finds the fence closed, and that column says the outcome is its own
// (ownOutcomes), not another claim's. Asked only after a fence's miss: a write that lands costs what it did.
import type { JobWaitedFor } from './retried-text.js'
import { type Kysely, type RawBuilder, sql } from 'kysely'
import type { Database } from '../db/database.js'
import { writeTime } from '../db/write-time.js'
import { PREPARED } from '../db/open-database.js'
import { type WalkedBatch, walkedBatch, type WalkedBatchRow } from '../db/walked-batch.js'
import { reactionChannelSql } from '../db/reaction-channel.js'
import { isJobId } from './job-id.js'
import type { ReactionEvent } from './reaction-event.js'
import { reactionStreamBacklog } from './reaction-stream.repository.js'

export type ReactionJobState = 'pending' | 'running' | 'done' | 'failed' | 'skipped'
export const REACTION_JOB_STATES: readonly ReactionJobState[] = ['pending', 'running', 'done', 'failed', 'skipped']

export interface ClaimedJob {
  id: string
  handler: string
  /** This claim's attempt: 1 on the first call, counting claims whose dispatcher died mid-handler. */
  attempt: number
  /** Claimed while running: its last attempt's lease ran out (a replica that died mid-call, a handler past its lease). */
  reclaimed: boolean
  leaseToken: string
  leaseExpiresAt: Date
  /** When the transition committed (the job's insert), for the commit-to-handler latency. */
  createdAt: Date
  event: ReactionEvent
}

export interface ClaimOptions {
  /** The clock's now: a parameter rather than SQL now(), so an injected clock decides what is due. */
  now: Date
  limit: number
  leaseMs: number
  leaseToken: string
  /**
   * Handlers whose jobs this claim leaves alone: their slots (REACTION_CONCURRENCY each) are taken, and jobs
   * claimed for them would only wait in the process while other handlers' due jobs were not claimed.
   */
  skipHandlers?: readonly string[]
  /**
   * The handlers registered in the claiming process: it takes only their jobs, and a job of a handler it does not
   * have waits for a replica that does (replicas with different handlers, in a rolling deploy that turns one on).
   * Absent: every handler's jobs.
   */
  handlers?: readonly string[] | undefined
}

/**
 * Claims up to `limit` due jobs (oldest run_at first) and returns them with their events: one statement,
 * one round trip (the claim's update returns each job's event, joined from the history).
 */
export async function claimReactionJobs(db: Kysely<Database>, options: ClaimOptions): Promise<ClaimedJob[]> {
  return (await claimReactionJobsAndNext(db, options)).jobs
}

/**
 * The claim, and when the dispatcher must look again if it claimed fewer than `limit`: the earliest
 * run_at after `now` among the jobs it did not claim (as nextRunAt(), read by the same statement).
 * `nextRunAt` is undefined when nothing was claimed: ask nextRunAt() then.
 */
export async function claimReactionJobsAndNext(
  db: Kysely<Database>,
  options: ClaimOptions,
): Promise<{ jobs: ClaimedJob[]; nextRunAt: Date | null | undefined }> {
  const { rows } = await claimReactionJobsQuery(options).execute(db)
  const [first] = rows
  const nextRunAt = first === undefined ? undefined : first.nextRunAt === null ? null : new Date(first.nextRunAt)
  const jobs = rows.map((row) => {
    // the job and its event are written by one statement; a missing event is a broken database
    if (row.toStatus === null) throw new Error(`reaction job ${row.id} names event ${row.eventId}, which does not exist`)
    return {
      id: String(row.id),
      handler: row.handler,
      attempt: row.attempts,
      reclaimed: row.claimedFrom === 'running',
      leaseToken: options.leaseToken,
      leaseExpiresAt: new Date(row.leaseExpiresAt),
      createdAt: new Date(row.createdAt),
      event: toEvent({ ...row, toStatus: row.toStatus }),
    }
  })
  return { jobs, nextRunAt }
}

interface ClaimedRow extends Omit<EventRow, 'toStatus'> {
  id: string | number
  handler: string
  attempts: number
  /** The job's state before this claim: pending, or running with its lease run out. */
  claimedFrom: string
  leaseExpiresAt: Date | string
  createdAt: Date | string
  /** null only when the job's event is missing (left join) */
  toStatus: string | null
  nextRunAt: Date | string | null
}

/**
 * The claim statement itself, unexecuted: what a plan check (EXPLAIN) compiles. Prepared on Postgres
 * (it runs on every wake-up of every replica): parsed and planned once per connection.
 * The locked set is materialized, computed once before the update joins it; the event is joined to
 * that set (not to the updated table), so a job whose event were missing still shows up, and fails loudly.
 */
export function claimReactionJobsQuery({ now, limit, leaseMs, leaseToken, skipHandlers = [], handlers }: ClaimOptions) {
  const leaseEnd = new Date(now.getTime() + leaseMs)
  const registered = handlers === undefined ? null : [...handlers]
  return sql<ClaimedRow>`${sql.raw(PREPARED)}
    with due as materialized (
      select job.id, job.event_id, job.state as claimed_from
      from reaction_jobs job
      where job.state in ('pending', 'running')
        and job.run_at <= ${now}
        and job.handler <> all(${[...skipHandlers]}::text[])
        and (${registered}::text[] is null or job.handler = any(${registered}::text[]))
        and not exists (
          select 1 from reaction_jobs earlier
          where earlier.order_id = job.order_id
            and earlier.handler = job.handler
            and earlier.sequence < job.sequence
            and earlier.state not in ('done', 'skipped')
        )
      order by job.run_at
      limit ${limit}
      for update skip locked
    )
    update reaction_jobs set
      state = 'running',
      lease_token = ${leaseToken},
      lease_expires_at = ${leaseEnd},
      run_at = ${leaseEnd},
      attempts = reaction_jobs.attempts + 1,
      updated_at = ${now}
    from due left join lateral (
      -- limit 1 (event_id is unique anyway) keeps this a lookup per claimed job on the event_id index,
      -- never a join over the whole history
      select * from order_status_history history where history.event_id = due.event_id limit 1
    ) event on true
    where reaction_jobs.id = due.id
    returning reaction_jobs.id, reaction_jobs.handler, reaction_jobs.attempts, due.claimed_from, reaction_jobs.lease_expires_at,
      reaction_jobs.created_at, due.event_id, event.order_id, event.from_status, event.to_status, event.source,
      event.sequence, event.trade_id, event.external_reference, event.recorded_at,
      -- only when the claim did not fill every slot (a full claim's dispatcher looks again when a handler
      -- returns); not correlated, so evaluated once (an InitPlan), on the snapshot before this update. Its walk
      -- from now crosses the entries that recently finished jobs left behind, so it is skipped when not needed
      case when (select count(*) from due) < ${limit} then
        (select min(later.run_at) from reaction_jobs later
          where later.state in ('pending', 'running') and later.run_at > ${now}
            and (${registered}::text[] is null or later.handler = any(${registered}::text[])))
      end as next_run_at`
}

interface Lease {
  id: string
  leaseToken: string
  now: Date
}

/** The handler succeeded. False when the lease was lost (the job was claimed again meanwhile). */
export async function completeJob(db: Kysely<Database>, { id, leaseToken, now }: Lease): Promise<boolean> {
  return (await completeJobs(db, [{ id, leaseToken }], now)).has(id)
}

/**
 * Several handlers succeeded: one statement marks them all done (the dispatcher's group of completions).
 * Returns the ids written; a job missing from it had lost its lease (claimed again meanwhile).
 */
export async function completeJobs(
  db: Kysely<Database>,
  leases: readonly { id: string; leaseToken: string }[],
  now: Date,
): Promise<Set<string>> {
  if (leases.length === 0) return new Set()
  const input = JSON.stringify(leases.map((lease) => ({ id: lease.id, lease_token: lease.leaseToken })))
  const { rows } = await sql<{ id: string | number }>`${sql.raw(PREPARED)}
    update reaction_jobs job set
      state = 'done', lease_token = null, lease_expires_at = null, last_error = null, finished_at = ${now}, updated_at = ${now},
      outcome_token = done.lease_token
    from json_to_recordset(${input}::json) as done(id bigint, lease_token text)
    where job.id = done.id and job.lease_token = done.lease_token and job.state = 'running'
    returning job.id`.execute(db)
  const written = new Set(rows.map((row) => String(row.id)))
  if (written.size === leases.length) return written
  for (const id of await ownOutcomes(db, leases.filter((lease) => !written.has(lease.id)))) written.add(id)
  return written
}

/**
 * Of `leases` whose outcome's write found its fence closed (the row no longer `running` under the token), the ids
 * whose row holds an outcome written under that very token: an earlier try of the same write whose COMMIT landed and
 * whose answer was lost (the connection cut after it). The others were claimed again meanwhile: lease lost.
 * One statement, by the primary key; only after a miss.
 */
export async function ownOutcomes(db: Kysely<Database>, leases: readonly { id: string; leaseToken: string }[]): Promise<Set<string>> {
  if (leases.length === 0) return new Set()
  const input = JSON.stringify(leases.map((lease) => ({ id: lease.id, lease_token: lease.leaseToken })))
  const { rows } = await sql<{ id: string | number }>`
    select job.id from reaction_jobs job
    join json_to_recordset(${input}::json) as mine(id bigint, lease_token text) on job.id = mine.id
    where job.outcome_token = mine.lease_token`.execute(db)
  return new Set(rows.map((row) => String(row.id)))
}

/** One job's fenced write: true when it wrote, or when an earlier try of it under the same token had (ownOutcomes). */
async function writtenUnder(db: Kysely<Database>, { id, leaseToken }: { id: string; leaseToken: string }, updated: bigint): Promise<boolean> {
  return updated > 0n || (await ownOutcomes(db, [{ id, leaseToken }])).has(id)
}

/** The handler threw and has attempts left: pending again at `runAt`. */
export async function retryJobLater(
  db: Kysely<Database>,
  { id, leaseToken, now, runAt, error }: Lease & { runAt: Date; error: string },
): Promise<boolean> {
  const result = await leased(db, id, leaseToken)
    .set({ state: 'pending', runAt, leaseToken: null, leaseExpiresAt: null, lastError: error, updatedAt: now, outcomeToken: leaseToken })
    .executeTakeFirst()
  return writtenUnder(db, { id, leaseToken }, result.numUpdatedRows)
}

/** The handler threw on its last attempt: the dead letter, until an operator retries or skips it. */
export async function failJob(
  db: Kysely<Database>,
  { id, leaseToken, now, error, uncalled = false }: Lease & { error: string; uncalled?: boolean },
): Promise<boolean> {
  const result = await leased(db, id, leaseToken)
    .set((eb) => ({
      state: 'failed',
      leaseToken: null,
      leaseExpiresAt: null,
      finishedAt: now,
      updatedAt: now,
      outcomeToken: leaseToken,
      // failed without a call (its last attempt overran its lease, or REACTION_MAX_ATTEMPTS was lowered below the
      // attempts it had had): the claim's attempt is taken back, so the job shows the attempts its handler was called
      // for (it said 5 of 4), and the error its last call left is kept below the reason (it was replaced by it)
      ...(uncalled
        ? { attempts: eb('attempts', '-', 1), lastError: sql<string>`${error} || coalesce(${'\n(the error before: '} || ${eb.ref('lastError')} || ')', '')` }
        : { lastError: error }),
    }))
    .executeTakeFirst()
  return writtenUnder(db, { id, leaseToken }, result.numUpdatedRows)
}

/**
 * The job's handler no longer takes its event's type (the operator narrowed FORWARD_EVENTS or AMQP_EVENTS,
 * or a fork its registration): skipped without a call, so the order's later events proceed. `reason` becomes
 * the last error's first line, the error before it (if any) kept below it in parentheses; the claim's
 * attempt is taken back, since the handler was not called. False when the lease was lost.
 */
export async function skipJobNotTaken(
  db: Kysely<Database>,
  { id, leaseToken, now, reason }: Lease & { reason: string },
): Promise<boolean> {
  const result = await leased(db, id, leaseToken)
    .set((eb) => ({
      state: 'skipped',
      leaseToken: null,
      leaseExpiresAt: null,
      attempts: eb('attempts', '-', 1),
      // on a line of its own, so the console's short form shows the reason; flattened (the CLI) it still reads
      lastError: sql<string>`${reason} || coalesce(${'\n(the error before: '} || ${eb.ref('lastError')} || ')', '')`,
      finishedAt: now,
      updatedAt: now,
      outcomeToken: leaseToken,
    }))
    .executeTakeFirst()
  return writtenUnder(db, { id, leaseToken }, result.numUpdatedRows)
}

/**
 * Gives back leases whose handler did not finish (shutdown): pending and due now, the interrupted claim's
 * attempt taken back (the handler was stopped, it did not fail). Returns how many this statement wrote (a try after a
 * lost answer asks ownOutcomes).
 */
export async function releaseJobs(db: Kysely<Database>, { ids, leaseToken, now }: { ids: readonly string[]; leaseToken: string; now: Date }): Promise<number> {
  if (ids.length === 0) return 0
  const result = await db
    .updateTable('reactionJobs')
    .set((eb) => ({
      state: 'pending',
      runAt: now,
      leaseToken: null,
      leaseExpiresAt: null,
      attempts: eb('attempts', '-', 1),
      updatedAt: now,
      outcomeToken: leaseToken,
    }))
    .where('id', 'in', [...ids])
    .where('leaseToken', '=', leaseToken)
    .where('state', '=', 'running')
    .executeTakeFirst()
  return Number(result.numUpdatedRows)
}

function leased(db: Kysely<Database>, id: string, leaseToken: string) {
  return db.updateTable('reactionJobs').where('id', '=', id).where('leaseToken', '=', leaseToken).where('state', '=', 'running')
}

/**
 * When the dispatcher must look again: the earliest run_at after `now` among pending and running jobs (a
 * backoff ending, a lease running out). Jobs due already but held back by an earlier unfinished job of
 * their order are not counted: what frees them (that job finishing) wakes the dispatcher itself.
 */
export async function nextRunAt(db: Kysely<Database>, now: Date): Promise<Date | null> {
  const row = await db
    .selectFrom('reactionJobs')
    .select((eb) => eb.fn.min('runAt').as('next'))
    .where('state', 'in', ['pending', 'running'])
    .where('runAt', '>', now)
    .executeTakeFirstOrThrow()
  return row.next === null ? null : new Date(row.next)
}

/**
 * The handler's system is back (recovery-watch.ts): the jobs of `eventIds` (the events that failed while it was
 * away) still waiting out a backoff are due now, and every replica's dispatcher is woken for them. Returns how
 * many jobs it moved. Only pending jobs whose run_at is ahead: a running job's run_at is its lease's end, a failed
 * one waits for an operator, and a job held back behind an earlier one of its order stays held (the claim checks
 * that, whatever run_at says). SKIP LOCKED: another replica pulling the same jobs forward at once moves the ones
 * it locked, and neither waits for the other nor deadlocks with it.
 * "Now" is `now`, the replica's clock, or the database's time when that is earlier (writeTime): by a replica's clock
 * ahead of the database's, the jobs were made due that much later for every replica on the database's clock, and those
 * whose backoff ended within it were not moved at all (an hour ahead, none under the default REACTION_BACKOFF_CAP_S).
 */
export async function pullForwardJobs(
  db: Kysely<Database>,
  { handler, eventIds, now }: { handler: string; eventIds: readonly string[]; now: Date },
): Promise<number> {
  let moved = 0
  const at = writeTime(now)
  // (a statement's parameters are bounded: a long outage's events go in parts, each on the (event, handler) key)
  for (let start = 0; start < eventIds.length; start += PULL_FORWARD_PART) {
    const part = eventIds.slice(start, start + PULL_FORWARD_PART)
    const result = await db
      .updateTable('reactionJobs')
      .set({ runAt: at, updatedAt: at })
      .where('id', 'in', (eb) =>
        eb
          .selectFrom('reactionJobs')
          .select('id')
          .where('eventId', 'in', part)
          .where('handler', '=', handler)
          .where('state', '=', 'pending')
          .where('runAt', '>', at)
          .forUpdate()
          .skipLocked(),
      )
      .executeTakeFirst()
    moved += Number(result.numUpdatedRows)
  }
  if (moved > 0) await notifyDispatchers(db)
  return moved
}

const PULL_FORWARD_PART = 1_000

// --- the operator's view (the `reactions` CLI) ---

export interface ReactionJob {
  id: string
  eventId: string
  orderId: number
  externalReference: string | null
  type: string
  sequence: number
  handler: string
  state: ReactionJobState
  attempts: number
  runAt: Date
  leaseExpiresAt: Date | null
  lastError: string | null
  createdAt: Date
  updatedAt: Date
  finishedAt: Date | null
}

function jobsWithEvents(db: Kysely<Database>) {
  return db
    .selectFrom('reactionJobs as job')
    .innerJoin('orderStatusHistory as event', 'event.eventId', 'job.eventId')
    .select([
      'job.id',
      'job.eventId',
      'job.orderId',
      'event.externalReference',
      'event.toStatus',
      'job.sequence',
      'job.handler',
      'job.state',
      'job.attempts',
      'job.runAt',
      'job.leaseExpiresAt',
      'job.lastError',
      'job.createdAt',
      'job.updatedAt',
      'job.finishedAt',
    ])
}

type JobRow = Awaited<ReturnType<ReturnType<typeof jobsWithEvents>['executeTakeFirstOrThrow']>>

function toJob(row: JobRow): ReactionJob {
  return {
    id: String(row.id),
    eventId: row.eventId,
    orderId: row.orderId,
    externalReference: row.externalReference,
    type: `trade.${row.toStatus}`,
    sequence: row.sequence,
    handler: row.handler,
    state: row.state as ReactionJobState,
    attempts: row.attempts,
    runAt: new Date(row.runAt),
    leaseExpiresAt: row.leaseExpiresAt === null ? null : new Date(row.leaseExpiresAt),
    lastError: row.lastError,
    createdAt: new Date(row.createdAt),
    updatedAt: new Date(row.updatedAt),
    finishedAt: row.finishedAt === null ? null : new Date(row.finishedAt),
  }
}

/** A job in the operator's list; id null: an event its handler took on the first attempt (no job row). */
export type ListedJob = Omit<ReactionJob, 'id'> & { id: string | null }

export async function listJobs(
  db: Kysely<Database>,
  { state, handler, limit = 100 }: { state?: ReactionJobState; handler?: string; limit?: number } = {},
): Promise<ListedJob[]> {
  let query = jobsWithEvents(db)
  if (state) query = query.where('job.state', '=', state)
  if (handler) query = query.where('job.handler', '=', handler)
  // newest first: what an operator looks at is what just happened
  const rows: ListedJob[] = (await query.orderBy('job.id', 'desc').limit(limit).execute()).map(toJob)
  if (state !== undefined && state !== 'done') return rows
  // the done first attempts are listed beside the rows, the latest change of each first
  const firstAttempts = (await listFirstAttemptsDone(db, { handler, limit })).map(({ cursor: _cursor, ...job }) => job)
  const changed = (job: ListedJob) => (job.finishedAt ?? job.updatedAt).getTime()
  return [...rows, ...firstAttempts].sort((a, b) => changed(b) - changed(a)).slice(0, limit)
}

// --- the record of first attempts that succeeded (migrations/0011_reaction_stream_batches.ts) ---
// A stream batch writes no job row for an event its handler took on the first attempt: the batch's row holds
// the event's history id. Such an event is done, after one attempt, when its batch was written back. A job
// row of the same (event, handler), where one exists, is the record instead (an operator's action on it).

/** Where a list of first attempts goes on: before this event of this batch (`<batch id>.<place in it>`). */
export interface FirstAttemptCursor {
  batchId: string
  n: number
}

/**
 * Reads a cursor as the console writes it (`<batch id>.<place in it>`); undefined when it is not one. The batch
 * id is a bigint: 19 digits past its largest came back as the database's refusal, a JSON 400 naming no field.
 */
export function parseFirstAttemptCursor(text: string): FirstAttemptCursor | undefined {
  const match = /^([1-9]\d{0,18})\.([1-9]\d{0,5})$/.exec(text)
  return match && isJobId(match[1]!) ? { batchId: match[1]!, n: Number(match[2]) } : undefined
}

export const formatFirstAttemptCursor = ({ batchId, n }: FirstAttemptCursor) => `${batchId}.${n}`

/**
 * The events handled on their first attempt (of `handler`), newest batch first and, within a batch, the last
 * event first; from before `before` when given. Reads at most `limit` batches (each holds at least one).
 */
export async function listFirstAttemptsDone(
  db: Kysely<Database>,
  { handler, limit, before }: { handler?: string | undefined; limit: number; before?: FirstAttemptCursor | undefined },
): Promise<(ListedJob & { cursor: FirstAttemptCursor })[]> {
  const ofHandler = handler === undefined ? sql`true` : sql`handler = ${handler}`
  const fromBatch = before === undefined ? sql`true` : sql`id <= ${before.batchId}::bigint`
  const inBatch = before === undefined ? sql`true` : sql`(b.id, d.n) < (${before.batchId}::bigint, ${before.n}::bigint)`
  const { rows } = await sql<FirstAttemptRow & { batchId: string | number; n: string | number }>`
    select b.id as batch_id, d.n, h.event_id, h.order_id, h.external_reference, h.to_status, h.sequence, b.handler,
      h.recorded_at, b.finished_at
    from (
      select id, handler, done, finished_at from reaction_stream_batches where ${ofHandler} and ${fromBatch}
      order by id desc limit ${limit}
    ) b
    cross join lateral unnest(b.done) with ordinality as d(history_id, n)
    join order_status_history h on h.id = d.history_id
    where ${inBatch}
      and not exists (select 1 from reaction_jobs j where j.event_id = h.event_id and j.handler = b.handler)
    order by b.id desc, d.n desc
    limit ${limit}`.execute(db)
  return rows.map((row) => ({ ...firstAttemptJob(row), cursor: { batchId: String(row.batchId), n: Number(row.n) } }))
}

interface FirstAttemptRow {
  eventId: string
  orderId: number
  externalReference: string | null
  toStatus: string
  sequence: number | null
  handler: string
  recordedAt: Date | string
  finishedAt: Date | string
}

function firstAttemptJob(row: FirstAttemptRow): ListedJob {
  const finishedAt = new Date(row.finishedAt)
  return {
    id: null,
    eventId: row.eventId,
    orderId: row.orderId,
    externalReference: row.externalReference,
    type: `trade.${row.toStatus}`,
    sequence: row.sequence ?? 0,
    handler: row.handler,
    state: 'done',
    attempts: 1,
    runAt: finishedAt,
    leaseExpiresAt: null,
    lastError: null,
    createdAt: new Date(row.recordedAt),
    updatedAt: finishedAt,
    finishedAt,
  }
}

/**
 * The done first attempts of these events, by handler: for each event and each handler's stream, the first
 * batch whose place is at or after the event's (one probe of reaction_stream_batches_place_idx) holds it
 * when its handler took it on the first attempt.
 */
export function firstAttemptsOfEventsQuery(eventIds: readonly string[]) {
  return sql<{ eventId: string; handler: string }>`
    select h.event_id, s.handler
    from order_status_history h
    cross join reaction_streams s
    cross join lateral (
      select b.done from reaction_stream_batches b
      where b.handler = s.handler and (b.to_position, b.to_history_id) >= (h.stream_position, h.id)
      order by b.to_position, b.to_history_id
      limit 1
    ) b
    where h.event_id = any(${[...eventIds]}::uuid[]) and h.stream_position is not null and h.id = any(b.done)
      and not exists (select 1 from reaction_jobs j where j.event_id = h.event_id and j.handler = s.handler)
    order by h.id, s.handler`
}

/** How many events were handled on the first attempt in batches written back before `before`. */
async function countFirstAttemptsDoneBefore(db: Kysely<Database>, before: Date): Promise<number> {
  const row = await db
    .selectFrom('reactionStreamBatches')
    .select((eb) => eb.fn.coalesce(eb.fn.sum<string>('events'), eb.lit(0)).as('events'))
    .where('finishedAt', '<', before)
    .executeTakeFirstOrThrow()
  return Number(row.events)
}

/**
 * Looks at the next `limit` batch records by id after `afterId` and deletes those written back before `before`;
 * returns how many batches and events it deleted, the last id it looked at and when that batch was written back.
 * Batches are written back in id order, so the walk can end at one written back lately (retention's `walkEnds`):
 * a pass with nothing to delete reads one page of the primary key, not the whole table.
 */
export async function deleteFirstAttemptsDoneBefore(
  db: Kysely<Database>,
  { before, afterId, limit }: { before: Date; afterId: string | undefined; limit: number },
): Promise<WalkedBatch & { batches: number; events: number }> {
  const { rows } = await sql<WalkedBatchRow<string> & { batches: string; events: string | null }>`
    with scanned as (
      select id, finished_at, events from reaction_stream_batches where id > ${afterId ?? '0'}::bigint order by id limit ${limit}
    ), deleted as (
      delete from reaction_stream_batches b using scanned s
      where b.id = s.id and s.finished_at < ${before}
      returning s.events
    )
    select (select count(*) from scanned) as scanned,
      (select id::text from scanned order by id desc limit 1) as last_id,
      (select finished_at from scanned order by id desc limit 1) as last_at,
      (select count(*) from deleted) as batches,
      (select sum(events) from deleted) as events`.execute(db)
  const row = rows[0]!
  return { ...walkedBatch(row), batches: Number(row.batches), events: Number(row.events ?? 0) }
}

export async function findJob(db: Kysely<Database>, id: string): Promise<(ReactionJob & { event: ReactionEvent }) | undefined> {
  const job = await jobsWithEvents(db).where('job.id', '=', id).executeTakeFirst()
  if (!job) return undefined
  const event = await db
    .selectFrom('orderStatusHistory')
    .select(['eventId', 'orderId', 'fromStatus', 'toStatus', 'source', 'sequence', 'tradeId', 'externalReference', 'recordedAt'])
    .where('eventId', '=', job.eventId)
    .executeTakeFirstOrThrow()
  return { ...toJob(job), event: toEvent(event) }
}

/**
 * What each of these pending jobs waits for: the order's earliest job for the same handler that is not done or
 * skipped (a failed one holds the rest back until retried or skipped), as the claim's condition has it. A job
 * missing from the map waits for nothing but its due time. `reactions list` showed such a job as `pending 0`, due
 * in the past, with no error.
 */
export async function jobsWaitedFor(db: Kysely<Database>, ids: readonly string[]): Promise<Map<string, JobWaitedFor>> {
  if (ids.length === 0) return new Map()
  const { rows } = await sql<{ id: string | number; earlierId: string | number; earlierSequence: number; earlierState: string }>`
    select job.id, earlier.id as earlier_id, earlier.sequence as earlier_sequence, earlier.state as earlier_state
    from reaction_jobs job
    cross join lateral (
      select e.id, e.sequence, e.state from reaction_jobs e
      where e.order_id = job.order_id and e.handler = job.handler and e.sequence < job.sequence
        and e.state not in ('done', 'skipped')
      order by e.sequence
      limit 1
    ) earlier
    where job.id = any(${ids.filter(isJobId)}::bigint[]) and job.state = 'pending'`.execute(db)
  return new Map(rows.map((row) => [String(row.id), { id: String(row.earlierId), sequence: row.earlierSequence, state: row.earlierState }]))
}

/**
 * Whether a running job was handed off under its handler's stream lease (its holder's write-back left it running
 * under the stream's lease token): `reactions release-stream` gives such a job back, where any other running job
 * waits out its own lease.
 */
export async function runsUnderStreamLease(db: Kysely<Database>, id: string): Promise<boolean> {
  const row = await db
    .selectFrom('reactionJobs as job')
    .innerJoin('reactionStreams as stream', (join) => join.onRef('stream.handler', '=', 'job.handler').onRef('stream.leaseToken', '=', 'job.leaseToken'))
    .select('job.id')
    .where('job.id', '=', id)
    .where('job.state', '=', 'running')
    .executeTakeFirst()
  return row !== undefined
}

export type OperatorResult = 'retried' | 'skipped' | 'not_found' | 'not_allowed'

// An operator's retry and skip are dated by writeTime (db/write-time.ts): the database's time, or the service's clock
// when that is earlier (the console passes it: its dispatcher compares due times with it). A command passes none:
// `reactions retry` from a machine an hour ahead of the database wrote the retry due an hour later, and its skip
// finished an hour from now.

// what an operator's retry writes: pending now, attempts counted from zero
const retried = (at: RawBuilder<Date>) => ({ state: 'pending' as const, runAt: at, attempts: 0, finishedAt: null, updatedAt: at })

/**
 * An operator's retry: a failed (or backing-off pending) job runs again now, with its attempts counted
 * from zero. A running, done or skipped job is not touched. `waitsBehind`: the order's earliest job for the same
 * handler that is not done or skipped yet, when there is one: the retried job runs only after it (order is kept).
 * `now`: the calling service's clock (see above); none from a command.
 */
export async function retryJob(
  db: Kysely<Database>,
  id: string,
  now?: Date,
): Promise<{ result: OperatorResult; state?: ReactionJobState; waitsBehind?: JobWaitedFor }> {
  const updated = await db
    .updateTable('reactionJobs')
    .set(retried(writeTime(now)))
    .where('id', '=', id)
    .where('state', 'in', ['failed', 'pending'])
    .returning('id')
    .executeTakeFirst()
  if (!updated) return refusal(db, id)
  await notifyDispatchers(db)
  const waitsBehind = (await jobsWaitedFor(db, [id])).get(id)
  return waitsBehind ? { result: 'retried', waitsBehind } : { result: 'retried' }
}


/** Every failed job back to pending now; returns their ids. `now`: as retryJob's. */
export async function retryFailedJobs(db: Kysely<Database>, now?: Date): Promise<string[]> {
  const rows = await db
    .updateTable('reactionJobs')
    .set(retried(writeTime(now)))
    .where('state', '=', 'failed')
    .returning('id')
    .execute()
  if (rows.length > 0) await notifyDispatchers(db)
  return rows.map((row) => String(row.id)).sort((a, b) => Number(a) - Number(b))
}

/** An operator gives up on a failed or pending job: skipped, so the order's later events proceed. `now`: as retryJob's. */
export async function skipJob(db: Kysely<Database>, id: string, now?: Date): Promise<{ result: OperatorResult; state?: ReactionJobState }> {
  const at = writeTime(now)
  const updated = await db
    .updateTable('reactionJobs')
    .set({ state: 'skipped', leaseToken: null, leaseExpiresAt: null, finishedAt: at, updatedAt: at })
    .where('id', '=', id)
    .where('state', 'in', ['failed', 'pending'])
    .returning('id')
    .executeTakeFirst()
  if (updated) {
    // the order's next event for this handler may be claimable now
    await notifyDispatchers(db)
    return { result: 'skipped' }
  }
  return refusal(db, id)
}

/** Wakes every replica's dispatcher (as the observation statement does when it writes an event a handler takes). */
async function notifyDispatchers(db: Kysely<Database>): Promise<void> {
  await sql`select pg_notify(${reactionChannelSql}, '')`.execute(db)
}

async function refusal(db: Kysely<Database>, id: string): Promise<{ result: OperatorResult; state?: ReactionJobState }> {
  const row = await db.selectFrom('reactionJobs').select('state').where('id', '=', id).executeTakeFirst()
  return row ? { result: 'not_allowed', state: row.state as ReactionJobState } : { result: 'not_found' }
}

export interface ReactionJobStats {
  /** Job rows waiting to run (a retry's backoff, behind an earlier job), and the events the streams have not taken yet. */
  pending: number
  running: number
  failed: number
  /** Seconds since the oldest job or stream event still to run was committed; 0 when none. */
  oldestPendingAgeS: number
}

/**
 * The metrics' gauges. Counts only the states the partial indexes hold (pending, running, failed): done
 * and skipped jobs grow without bound, and their rate is the attempts counter's. The events the streams
 * have not read yet count as pending: those of `handlers` (the registered ones) when given, else of every
 * stream, a removed handler's too.
 */
export async function reactionJobStats(db: Kysely<Database>, now: Date, handlers?: readonly string[]): Promise<ReactionJobStats> {
  // one snapshot for the job rows and the streams' backlog: a stream's write-back turns backlog into job rows in
  // one commit, and read in two statements with that commit between them its events were counted in neither
  return db
    .transaction()
    .setIsolationLevel('repeatable read')
    .execute((trx) => jobStatsIn(trx, now, handlers))
}

async function jobStatsIn(db: Kysely<Database>, now: Date, handlers: readonly string[] | undefined): Promise<ReactionJobStats> {
  const rows = await db
    .selectFrom('reactionJobs')
    .select((eb) => ['state', eb.fn.countAll<string>().as('count'), eb.fn.min('createdAt').as('oldest')])
    .where('state', 'in', ['pending', 'running', 'failed'])
    .groupBy('state')
    .execute()
  const stats: ReactionJobStats = { pending: 0, running: 0, failed: 0, oldestPendingAgeS: 0 }
  let oldest: number | undefined
  for (const row of rows) {
    stats[row.state as 'pending' | 'running' | 'failed'] = Number(row.count)
    if (row.state !== 'failed' && row.oldest !== null) {
      const at = new Date(row.oldest).getTime()
      oldest = oldest === undefined ? at : Math.min(oldest, at)
    }
  }
  // the events committed and not yet read by their handler's stream are pending too
  const backlog = await reactionStreamBacklog(db, { handlers })
  stats.pending += backlog.events
  if (backlog.oldest) oldest = oldest === undefined ? backlog.oldest.getTime() : Math.min(oldest, backlog.oldest.getTime())
  if (oldest !== undefined) stats.oldestPendingAgeS = Math.max(0, (now.getTime() - oldest) / 1000)
  return stats
}

interface EventRow {
  eventId: string
  orderId: number
  fromStatus: string | null
  toStatus: string
  source: string
  sequence: number | null
  tradeId: string | null
  externalReference: string | null
  recordedAt: Date | string
}

function toEvent(row: EventRow): ReactionEvent {
  return {
    eventId: row.eventId,
    type: `trade.${row.toStatus}`,
    orderId: row.orderId,
    externalReference: row.externalReference ?? '',
    tradeId: row.tradeId ?? '',
    from: row.fromStatus,
    to: row.toStatus,
    source: row.source,
    sequence: row.sequence ?? 0,
    occurredAt: new Date(row.recordedAt),
  }
}

// --- the operator console's reads (src/console) ---

export interface ReactionJobFilter {
  state?: ReactionJobState | undefined
  handler?: string | undefined
}

/**
 * The console's list query itself (exported so a test can EXPLAIN it): newest first, keyset on id (page
 * 1,000 costs what page 1 does). By state through reaction_jobs_state_idx, done jobs excepted (nearly every
 * row is one: the primary key, backwards), by handler through reaction_jobs_handler_idx
 * (migrations/0005_console_reaction_indexes.ts, 0010_done_jobs_out_of_the_state_index.ts).
 */
export function searchJobsQuery(db: Kysely<Database>, filter: ReactionJobFilter, { beforeId, limit }: { beforeId?: string | undefined; limit: number }) {
  let query = jobsWithEvents(db)
  if (filter.state) query = query.where('job.state', '=', filter.state)
  if (filter.handler) query = query.where('job.handler', '=', filter.handler)
  if (beforeId) query = query.where('job.id', '<', beforeId)
  return query.orderBy('job.id', 'desc').limit(limit)
}

/** One page of jobs, newest first, and the id to continue before when there are more. */
export async function searchJobs(
  db: Kysely<Database>,
  filter: ReactionJobFilter,
  { beforeId, limit }: { beforeId?: string | undefined; limit: number },
): Promise<{ jobs: ReactionJob[]; nextBeforeId: string | undefined }> {
  const rows = await searchJobsQuery(db, filter, { beforeId, limit: limit + 1 }).execute()
  const jobs = rows.slice(0, limit).map(toJob)
  return { jobs, nextBeforeId: rows.length > limit ? jobs.at(-1)!.id : undefined }
}

export interface EventReaction {
  /** null: handled on the first attempt, recorded with its stream batch (no job row). */
  id: string | null
  eventId: string
  handler: string
  state: ReactionJobState
  attempts: number
}

/** The query behind jobsOfEvents, for a plan check: one lookup per event in reaction_jobs_event_handler_key. */
export function jobsOfEventsQuery(db: Kysely<Database>, eventIds: readonly string[]) {
  return db
    .selectFrom('reactionJobs')
    .select(['id', 'eventId', 'handler', 'state', 'attempts'])
    .where('eventId', 'in', [...eventIds])
    .orderBy('id')
}

/** The reactions that status changes (events) caused: an order's timeline (job rows, then first attempts done). */
export async function jobsOfEvents(db: Kysely<Database>, eventIds: readonly string[]): Promise<EventReaction[]> {
  if (eventIds.length === 0) return []
  const [rows, firstAttempts] = await Promise.all([jobsOfEventsQuery(db, eventIds).execute(), firstAttemptsOfEventsQuery(eventIds).execute(db)])
  return [
    ...rows.map((row) => ({ ...row, id: String(row.id), state: row.state as ReactionJobState })),
    ...firstAttempts.rows.map((row) => ({ id: null, eventId: row.eventId, handler: row.handler, state: 'done' as const, attempts: 1 })),
  ]
}

/** The query behind countFailedJobsByHandler, for a plan check (reaction_jobs_state_idx). */
export function countFailedJobsByHandlerQuery(db: Kysely<Database>) {
  return db
    .selectFrom('reactionJobs')
    .select((eb) => ['handler', eb.fn.countAll<string>().as('jobs')])
    .where('state', '=', 'failed')
    .groupBy('handler')
    .orderBy('handler')
}

/** The handlers of the failed jobs and how many each has (the overview's "needs a human"). */
export async function countFailedJobsByHandler(db: Kysely<Database>): Promise<{ handler: string; jobs: number }[]> {
  const rows = await countFailedJobsByHandlerQuery(db).execute()
  return rows.map((row) => ({ handler: row.handler, jobs: Number(row.jobs) }))
}

// Retention (src/retention/prune.ts): done jobs older than DELIVERY_RETENTION_DAYS are deleted in
// batches that walk the primary key; pending, running, failed and skipped jobs are never deleted by age
// (a failed one waits for an operator; a skipped one records a decision: an operator's, or a setting's). The ordering check
// of the claim counts a missing job as finished, so deleting done ones changes no claim.

/**
 * Looks at the next `limit` jobs by id after `afterId` and deletes those done before `before`; returns how many it
 * deleted, the last id it looked at and when that job was created. Ids grow with creation time and a job finishes
 * after it is created, so the walk can end at a job created lately (retention's `walkEnds`).
 */
export async function deleteDoneJobsBefore(
  db: Kysely<Database>,
  { before, afterId, limit }: { before: Date; afterId: string | undefined; limit: number },
): Promise<WalkedBatch & { deleted: number }> {
  const result = await sql<WalkedBatchRow<string> & { deleted: string }>`
    with scanned as (
      select id, state, finished_at, created_at from reaction_jobs
      where id > ${afterId ?? '0'}::bigint
      order by id
      limit ${limit}
    ), deleted as (
      delete from reaction_jobs r using scanned s
      where r.id = s.id and s.state = 'done' and s.finished_at < ${before} and r.state = 'done'
      returning r.id
    )
    select
      (select id::text from scanned order by id desc limit 1) as last_id,
      (select created_at from scanned order by id desc limit 1) as last_at,
      (select count(*) from scanned) as scanned,
      (select count(*) from deleted) as deleted`.execute(db)
  const row = result.rows[0]!
  return { ...walkedBatch(row), deleted: Number(row.deleted) }
}

/** What deleteDoneJobsBefore and deleteFirstAttemptsDoneBefore would delete in all, counted in events (a dry run). */
export async function countDoneJobsBefore(db: Kysely<Database>, before: Date): Promise<number> {
  const row = await db
    .selectFrom('reactionJobs')
    .select((eb) => eb.fn.countAll<string>().as('jobs'))
    .where('state', '=', 'done')
    .where('finishedAt', '<', before)
    .executeTakeFirstOrThrow()
  return Number(row.jobs) + (await countFirstAttemptsDoneBefore(db, before))
}
