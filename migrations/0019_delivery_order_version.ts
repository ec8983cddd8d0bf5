import type { Kysely } from 'kysely'

// webhook_deliveries.order_version: the order's version once the delivery was recorded against it (the version after
// its move when it applied). A body that asks for a poll (an unknown status, a hold lifted) is a replay only of a copy
// stored since its order last changed (migrations/0017, src/orders/apply-observation.ts). That was told by comparing
// the copy's received_at, one replica's clock, with the order's status_changed_at, another's: with one replica 120 s
// ahead, a hold's lifting was folded as a replay of a funded copy that replica stored before the hold, nothing asked
// for the poll, and the order stayed on_hold for STALE_AFTER_S (found from outside). The version is the database's
// own count of the order's moves, so no clock decides it.
//
// Null for a delivery with no order and for one stored before this migration (the time comparison stays for those).
// Nullable, no default: a catalog change only, no rewrite of the table; in no index (the replay probe reads it from
// the few rows of one body's hash).
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('webhook_deliveries').addColumn('order_version', 'integer').execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('webhook_deliveries').dropColumn('order_version').execute()
}
