// Every query on reaction_streams: one row per handler, its place in the status history (migrations/0009).
//
// A handler's new events are read from the history, in stream order (position, then history id), from just
// after the (position, history id) its row holds, and only below the reading snapshot's xmin: every
// transaction whose id is below it has ended, so nothing can still appear behind what was read. One order's
// events have non-decreasing positions, so they come in sequence order.
//
// One replica at a time reads a handler's stream: the read takes (or renews) the row's lease, and the
// write-back of what the batch did (the record of its first attempts done, the job rows of its other events,
// and the new place) is one statement that
// only happens under the same lease token. A replica that dies mid-batch wrote nothing: once its lease ends
// another one reads the same events again (at least once, as with every job).
// The holder may read on from a place it has not written back yet (`after`: batches whose every event was done,
// stream-worker.ts). The read starts there only while the row's lease token is still the reader's: no other
// replica has written since the holder's own last write-back, so the row's place is the holder's, behind.
import { type Kysely, sql } from 'kysely'
import type { Database } from '../db/database.js'
import { PREPARED } from '../db/open-database.js'
import type { ReactionEvent } from './reaction-event.js'

/** A place in the history: the events after it are still to be taken. */
export interface StreamPlace {
  position: string
  historyId: string
}

/** One event read from a handler's stream, with its place. */
export interface StreamEvent extends StreamPlace {
  event: ReactionEvent
  /** When the transition was recorded (its history row's recorded_at), for the commit-to-handler latency. */
  recordedAt: Date
  /** An unfinished job of the same order and handler holds it back (it waits behind that job). */
  held: boolean
}

/**
 * Gives each named handler a stream row, starting after every event already committed: a handler that
 * appears in a deploy takes the transitions from then on (a stream that exists is left as it is).
 */
export async function ensureReactionStreams(db: Kysely<Database>, handlers: readonly string[], now: Date): Promise<void> {
  if (handlers.length === 0) return
  // (xmin, 0): every position below xmin is committed and left behind; a position at or above it may
  // still be in flight, and is taken
  await sql`
    insert into reaction_streams (handler, position, history_id, created_at, updated_at)
    select handler, pg_snapshot_xmin(pg_current_snapshot()), 0, ${now}, ${now}
    from unnest(${[...handlers]}::text[]) as handler
    on conflict (handler) do nothing`.execute(db)
}

export interface StreamRead {
  /** False: another replica holds this stream's lease (or the stream does not exist). */
  leased: boolean
  /** Not leased: when the other replica's lease runs out (undefined: no such stream). */
  heldUntil?: Date | undefined
  /** The events read, in stream order (every type: the caller keeps the handler's). */
  events: StreamEvent[]
  /** Events after the read ones are committed or in flight at or above the snapshot's xmin: look again soon. */
  withheld: boolean
  /**
   * The read started from `after`, the reader's place not written back yet. False when `after` was given and the
   * stream had passed to another lease token meanwhile: the read started from the row's place instead.
   */
  fromAfter: boolean
}

interface StreamRow {
  position: string | null
  historyId: string | number | null
  eventId: string | null
  orderId: number | null
  fromStatus: string | null
  toStatus: string | null
  source: string | null
  sequence: number | null
  tradeId: string | null
  externalReference: string | null
  recordedAt: Date | string | null
  held: boolean | null
  withheld: boolean
  fromAfter: boolean
}

export interface StreamReadOptions {
  handler: string
  leaseToken: string
  now: Date
  leaseEnd: Date
  limit: number
  /** Read on from here, the reader's place not written back yet, while its lease token still holds the row. */
  after?: StreamPlace | undefined
}

/** The statement of readReactionStream (exported so a test can EXPLAIN it). */
export function readReactionStreamQuery({ handler, leaseToken, now, leaseEnd, limit, after }: StreamReadOptions) {
  const renewBefore = new Date(now.getTime() + (leaseEnd.getTime() - now.getTime()) / 2)
  const afterPosition = after?.position ?? null
  const afterId = after?.historyId ?? null
  return sql<StreamRow>`${sql.raw(PREPARED)}
    with kept as (
      select position, history_id, true as ours from reaction_streams
      where handler = ${handler} and lease_token = ${leaseToken} and lease_expires_at > ${renewBefore}
    ), taken as (
      -- (ours: the token the row held before this update, read from the statement's snapshot)
      update reaction_streams set lease_token = ${leaseToken}, lease_expires_at = ${leaseEnd}, updated_at = ${now}
      where handler = ${handler} and not exists (select 1 from kept)
        and (lease_token is null or lease_token = ${leaseToken} or lease_expires_at <= ${now})
      returning position, history_id,
        coalesce((select r.lease_token = ${leaseToken} from reaction_streams r where r.handler = ${handler}), false) as ours
    ), held as (
      select * from kept union all select * from taken
    ), start as (
      select case when ours and ${afterPosition}::xid8 is not null then ${afterPosition}::xid8 else position end as position,
        case when ours and ${afterId}::bigint is not null then ${afterId}::bigint else history_id end as history_id,
        ours and ${afterPosition}::xid8 is not null as from_after
      from held
    ), place as materialized (
      select s.position, s.history_id, s.from_after,
        -- events visible at or past the snapshot's xmin, which a later read takes: the first one in stream
        -- order, one probe of the stream index (as an exists, the planner may guess that many rows match and
        -- scan the table for the first: on a history whose statistics lag behind, every event of it)
        (select 1 from order_status_history w
          where w.stream_position is not null and w.stream_position >= pg_snapshot_xmin(pg_current_snapshot())
            and (w.stream_position, w.id) > (s.position, s.history_id)
          order by w.stream_position, w.id
          limit 1) is not null as withheld
      from start s
    )
    select p.withheld, p.from_after,
      h.stream_position::text as position, h.id as history_id, h.event_id, h.order_id, h.from_status, h.to_status,
      h.source, h.sequence, h.trade_id, h.external_reference, h.recorded_at,
      u.order_id is not null as held
    from place p left join lateral (
      select * from order_status_history h
      where h.stream_position is not null
        and (h.stream_position, h.id) > (p.position, p.history_id)
        and h.stream_position < pg_snapshot_xmin(pg_current_snapshot())
      order by h.stream_position, h.id
      -- unknown to the planner, even in a plan made for this read's values. A generic plan is kept for the
      -- connection's life: with a known limit, one made while the history was nearly empty took every event
      -- after the place through a bitmap scan and sorted them, on every read of a backlog. With the limit unknown
      -- even that plan walks the stream index in order. As a bare parameter, each read's own plan (which sees the
      -- value) looked cheaper, and Postgres planned every read anew: 0.2 ms of its CPU a read, against 0.01 ms
      -- for the kept plan, which it takes after five reads once a plan of its own shows it nothing more
      limit (select ${limit}::int)
    ) h on true
    -- an unfinished job of this order and handler: the event waits behind it. One probe of the unfinished
    -- index per event, by order: as an exists, Postgres may instead collect every unfinished job of the handler
    -- once per read, and on statistics that lag behind a growing reaction_jobs it did so through the handler
    -- index, walking each of the handler's done jobs on every read (5 ms for 20,000 of them)
    left join lateral (
      select j.order_id from reaction_jobs j
      where j.order_id = h.order_id and j.handler = ${handler} and j.state not in ('done', 'skipped')
      limit 1
    ) u on true
    order by h.stream_position, h.id`
}

/**
 * Reads up to `limit` events after `handler`'s place, under its lease: taken when free or run out, renewed
 * to `leaseEnd` when less than half of it is left. One statement; while the lease has more than half left it
 * writes nothing (no commit to flush: the read on every wake-up of a busy stream stays a read).
 */
export async function readReactionStream(db: Kysely<Database>, options: StreamReadOptions): Promise<StreamRead> {
  const { rows } = await readReactionStreamQuery(options).execute(db)
  const [first] = rows
  if (!first) {
    const stream = await db.selectFrom('reactionStreams').select('leaseExpiresAt').where('handler', '=', options.handler).executeTakeFirst()
    const heldUntil = stream?.leaseExpiresAt ? new Date(stream.leaseExpiresAt) : undefined
    return { leased: false, heldUntil, events: [], withheld: false, fromAfter: false }
  }
  const events: StreamEvent[] = []
  for (const row of rows) {
    if (row.position === null || row.historyId === null || row.toStatus === null) continue
    const recordedAt = new Date(row.recordedAt!)
    events.push({
      position: row.position,
      historyId: String(row.historyId),
      recordedAt,
      held: row.held === true,
      event: {
        eventId: row.eventId!,
        type: `trade.${row.toStatus}`,
        orderId: row.orderId!,
        externalReference: row.externalReference ?? '',
        tradeId: row.tradeId ?? '',
        from: row.fromStatus,
        to: row.toStatus,
        source: row.source!,
        sequence: row.sequence ?? 0,
        occurredAt: recordedAt,
      },
    })
  }
  return { leased: true, events, withheld: first.withheld === true, fromAfter: first.fromAfter === true }
}

/** What a batch did with one event: the job row it leaves. */
export interface StreamOutcome {
  event: ReactionEvent
  /**
   * done: handled. pending: to run at runAt (a retry after a throw, or not run: behind an earlier job, or not
   * started). failed: the dead letter. running: its handler still runs, under the stream's lease (handed off).
   */
  state: 'done' | 'pending' | 'failed' | 'running'
  attempts: number
  runAt: Date
  lastError: string | null
  /** When the transition was recorded: the job's created_at. */
  createdAt: Date
  /** running: the lease the row is written under. */
  leaseToken?: string
  leaseExpiresAt?: Date
}

/**
 * Writes a batch back: the record of its events handled on the first attempt (one reaction_stream_batches
 * row holding their history ids), the job rows of the others (`outcomes`) and the stream's new place, in
 * one statement, only while
 * `leaseToken` still holds the stream (the lease is renewed to `leaseEnd`). Returns the running rows' ids by
 * event id; undefined when the lease was lost and nothing was written (another replica reads the batch again).
 */
export async function writeReactionStream(
  db: Kysely<Database>,
  {
    handler,
    leaseToken,
    place,
    outcomes,
    now,
    leaseEnd,
    done = [],
  }: {
    handler: string
    leaseToken: string
    place: StreamPlace
    outcomes: readonly StreamOutcome[]
    now: Date
    leaseEnd: Date
    /** The history ids of the events handled on this first attempt: recorded in the batch's row, with no job row. */
    done?: readonly string[]
  },
): Promise<Map<string, string> | undefined> {
  const input = JSON.stringify(
    outcomes.map(({ event, state, attempts, runAt, lastError, createdAt, leaseToken: jobLease, leaseExpiresAt }) => ({
      event_id: event.eventId,
      order_id: event.orderId,
      sequence: event.sequence,
      state,
      attempts,
      run_at: runAt.toISOString(),
      last_error: lastError,
      created_at: createdAt.toISOString(),
      lease_token: jobLease ?? null,
      lease_expires_at: leaseExpiresAt?.toISOString() ?? null,
    })),
  )
  // (the nested keys come back camelCased, as every result's do)
  const { rows } = await sql<{ moved: boolean; running: { eventId: string; id: string | number }[] | null }>`${sql.raw(PREPARED)}
    with moved as (
      update reaction_streams set position = ${place.position}::xid8, history_id = ${place.historyId}::bigint,
        lease_expires_at = ${leaseEnd}, updated_at = ${now}
      where handler = ${handler} and lease_token = ${leaseToken}
      returning 1
    ), jobs as (
      insert into reaction_jobs (event_id, order_id, sequence, handler, state, attempts, run_at, last_error,
        lease_token, lease_expires_at, created_at, updated_at, finished_at)
      select o.event_id, o.order_id, o.sequence, ${handler}, o.state, o.attempts, o.run_at, o.last_error,
        o.lease_token, o.lease_expires_at, o.created_at, ${now}::timestamptz,
        case when o.state in ('done', 'failed') then ${now}::timestamptz end
      from json_to_recordset(${input}::json) as o(event_id uuid, order_id int, sequence int, state text, attempts int,
        run_at timestamptz, last_error text, created_at timestamptz, lease_token text, lease_expires_at timestamptz)
      where exists (select 1 from moved)
      on conflict (event_id, handler) do nothing
      returning id, event_id, state
    ), batch as (
      -- the bulk of a batch, its events handled on the first attempt: one row for all of them (migrations/0011)
      insert into reaction_stream_batches (handler, to_position, to_history_id, done, events, finished_at)
      select ${handler}, ${place.position}::xid8, ${place.historyId}::bigint, ${`{${done.join(',')}}`}::bigint[], ${done.length}::int, ${now}::timestamptz
      where ${done.length}::int > 0 and exists (select 1 from moved)
    )
    select exists (select 1 from moved) as moved,
      (select json_agg(json_build_object('event_id', event_id, 'id', id)) from jobs where state = 'running') as running`.execute(db)
  const row = rows[0]
  if (row?.moved !== true) return undefined
  return new Map((row.running ?? []).map((job) => [job.eventId, String(job.id)]))
}

/** Gives a stream's lease back (shutdown): another replica may read it at once. */
export async function releaseReactionStream(db: Kysely<Database>, handler: string, leaseToken: string): Promise<void> {
  await db
    .updateTable('reactionStreams')
    .set({ leaseToken: null, leaseExpiresAt: null })
    .where('handler', '=', handler)
    .where('leaseToken', '=', leaseToken)
    .execute()
}

export interface StreamBacklog {
  /** Events committed and not yet taken by their handler, summed over the streams (of every type: an upper bound). */
  events: number
  /** When the oldest of them committed; undefined when none. */
  oldest: Date | undefined
}

/**
 * What the streams have not taken yet: for each stream, the history after its place (counted up to
 * `cap` per stream, so a long backlog costs a bounded walk). With `handlers`, only their streams: a
 * removed handler's stream keeps its place, and nothing will ever read what follows it.
 */
export async function reactionStreamBacklog(
  db: Kysely<Database>,
  { cap = 100_000, handlers }: { cap?: number; handlers?: readonly string[] | undefined } = {},
): Promise<StreamBacklog> {
  const only = handlers ? sql`where s.handler = any(${[...handlers]}::text[])` : sql``
  const { rows } = await sql<{ events: string | number; oldest: Date | string | null }>`
    select coalesce(sum(b.events), 0) as events, min(b.oldest) as oldest
    from reaction_streams s cross join lateral (
      select count(*) as events, min(h.recorded_at) as oldest from (
        select h.recorded_at from order_status_history h
        where h.stream_position is not null and (h.stream_position, h.id) > (s.position, s.history_id)
        order by h.stream_position, h.id
        limit ${cap}
      ) h
    ) b
    ${only}`.execute(db)
  const row = rows[0]
  return { events: Number(row?.events ?? 0), oldest: row?.oldest ? new Date(row.oldest) : undefined }
}

/** The session whose open transaction is likely to hold every stream back: the oldest one with an id or a snapshot. */
export interface OpenTransaction {
  pid: number
  database: string | null
  user: string | null
  application: string | null
  state: string | null
  openForS: number
}

/**
 * The oldest open transaction on the whole server other than this session's, from pg_stat_activity (its query text
 * is not read): the one a stream's readable end, the snapshot's xmin, waits on. Undefined when there is none, or
 * where the statistics are not kept (PGlite).
 */
export async function oldestOpenTransaction(db: Kysely<Database>): Promise<OpenTransaction | undefined> {
  const { rows } = await sql<OpenTransaction>`
    select pid, datname as database, usename as "user", application_name as application, state,
      extract(epoch from now() - xact_start)::float8 as "openForS"
    from pg_stat_activity
    where (backend_xid is not null or backend_xmin is not null) and pid <> pg_backend_pid() and xact_start is not null
    order by xact_start
    limit 1`.execute(db)
  return rows[0]
}
