import { type Kysely, sql } from 'kysely'

// A verified body is stored once for each effect it had, not once for each delivery id it came under. The id is
// not signed, so one captured body, replayed under fresh ids, was stored again each time: 200 replays of a 200 KB
// seller event grew webhook_deliveries by 41 MB (an outside attack), without end but by rate and retention, until
// DATA_DIR_MIN_FREE refused every real webhook. Now a body whose SHA-256 a stored delivery that changed nothing
// already has (ignored, stale, a duplicate of an effect, parked, dismissed, invalid ...) is answered as a duplicate
// and not stored (src/orders/apply-observation.ts, src/webhooks/delivery.repository.ts).
//
// The index that finds such a body: only the deliveries that were not applied, so the ingest's hot path (a
// delivery that moves its order) writes no entry to it. On a large table CREATE INDEX holds writes back while it
// builds (seconds per million rows); the platform retries the deliveries it delays.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createIndex('webhook_deliveries_unapplied_body_idx')
    .on('webhook_deliveries')
    .column('body_sha256')
    .where(sql.ref('outcome'), '<>', 'applied')
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropIndex('webhook_deliveries_unapplied_body_idx').execute()
}
