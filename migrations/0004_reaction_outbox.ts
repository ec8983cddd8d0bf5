import { type Kysely, sql } from 'kysely'

// Reactions: the status history becomes the outbox, and each (event, handler) is a job.
// - order_status_history gains what an event needs beyond the transition: a stable event id (every
//   handler's idempotency key), the order's sequence (its version after the move: 1, 2, 3 ... per order),
//   and the trade id and external reference as they were when it moved. Old rows are backfilled: the
//   sequence by their order within each order, the identifiers from the order row.
// - reaction_jobs: one row per (event, handler), written by the same statement that moves the order.
//   Two partial indexes: the claim walks run_at over the jobs still to run, and the ordering check looks
//   up, per (order, handler), whether an earlier event is still unfinished; done and skipped jobs (the
//   bulk of the table over time) are in neither.
export async function up(db: Kysely<unknown>): Promise<void> {
  // a volatile default is evaluated per row, so existing rows get distinct ids
  await sql`alter table order_status_history
    add column event_id uuid not null default gen_random_uuid(),
    add column sequence integer,
    add column trade_id text,
    add column external_reference text`.execute(db)
  await sql`
    update order_status_history h set
      sequence = numbered.sequence,
      trade_id = o.trade_id,
      external_reference = o.external_reference
    from (
      select id, row_number() over (partition by order_id order by id) as sequence from order_status_history
    ) numbered, orders o
    where numbered.id = h.id and o.id = h.order_id`.execute(db)
  await sql`alter table order_status_history add constraint order_status_history_event_id_key unique (event_id)`.execute(db)

  await db.schema
    .createTable('reaction_jobs')
    .addColumn('id', 'bigint', (col) => col.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('event_id', 'uuid', (col) => col.notNull())
    .addColumn('order_id', 'integer', (col) => col.notNull())
    .addColumn('sequence', 'integer', (col) => col.notNull())
    .addColumn('handler', 'text', (col) => col.notNull())
    .addColumn('state', 'text', (col) => col.notNull().defaultTo('pending'))
    .addColumn('attempts', 'integer', (col) => col.notNull().defaultTo(0))
    .addColumn('run_at', 'timestamptz', (col) => col.notNull())
    .addColumn('lease_token', 'text')
    .addColumn('lease_expires_at', 'timestamptz')
    .addColumn('last_error', 'text')
    .addColumn('created_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .addColumn('finished_at', 'timestamptz')
    .addUniqueConstraint('reaction_jobs_event_handler_key', ['event_id', 'handler'])
    .addCheckConstraint(
      'reaction_jobs_state_check',
      sql`state in ('pending', 'running', 'done', 'failed', 'skipped')`,
    )
    .execute()

  await db.schema
    .createIndex('reaction_jobs_due_idx')
    .on('reaction_jobs')
    .column('run_at')
    .where(sql.ref('state'), 'in', ['pending', 'running'])
    .execute()

  await db.schema
    .createIndex('reaction_jobs_unfinished_idx')
    .on('reaction_jobs')
    .columns(['order_id', 'handler', 'sequence'])
    .where(sql.ref('state'), 'not in', ['done', 'skipped'])
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropTable('reaction_jobs').execute()
  await sql`alter table order_status_history
    drop column event_id, drop column sequence, drop column trade_id, drop column external_reference`.execute(db)
}
