import { type Kysely, sql } from 'kysely'

// An order whose trade create was sent and never answered (`pending`: the process died at the platform; `unknown`:
// it timed out) has no trade id, so no poll, and waits for the webhook that links its trade. When that webhook was
// lost too, nothing looked at the order again and nothing said so. The poller's cycle now flags those past
// EXPECTED_WEBHOOK_S (orders.attention = trade_create_unknown) through this index: the few unresolved creates,
// by age.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createIndex('orders_unresolved_create_idx')
    .on('orders')
    .column('updated_at')
    .where(sql<boolean>`trade_create_state in ('pending', 'unknown') and trade_id is null and attention is null`)
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropIndex('orders_unresolved_create_idx').execute()
}
