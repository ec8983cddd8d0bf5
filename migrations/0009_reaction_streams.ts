import { type Kysely, sql } from 'kysely'

// Reactions become streams: a handler reads the status history in commit order from a cursor of its own,
// and a job row is written only for what needs one (a done event, a retry, a dead letter). Measured before
// this (bench/results/reactions-profile.md): each event's job was inserted, claimed and completed, three row
// versions in every index of reaction_jobs, and one handler cost the ingest a third of its rate.
// - order_status_history.stream_position: where the event stands in the stream. The writing transaction's id
//   (pg_current_xact_id()), or the order's previous event's position when that is larger, so one order's
//   events never go backwards in the stream (a transaction can get its id before an earlier one commits).
//   A reader takes only positions below its snapshot's xmin: every transaction with such an id has ended, so
//   no event can later appear below a position already read. Rows written before this migration have none
//   and are not streamed (their jobs were written with them).
// - orders.last_event_position: the position of the order's latest event, for the rule above.
// - reaction_streams: one row per handler: the last (position, history id) it has taken, and a lease, so
//   one replica at a time reads a handler's stream.
export async function up(db: Kysely<unknown>): Promise<void> {
  // no default: adding a column without one rewrites nothing, however large the tables
  await sql`alter table order_status_history add column stream_position xid8`.execute(db)
  await sql`alter table orders add column last_event_position xid8`.execute(db)
  await sql`create index order_status_history_stream_idx on order_status_history (stream_position, id)
    where stream_position is not null`.execute(db)
  await db.schema
    .createTable('reaction_streams')
    .addColumn('handler', 'text', (col) => col.primaryKey())
    .addColumn('position', sql`xid8`, (col) => col.notNull())
    .addColumn('history_id', 'bigint', (col) => col.notNull())
    .addColumn('lease_token', 'text')
    .addColumn('lease_expires_at', 'timestamptz')
    .addColumn('created_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropTable('reaction_streams').execute()
  await sql`drop index order_status_history_stream_idx`.execute(db)
  await sql`alter table orders drop column last_event_position`.execute(db)
  await sql`alter table order_status_history drop column stream_position`.execute(db)
}
