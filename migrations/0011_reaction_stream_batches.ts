import { type Kysely, sql } from 'kysely'

// A first attempt that succeeds leaves no job row: its record is the stream batch that ran it. One row per
// batch written back with events done on their first attempt: the handler, the stream's place after the
// batch, the history ids of those events, and when the batch was written back. What a done job row held
// beyond that (event, order, sequence, created_at) is the event's own history row; its attempts were one.
// Measured before this (bench/results/latest.md, the no-op handler's runs): a done job row per event, with
// its three index entries, cost the ingest about a tenth of its rate under load (one handler registered:
// 0.85× the ratio without; without the rows, 0.96×). Job rows are still written for everything else (a
// retry, a dead letter, an event held back, a handler handed off) and are the record where they exist.
// - (handler, to_position, to_history_id): the batch that took an event is the first of its handler's
//   batches whose place is at or after the event's (batches follow each other along the stream).
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('reaction_stream_batches')
    .addColumn('id', 'bigint', (col) => col.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('handler', 'text', (col) => col.notNull())
    .addColumn('to_position', sql`xid8`, (col) => col.notNull())
    .addColumn('to_history_id', 'bigint', (col) => col.notNull())
    .addColumn('done', sql`bigint[]`, (col) => col.notNull())
    .addColumn('events', 'integer', (col) => col.notNull())
    .addColumn('finished_at', 'timestamptz', (col) => col.notNull())
    .execute()
  await sql`create index reaction_stream_batches_place_idx on reaction_stream_batches (handler, to_position, to_history_id)`.execute(db)
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropTable('reaction_stream_batches').execute()
}
