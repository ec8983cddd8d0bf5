import { type Kysely, sql } from 'kysely'

// The operator console searches deliveries by each of these columns, newest first, and lists orders by
// status or by the flag that asks for a human. Without an index each search reads the whole table
// (a million deliveries is an ordinary month for a busy partner). received_at follows the filtered
// column so the newest rows come straight off the index.
// On a large existing table each CREATE INDEX holds writes back while it builds (seconds per million
// rows); the platform retries the deliveries it delays.
const DELIVERY_INDEXES = [
  ['webhook_deliveries_outcome_idx', ['outcome', 'received_at']],
  ['webhook_deliveries_event_type_idx', ['event_type', 'received_at']],
  ['webhook_deliveries_trade_idx', ['trade_id', 'received_at']],
  ['webhook_deliveries_reference_idx', ['external_reference', 'received_at']],
] as const

export async function up(db: Kysely<unknown>): Promise<void> {
  for (const [name, columns] of DELIVERY_INDEXES) {
    await db.schema.createIndex(name).on('webhook_deliveries').columns([...columns]).execute()
  }
  await db.schema.createIndex('orders_status_idx').on('orders').columns(['trade_status', 'id']).execute()
  await db.schema
    .createIndex('orders_attention_idx')
    .on('orders')
    .columns(['attention', 'id'])
    .where(sql.ref('attention'), 'is not', null)
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  for (const [name] of DELIVERY_INDEXES) await db.schema.dropIndex(name).execute()
  await db.schema.dropIndex('orders_status_idx').execute()
  await db.schema.dropIndex('orders_attention_idx').execute()
}
