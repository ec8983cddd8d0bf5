import { type Kysely, sql } from 'kysely'

// Two rules of the status model and of deduplication need a column each:
// - orders.visited_statuses: every status the order has had. No status may be entered twice (an order's
//   history never revisits a status it left), and the decision is taken on the locked order row, so the
//   set lives on that row: a history table read in the same statement would be the statement's snapshot,
//   blind to a concurrent replica's commit.
// - webhook_deliveries.body_sha256: the SHA-256 (hex) of the exact body received. A delivery is the pair
//   (delivery id, body): a retry repeats both and is a duplicate; the same id with another verified body
//   is a different delivery (a reused id) and is stored and applied. So the pair is the primary key; its
//   leading column still serves every lookup by delivery id.
// Rows stored before this migration get the hash of their stored text (for a body that began with a
// byte-order mark, stripped then, that differs from the bytes received: a retry of such an old delivery
// is taken as a reused id, applied by the status rules, which makes it a no-op).
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .alterTable('orders')
    .addColumn('visited_statuses', sql`text[]`, (col) => col.notNull().defaultTo(sql`'{}'::text[]`))
    .execute()
  await sql`
    update orders o set visited_statuses = array(
      select h.to_status from order_status_history h where h.order_id = o.id
      union
      select o.trade_status where o.trade_status is not null
    )`.execute(db)

  await db.schema.alterTable('webhook_deliveries').addColumn('body_sha256', 'text').execute()
  await sql`update webhook_deliveries set body_sha256 = encode(sha256(convert_to(raw_body, 'UTF8')), 'hex')`.execute(db)
  await sql`alter table webhook_deliveries alter column body_sha256 set not null`.execute(db)
  await sql`alter table webhook_deliveries drop constraint webhook_deliveries_pkey`.execute(db)
  await sql`alter table webhook_deliveries add constraint webhook_deliveries_pkey primary key (delivery_id, body_sha256)`.execute(db)
}

export async function down(db: Kysely<unknown>): Promise<void> {
  // keeps the first body stored under each id: the only one the old key can hold
  await sql`
    delete from webhook_deliveries w using webhook_deliveries first
    where first.delivery_id = w.delivery_id
      and (first.received_at, first.body_sha256) < (w.received_at, w.body_sha256)`.execute(db)
  await sql`alter table webhook_deliveries drop constraint webhook_deliveries_pkey`.execute(db)
  await sql`alter table webhook_deliveries add constraint webhook_deliveries_pkey primary key (delivery_id)`.execute(db)
  await db.schema.alterTable('webhook_deliveries').dropColumn('body_sha256').execute()
  await db.schema.alterTable('orders').dropColumn('visited_statuses').execute()
}
