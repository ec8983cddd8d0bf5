import type { Kysely } from 'kysely'

// orders.trade_create_wait_ms: how long the command that marked a create `pending` waits for its answer (its own
// PARTNER_API_TIMEOUT_MS and CREATE_MARGIN_MS), written with the mark. Until then another command must not take the
// create over, since its answer may still come and link the trade. Judged by the other command's own timeout, a
// CLI run with a shorter PARTNER_API_TIMEOUT_MS than the service's took a create still at the platform for lost, and a
// --retry made a second trade. Null for a mark written before this column, and set back to null when the create
// leaves `pending` for a state that can lead back to it, so an older replica's later mark (during a rolling upgrade) is judged by the judge's own time,
// not by a whole time left from another command. Nullable, no default: a catalog change only.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('orders').addColumn('trade_create_wait_ms', 'integer').execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('orders').dropColumn('trade_create_wait_ms').execute()
}
