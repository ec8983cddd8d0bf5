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
import { reactionChannelSql } from '../db/reaction-channel.js'
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
 * appears in a deploy takes the transitions from then on (a stream that exists keeps its place).
 * `typesOf`: the types each handler takes here (the registry's typesOf), written to its row whether it is new or not, so
 * the replica that started last decides which replicas read the stream (readReactionStream). Types that change (not
 * types written for the first time) end the row's lease: a replica with the others stops at its next read, and its batch in flight is not written back
 * (writeReactionStream), so this one reads those events again and runs those of its types.
 */
export async function ensureReactionStreams(
  db: Kysely<Database>,
  handlers: readonly string[],
  now: Date,
  typesOf?: (handler: string) => string,
): Promise<void> {
  if (handlers.length === 0) return
  const types = typesOf ? handlers.map(typesOf) : handlers.map(() => null)
  // (xmin, 0): every position below xmin is committed and left behind; a position at or above it may
  // still be in flight, and is taken
  await sql`
    insert into reaction_streams (handler, position, history_id, types, created_at, updated_at)
    select given.handler, pg_snapshot_xmin(pg_current_snapshot()), 0, given.types, ${now}, ${now}
    from unnest(${[...handlers]}::text[], ${types}::text[]) as given(handler, types)
    -- (types first written, on a row from before migration 0016: its holder keeps its lease)
    on conflict (handler) do update set types = excluded.types,
      lease_token = case when reaction_streams.types is null then reaction_streams.lease_token end,
      lease_expires_at = case when reaction_streams.types is null then reaction_streams.lease_expires_at end,
      updated_at = excluded.updated_at
      where excluded.types is not null and reaction_streams.types is distinct from excluded.types`.execute(db)
}

export interface StreamRead {
  /** False: another replica holds this stream's lease (or the stream does not exist: `missing`). */
  leased: boolean
  /** No row for the handler: the database was replaced or restored without it since the start (createMissingReactionStream). */
  missing?: boolean | undefined
  /**
   * The reading snapshot's xmin (decimal text) when the stream's row was there: events committed later have positions at
   * or past it. Undefined when `missing`.
   */
  horizon?: string | undefined
  /** Not leased: when the other replica's lease runs out (undefined: no such stream, or `otherTypes`). */
  heldUntil?: Date | undefined
  /**
   * Not leased because the row's types are not this reader's: a replica that started later takes other types for
   * the handler, and the stream is left to the replicas that take those.
   */
  otherTypes?: { theirs: string } | undefined
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
  horizon: string
}

export interface StreamReadOptions {
  handler: string
  leaseToken: string
  now: Date
  leaseEnd: Date
  limit: number
  /** Read on from here, the reader's place not written back yet, while its lease token still holds the row. */
  after?: StreamPlace | undefined
  /** The types this reader's handler takes (the registry's typesOf): read only while the row's are these, or not written. */
  types?: string | undefined
}

/** The statement of readReactionStream (exported so a test can EXPLAIN it). */
export function readReactionStreamQuery({ handler, leaseToken, now, leaseEnd, limit, after, types }: StreamReadOptions) {
  const renewBefore = new Date(now.getTime() + (leaseEnd.getTime() - now.getTime()) / 2)
  const readerTypes = types ?? null
  const afterPosition = after?.position ?? null
  const afterId = after?.historyId ?? null
  return sql<StreamRow>`${sql.raw(PREPARED)}
    with kept as (
      select position, history_id, true as ours from reaction_streams
      where handler = ${handler} and lease_token = ${leaseToken} and lease_expires_at > ${renewBefore}
        and (types is null or ${readerTypes}::text is null or types = ${readerTypes}::text)
    ), taken as (
      -- (ours: the token the row held before this update, read from the statement's snapshot)
      update reaction_streams set lease_token = ${leaseToken}, lease_expires_at = ${leaseEnd}, updated_at = ${now}
      where handler = ${handler} and not exists (select 1 from kept)
        and (lease_token is null or lease_token = ${leaseToken} or lease_expires_at <= ${now})
        and (types is null or ${readerTypes}::text is null or types = ${readerTypes}::text)
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
      select s.position, s.history_id, s.from_after, pg_snapshot_xmin(pg_current_snapshot()) as horizon,
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
    select p.withheld, p.from_after, p.horizon::text as horizon,
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
    const stream = await db
      .selectFrom('reactionStreams')
      .select(['leaseExpiresAt', 'types', sql<string>`pg_snapshot_xmin(pg_current_snapshot())::text`.as('horizon')])
      .where('handler', '=', options.handler)
      .executeTakeFirst()
    if (!stream) return { leased: false, missing: true, events: [], withheld: false, fromAfter: false }
    const { horizon } = stream
    if (stream.types != null && options.types !== undefined && stream.types !== options.types) {
      return { leased: false, otherTypes: { theirs: stream.types }, events: [], withheld: false, fromAfter: false, horizon }
    }
    const heldUntil = stream.leaseExpiresAt ? new Date(stream.leaseExpiresAt) : undefined
    return { leased: false, heldUntil, events: [], withheld: false, fromAfter: false, horizon }
  }
  const events: StreamEvent[] = []
  for (const row of rows) {
    if (row.position === null || row.historyId === null || row.toStatus === null) continue
    const recordedAt = row.recordedAt instanceof Date ? row.recordedAt : new Date(row.recordedAt!)
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
  return { leased: true, events, withheld: first.withheld === true, fromAfter: first.fromAfter === true, horizon: first.horizon }
}

/**
 * Makes the stream row of a handler a running service found without one (readReactionStream's `missing`): the
 * database was replaced under it and migrated from outside, or restored without the row. The rule is start-up's
 * (ensureReactionStreams): the stream takes the transitions from the time the handler is there, and none committed
 * before (a restored history is not handed over again). For a running replica the handler has been there all along:
 * that time is `from`, the horizon of the replica's last read that found the row (no later than now: the least of
 * the two is taken), so a transition committed after the row went and before this statement (the one whose commit
 * woke the read) is taken. Without `from`, now, as at start-up. ON CONFLICT DO NOTHING: another replica (or a
 * restore) that made the row first keeps its place and its types. True when this statement made it.
 */
export async function createMissingReactionStream(
  db: Kysely<Database>,
  { handler, now, types, from }: { handler: string; now: Date; types?: string | undefined; from?: string | undefined },
): Promise<{ created: boolean; position: string | null }> {
  const { rows } = await sql<{ position: string }>`
    insert into reaction_streams (handler, position, history_id, types, created_at, updated_at)
    values (${handler}, least(coalesce(${from ?? null}::xid8, pg_snapshot_xmin(pg_current_snapshot())), pg_snapshot_xmin(pg_current_snapshot())),
      0, ${types ?? null}, ${now}, ${now})
    on conflict (handler) do nothing
    returning position::text as position`.execute(db)
  return { created: rows.length > 0, position: rows[0]?.position ?? null }
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
    types,
  }: {
    handler: string
    leaseToken: string
    place: StreamPlace
    outcomes: readonly StreamOutcome[]
    now: Date
    leaseEnd: Date
    /** The history ids of the events handled on this first attempt: recorded in the batch's row, with no job row. */
    done?: readonly string[]
    /**
     * The types the batch's handler took (the registry's typesOf): written only while the row's are these, so a batch read
     * before a replica with other types started is read again by one of those, not moved past.
     */
    types?: string | undefined
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
        and (types is null or ${types ?? null}::text is null or types = ${types ?? null}::text)
        -- (at the place already: an earlier try of this write-back landed, see below)
        and (position, history_id) <> (${place.position}::xid8, ${place.historyId}::bigint)
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
  if (row?.moved === true) return new Map((row.running ?? []).map((job) => [job.eventId, String(job.id)]))
  return landedBefore(db, { handler, leaseToken, place, running: outcomes.filter((outcome) => outcome.state === 'running') })
}

/**
 * A write-back that moved nothing: either another lease token holds the stream (undefined), or an earlier try of this
 * very write-back landed and its answer was lost (the connection cut after its COMMIT), and the row holds this token
 * at this place. A write-back always moves the place on (its batch read events after it), and only its holder's token
 * moves it, so that pair is this write's own commit; tried again, it wrote the place again, recorded its done events a
 * second time and, its job rows there already (ON CONFLICT DO NOTHING), returned none of their ids, so the calls it
 * handed off never wrote their outcome and ran again once their lease ran out. Then the running rows' ids are read
 * back (those still running under the token: an operator's release-stream gave back the others). One statement, only
 * after a miss.
 */
async function landedBefore(
  db: Kysely<Database>,
  { handler, leaseToken, place, running }: { handler: string; leaseToken: string; place: StreamPlace; running: readonly StreamOutcome[] },
): Promise<Map<string, string> | undefined> {
  const { rows } = await sql<{ ours: boolean; running: { eventId: string; id: string | number }[] | null }>`
    select s.lease_token = ${leaseToken} and s.position = ${place.position}::xid8 and s.history_id = ${place.historyId}::bigint as ours,
      (select json_agg(json_build_object('event_id', j.event_id, 'id', j.id)) from reaction_jobs j
        where j.handler = ${handler} and j.event_id = any(${running.map((outcome) => outcome.event.eventId)}::uuid[])
          and j.state = 'running' and j.lease_token = ${leaseToken}) as running
    from reaction_streams s where s.handler = ${handler}`.execute(db)
  const row = rows[0]
  if (row?.ours !== true) return undefined
  return new Map((row.running ?? []).map((job) => [job.eventId, String(job.id)]))
}

/**
 * Whether `handler`'s stream stands at `place` under `leaseToken`: a write-back of that place by this token landed (only
 * the holder's write-backs move the place, always on). Asked only after such a write-back failed.
 */
export async function streamStandsAt(
  db: Kysely<Database>,
  { handler, leaseToken, place }: { handler: string; leaseToken: string; place: StreamPlace },
): Promise<boolean> {
  const { rows } = await sql<{ one: number }>`
    select 1 as one from reaction_streams
    where handler = ${handler} and lease_token = ${leaseToken} and position = ${place.position}::xid8 and history_id = ${place.historyId}::bigint`.execute(db)
  return rows.length > 0
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

/** What releaseStreamLease found and did. */
export type StreamLeaseRelease =
  | { result: 'not_found'; handlers: string[] }
  | { result: 'not_held' }
  | {
      result: 'released'
      /** When the lease was to end, by its holder's clock (null: not stored). */
      leaseExpiresAt: Date | null
      /** Seconds from the database's now to that end: negative when it had run out already. */
      leftS: number | null
      /** The jobs its holder had handed off (running under that lease), given back: pending, due now. */
      freedJobs: number
    }

/**
 * An operator gives a stream's lease back (`reactions release-stream`): a replica killed while its clock was far ahead
 * left a lease that holds every replica's new transitions of the handler back until it ends. The row's token and end
 * are cleared, so the next read of any replica takes the stream from its written place; `not_found` names the streams
 * there are. Safe against a holder still running: every write-back (writeReactionStream) and every read on from a place
 * not written back yet happens only under the row's token, so that holder writes nothing of its batch in flight, as
 * when another replica takes a stream over, and its events run again (at least once). The jobs the holder handed off
 * (a call still running at its batch's write-back: a running row under the stream's lease token, stream-worker.ts) are
 * given back in the same transaction, pending and due now, their attempts as they were (a claim counts the next): a
 * killed holder's stayed running until their own lease ran out, REACTION_LEASE_S (300 s by default), holding back their
 * orders' later events. A holder still running writes nothing of them either (its write checks the job's token), and
 * they run again. The dispatchers are notified at the commit, and read and claim at once. Times by the database's
 * clock: this machine's may be the one that is off.
 */
export async function releaseStreamLease(db: Kysely<Database>, handler: string): Promise<StreamLeaseRelease> {
  return db.transaction().execute(async (trx) => {
    const { rows } = await sql<{ leaseToken: string | null; leaseExpiresAt: Date | string | null; leftS: number | null }>`
      select lease_token, lease_expires_at, extract(epoch from lease_expires_at - now())::float8 as left_s
      from reaction_streams where handler = ${handler} for update`.execute(trx)
    const row = rows[0]
    if (!row) {
      const streams = await trx.selectFrom('reactionStreams').select('handler').orderBy('handler').execute()
      return { result: 'not_found', handlers: streams.map((stream) => stream.handler) }
    }
    if (row.leaseToken === null) return { result: 'not_held' }
    await sql`update reaction_streams set lease_token = null, lease_expires_at = null, updated_at = now() where handler = ${handler}`.execute(trx)
    const { rows: freed } = await sql<{ id: string | number }>`
      update reaction_jobs set state = 'pending', run_at = now(), lease_token = null, lease_expires_at = null, updated_at = now()
      where handler = ${handler} and state = 'running' and lease_token = ${row.leaseToken}
      returning id`.execute(trx)
    await sql`select pg_notify(${reactionChannelSql}, '')`.execute(trx)
    return {
      result: 'released',
      leaseExpiresAt: row.leaseExpiresAt === null ? null : new Date(row.leaseExpiresAt),
      leftS: row.leftS === null ? null : Number(row.leftS),
      freedJobs: freed.length,
    }
  })
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


/**
 * What holds every stream back: the open transaction with the oldest id on the server, other than this session's.
 * Only a transaction with an id does: a stream reads below its snapshot's xmin, and Postgres makes a snapshot's
 * xmin the oldest id still running (a session's or a prepared transaction's), not the oldest other snapshot. A
 * REPEATABLE READ session that only reads holds a snapshot (backend_xmin) and no id: it holds VACUUM back, never a
 * stream. So they are ordered by the age of their id, not by when they began.
 */
export type OpenTransaction =
  | {
      kind: 'session'
      pid: number
      database: string | null
      user: string | null
      application: string | null
      /** Null where pg_stat_activity hides it from this role (`restricted`). */
      state: string | null
      /** Seconds since the transaction began; null where pg_stat_activity hides it from this role (`restricted`). */
      openForS: number | null
      /** Transaction ids assigned since its own. */
      xidAge: number
      /**
       * Another role's session, and this role without pg_read_all_stats: pg_stat_activity shows its pid, database,
       * user, application and id, not its state or start.
       */
      restricted: boolean
    }
  | {
      /** A prepared transaction (PREPARE TRANSACTION): no session holds it; COMMIT PREPARED or ROLLBACK PREPARED ends it. */
      kind: 'prepared'
      gid: string
      database: string | null
      owner: string | null
      preparedAt: Date
      openForS: number
      xidAge: number
    }

interface OpenTransactionRow {
  kind: 'session' | 'prepared'
  pid: number | null
  gid: string | null
  database: string | null
  user: string | null
  application: string | null
  state: string | null
  since: Date | string | null
  openForS: number | null
  xidAge: number
}

/** The statement of oldestOpenTransaction (exported so a test can run it where pg_prepared_xacts is a stand-in). */
export function oldestOpenTransactionQuery() {
  // (its query text is not read); a hidden row's xact_start and state are null, its backend_xid is not
  return sql<OpenTransactionRow>`
    select t.kind, t.pid, t.gid, t.database, t."user", t.application, t.state, t.since,
      extract(epoch from now() - t.since)::float8 as "openForS", t.xid_age
    from (
      select 'session' as kind, a.pid, null::text as gid, a.datname::text as database, a.usename::text as "user",
        a.application_name as application, a.state, a.xact_start as since, age(a.backend_xid) as xid_age
      from pg_stat_activity a
      where a.backend_xid is not null and a.pid <> pg_backend_pid()
      union all
      select 'prepared', null, p.gid, p.database::text, p.owner::text, null, null, p.prepared, age(p.transaction)
      from pg_prepared_xacts p
    ) t
    order by t.xid_age desc
    limit 1`
}

/**
 * The open transaction with the oldest id on the whole server, a session's or a prepared one's (see OpenTransaction):
 * the one a stream's readable end, the snapshot's xmin, waits on. Undefined when there is none, or where the
 * statistics are not kept (PGlite).
 */
export async function oldestOpenTransaction(db: Kysely<Database>): Promise<OpenTransaction | undefined> {
  const { rows } = await oldestOpenTransactionQuery().execute(db)
  const row = rows[0]
  if (!row) return undefined
  const xidAge = Number(row.xidAge)
  if (row.kind === 'prepared') {
    return {
      kind: 'prepared',
      gid: row.gid ?? '',
      database: row.database,
      owner: row.user,
      preparedAt: new Date(row.since!),
      openForS: Number(row.openForS ?? 0),
      xidAge,
    }
  }
  return {
    kind: 'session',
    pid: Number(row.pid),
    database: row.database,
    user: row.user,
    application: row.application,
    state: row.state,
    openForS: row.openForS === null ? null : Number(row.openForS),
    xidAge,
    restricted: row.since === null,
  }
}

// --- positions of another server's counter (a restore onto another server) ---
//
// Positions are transaction ids of one server's counter. A copy of the database on another server whose counter is
// lower (pg_dump and pg_restore, logical replication) keeps them, and its new transactions get lower ids: a new
// order's events land below the streams' places (never read), and a known order's take its last, old position,
// above the new server's xmin (withheld until its counter passes them). Nothing fails: reactions just stop.
// streamPositionsAhead notices it; rebaseStreamPositions (`reactions rebase`) moves the positions below the counter.

export interface PositionsAhead {
  /** The largest position stored: a stream's place or an event's (null: none yet). */
  largest: string | null
  /** The next transaction id of this server (its snapshot's xmax): no transaction of it wrote a position at or past it. */
  next: string
  /** How many ids the largest position is at or past `next`: 0 when it is below (positions of this server's). */
  aheadBy: number
}

/**
 * The largest position of one column, by its order, not max(): Postgres has min() and max() of xid8 only from 15 on,
 * and the service runs on 13 and later.
 */
function largestPosition(table: string, column: string) {
  return sql`(select ${sql.ref(column)} from ${sql.table(table)} where ${sql.ref(column)} is not null order by ${sql.ref(column)} desc limit 1)`
}

/**
 * The statement of streamPositionsAhead (exported so a test can EXPLAIN it): two lookups, whatever the history's
 * size. reaction_streams is a row per handler; the history's largest position is the last entry of
 * order_status_history_stream_idx (read backwards). orders.last_event_position is always one of its order's events'
 * positions, and a batch record's to_position one of its stream's places, so neither can be larger.
 */
export function streamPositionsAheadQuery() {
  return sql<{ largest: string | null; next: string; aheadBy: number | null }>`
    select l.largest::text as largest, x.next::text as next,
      greatest(0, l.largest::text::numeric - x.next::text::numeric + 1)::float8 as ahead_by
    -- xmax, not pg_current_xact_id(): a look that writes nothing takes no id of its own
    from (select pg_snapshot_xmax(pg_current_snapshot()) as next) x
    cross join (
      select greatest(
        ${largestPosition('reaction_streams', 'position')},
        (select h.stream_position from order_status_history h where h.stream_position is not null
          order by h.stream_position desc, h.id desc limit 1)
      ) as largest
    ) l`
}

/** Whether the stored positions are ahead of this server's transaction counter (see above). */
export async function streamPositionsAhead(db: Kysely<Database>): Promise<PositionsAhead> {
  const { rows } = await streamPositionsAheadQuery().execute(db)
  const row = rows[0]!
  return { largest: row.largest, next: row.next, aheadBy: Number(row.aheadBy ?? 0) }
}

/** What rebaseStreamPositions found, and did. Positions are xid8 values, as decimal text. */
export type StreamRebase =
  | { result: 'not_ahead'; largest: string | null; next: string }
  | {
      /** The positions not yet read by every stream span more ids than there are below the server's oldest open one. */
      result: 'no_room'
      largest: string
      next: string
      /** The stream furthest behind, and its place. */
      lowest: { handler: string; position: string }
      /** The largest position the shift may give (one below the oldest transaction still open). */
      top: string
    }
  | {
      result: 'rebased' | 'would_rebase'
      largest: string
      next: string
      /** Subtracted from every position. */
      shift: string
      /** The largest position after the shift: one below the oldest transaction still open. */
      top: string
      /** Rows whose positions were shifted. */
      streams: number
      events: number
      orders: number
      batches: number
      /** Of those, positions below every stream's place (consumed by all of them) set to 0 rather than below it. */
      clamped: number
    }

/** How long rebaseStreamPositions waits for the tables' lock before it gives up (Postgres' SQLSTATE 55P03). */
export const REBASE_LOCK_TIMEOUT = '15s'

/**
 * Moves every stored position (the streams' places, the history's stream_position, orders.last_event_position, the
 * batch records' to_position) back by one shift, so that the largest is one below the oldest transaction still open
 * on this server: `reactions rebase`, after a restore onto another server (see above). One transaction:
 * - It first locks the four tables in EXCLUSIVE mode (reads go on; no transition is written, no stream is read or
 *   written back, no stream created meanwhile: every stream read is a statement that may update its row), waiting at
 *   most REBASE_LOCK_TIMEOUT, then reads the positions. Nothing is changed unless the largest is at or past this
 *   server's next transaction id.
 * - One shift keeps every position's order, so each stream reads its unread events in the same order, and
 *   nothing it took is read again. The largest lands one below the snapshot's xmin, not below this transaction's
 *   own id: every transaction that can still write an event (one waiting for the lock included) has an id at or
 *   above that xmin, and so writes it after every stream's place, as a reader's xmin guarantees in normal running.
 * - Positions cannot go below 0 (xid8). A position the shift would take below 1 is below every stream's place
 *   (the shift is refused when a place itself would go below 1: `no_room`), so every stream took its event
 *   already: it is set to 0, still below every place, and never read again. Only the console's timeline of such an
 *   old event may no longer find the batch record of its first attempt (both clamped to 0, their order lost).
 * - The streams' leases are ended: a replica that read before the lock holds places of the old counter in memory;
 *   its write-back finds the lease gone and writes nothing (as when another replica takes a stream over: what its
 *   batch ran runs again, at least once), and its next read starts from the rebased place.
 * - The dispatchers are notified at the commit, and read at once.
 * `dryRun`: the same reads and counts, nothing changed.
 */
export async function rebaseStreamPositions(db: Kysely<Database>, { now, dryRun = false }: { now: Date; dryRun?: boolean }): Promise<StreamRebase> {
  return db.transaction().execute(async (trx) => {
    await sql`set local lock_timeout = ${sql.lit(REBASE_LOCK_TIMEOUT)}`.execute(trx)
    // in the order the ingest statement takes them (orders, then the history)
    await sql`lock table orders, order_status_history, reaction_streams, reaction_stream_batches in exclusive mode`.execute(trx)
    // (a snapshot taken after the lock: every transaction that wrote before it has ended)
    const { rows } = await sql<{ largest: string | null; lowestHandler: string | null; lowestPosition: string | null; xmin: string; next: string }>`
      select greatest(
          ${largestPosition('reaction_streams', 'position')},
          ${largestPosition('order_status_history', 'stream_position')},
          ${largestPosition('orders', 'last_event_position')},
          ${largestPosition('reaction_stream_batches', 'to_position')}
        )::text as largest,
        l.handler as lowest_handler, l.position::text as lowest_position,
        pg_snapshot_xmin(pg_current_snapshot())::text as xmin, pg_snapshot_xmax(pg_current_snapshot())::text as next
      from (select 1) one
      left join lateral (select handler, position from reaction_streams order by position, handler limit 1) l on true`.execute(trx)
    const row = rows[0]!
    const { largest, next } = row
    if (largest === null || BigInt(largest) < BigInt(next)) return { result: 'not_ahead', largest, next }
    const top = BigInt(row.xmin) - 1n
    const shift = BigInt(largest) - top
    if (row.lowestPosition !== null && BigInt(row.lowestPosition) - shift < 1n) {
      return { result: 'no_room', largest, next, lowest: { handler: row.lowestHandler!, position: row.lowestPosition }, top: String(top) }
    }
    const d = String(shift)
    const moved = (column: string) => sql`case when ${sql.ref(column)}::text::numeric - ${d}::numeric >= 1
      then (${sql.ref(column)}::text::numeric - ${d}::numeric)::text::xid8 else '0'::xid8 end`
    const below = (column: string) => sql`${sql.ref(column)}::text::numeric - ${d}::numeric < 1`
    const { rows: counts } = await sql<{ streams: string; events: string; orders: string; batches: string; clamped: string }>`
      select (select count(*) from reaction_streams) as streams,
        (select count(*) from order_status_history where stream_position is not null) as events,
        (select count(*) from orders where last_event_position is not null) as orders,
        (select count(*) from reaction_stream_batches) as batches,
        (select count(*) from order_status_history where ${below('stream_position')})
          + (select count(*) from orders where ${below('last_event_position')})
          + (select count(*) from reaction_stream_batches where ${below('to_position')}) as clamped`.execute(trx)
    const count = counts[0]!
    const outcome = {
      largest,
      next,
      shift: d,
      top: String(top),
      streams: Number(count.streams),
      events: Number(count.events),
      orders: Number(count.orders),
      batches: Number(count.batches),
      clamped: Number(count.clamped),
    }
    if (dryRun) return { result: 'would_rebase', ...outcome }
    await sql`update reaction_streams set position = ${moved('position')}, lease_token = null, lease_expires_at = null,
      updated_at = ${now}`.execute(trx)
    await sql`update order_status_history set stream_position = ${moved('stream_position')} where stream_position is not null`.execute(trx)
    await sql`update orders set last_event_position = ${moved('last_event_position')} where last_event_position is not null`.execute(trx)
    await sql`update reaction_stream_batches set to_position = ${moved('to_position')}`.execute(trx)
    await sql`select pg_notify(${reactionChannelSql}, '')`.execute(trx)
    return { result: 'rebased', ...outcome }
  })
}
