import { type Kysely, sql } from 'kysely'

// One schema for Postgres and PGlite. Invariant kept by the order repository: next_poll_at is null
// exactly when the order cannot be polled (no trade id yet, or a terminal status), so the partial
// index below holds only pollable orders and a claim stays O(batch) however many orders exist.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('orders')
    .addColumn('id', 'integer', (col) => col.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('external_reference', 'text', (col) => col.notNull().unique())
    .addColumn('trade_id', 'text', (col) => col.unique())
    .addColumn('trade_reference', 'text')
    .addColumn('trade_status', 'text')
    .addColumn('status_rank', 'integer', (col) => col.notNull().defaultTo(0))
    .addColumn('is_terminal', 'boolean', (col) => col.notNull().defaultTo(false))
    .addColumn('status_source', 'text')
    .addColumn('status_changed_at', 'timestamptz')
    .addColumn('trade_create_state', 'text', (col) => col.notNull().defaultTo('none'))
    .addColumn('next_poll_at', 'timestamptz')
    .addColumn('poll_attempts', 'integer', (col) => col.notNull().defaultTo(0))
    .addColumn('poll_lease_token', 'text')
    .addColumn('poll_lease_expires_at', 'timestamptz')
    .addColumn('last_polled_at', 'timestamptz')
    .addColumn('attention', 'text')
    .addColumn('version', 'integer', (col) => col.notNull().defaultTo(0))
    .addColumn('created_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .addColumn('updated_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .execute()

  await db.schema
    .createIndex('orders_due_idx')
    .on('orders')
    .column('next_poll_at')
    .where(sql.ref('next_poll_at'), 'is not', null)
    .execute()

  await db.schema
    .createTable('webhook_deliveries')
    .addColumn('delivery_id', 'text', (col) => col.primaryKey())
    .addColumn('received_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .addColumn('event_type', 'text', (col) => col.notNull())
    .addColumn('trade_id', 'text')
    .addColumn('external_reference', 'text')
    .addColumn('observed_status', 'text')
    .addColumn('outcome', 'text', (col) => col.notNull())
    .addColumn('order_id', 'integer')
    // the exact body as received (verified UTF-8 JSON), kept for audit and `deliveries reapply`
    .addColumn('raw_body', 'text', (col) => col.notNull())
    .addColumn('applied_at', 'timestamptz')
    .execute()

  // parked deliveries are found by reference the moment their order is created
  await db.schema
    .createIndex('webhook_deliveries_unmatched_idx')
    .on('webhook_deliveries')
    .column('external_reference')
    .where(sql.ref('outcome'), '=', 'unmatched')
    .execute()

  await db.schema
    .createIndex('webhook_deliveries_received_idx')
    .on('webhook_deliveries')
    .column('received_at')
    .execute()

  await db.schema
    .createTable('order_status_history')
    .addColumn('id', 'bigint', (col) => col.primaryKey().generatedAlwaysAsIdentity())
    // no foreign key: rows are only written by the ingest statement, from the order row it has locked,
    // and a constraint trigger would cost every webhook a second lookup
    .addColumn('order_id', 'integer', (col) => col.notNull())
    .addColumn('from_status', 'text')
    .addColumn('to_status', 'text', (col) => col.notNull())
    .addColumn('source', 'text', (col) => col.notNull())
    .addColumn('delivery_id', 'text')
    .addColumn('recorded_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .execute()

  await db.schema
    .createIndex('order_status_history_order_idx')
    .on('order_status_history')
    .columns(['order_id', 'id'])
    .execute()

  await db.schema
    .createTable('reconcile_runs')
    .addColumn('id', 'integer', (col) => col.primaryKey().generatedAlwaysAsIdentity())
    .addColumn('replica', 'text', (col) => col.notNull())
    .addColumn('started_at', 'timestamptz', (col) => col.notNull())
    .addColumn('finished_at', 'timestamptz')
    .addColumn('polled', 'integer', (col) => col.notNull().defaultTo(0))
    .addColumn('changed', 'integer', (col) => col.notNull().defaultTo(0))
    .addColumn('errors', 'integer', (col) => col.notNull().defaultTo(0))
    .addColumn('stopped_reason', 'text')
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropTable('reconcile_runs').execute()
  await db.schema.dropTable('order_status_history').execute()
  await db.schema.dropTable('webhook_deliveries').execute()
  await db.schema.dropTable('orders').execute()
}
