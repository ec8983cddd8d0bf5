import { type Kysely, sql } from 'kysely'

// The console's search of deliveries by trade id and by external reference (0003) kept an entry for every
// delivery in two indexes whose keys arrive in no order: each new delivery wrote to a random page of each, and
// after every checkpoint the first change to a page is logged whole. Those two indexes were about four fifths of
// the ingest's WAL and a fifth of its Postgres CPU (bench/results/index-cost.md), more as the table grows.
//
// An applied delivery is already found another way: it made its order's transition, and the history row names
// it (order_status_history.delivery_id, under the order's index). So the two indexes now keep only the
// deliveries that were not applied (parked, stale, duplicates, mismatches, invalid: few, beside the applied),
// and the search finds the applied ones through their order's history (src/webhooks/delivery.repository.ts).
// Their keys end with the console's whole order (received_at, then the primary key), so a reference with many
// deliveries not applied is paged off the index in order, never sorted whole.
//
// On a large table each CREATE INDEX holds writes back while it builds (seconds per million rows); the
// platform retries the deliveries it delays.
const SEARCHES = [
  ['webhook_deliveries_trade_idx', 'webhook_deliveries_unapplied_trade_idx', 'trade_id'],
  ['webhook_deliveries_reference_idx', 'webhook_deliveries_unapplied_reference_idx', 'external_reference'],
] as const

export async function up(db: Kysely<unknown>): Promise<void> {
  for (const [before, after, column] of SEARCHES) {
    await db.schema
      .createIndex(after)
      .on('webhook_deliveries')
      .columns([column, 'received_at', 'delivery_id', 'body_sha256'])
      .where(sql.ref('outcome'), '<>', 'applied')
      .execute()
    await db.schema.dropIndex(before).execute()
  }
}

export async function down(db: Kysely<unknown>): Promise<void> {
  for (const [before, after, column] of SEARCHES) {
    await db.schema.createIndex(before).on('webhook_deliveries').columns([column, 'received_at']).execute()
    await db.schema.dropIndex(after).execute()
  }
}
