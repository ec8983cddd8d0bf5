import { type Kysely, sql } from 'kysely'

// webhook_deliveries.partner_env: the platform environment (sandbox or live) whose webhook secret verified the
// delivery: PARTNER_ENV's for one of WEBHOOK_SECRETS, the other one's for one of WEBHOOK_SECRETS_SANDBOX or
// WEBHOOK_SECRETS_LIVE. A trade delivery is an observation of that environment's trade (it links an order under it,
// and does not move an order of the other: src/orders/apply-observation.ts). A parked delivery is applied when its
// order is created, and an operator's `deliveries reapply` runs one again, both from the stored columns alone: without
// this one a sandbox delivery parked at a live service would link its order under live, the limitation the second
// list of secrets removes.
//
// Null for the deliveries stored before this column: applied later as the service's own PARTNER_ENV's, as they were.
// Nullable, no default: a catalog change only, no rewrite of the table; in no index. Its check is NOT VALID: every row
// written from now on is checked, and the table (millions of rows) is not scanned for the old ones, all null, under
// the lock that holds every delivery back.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('webhook_deliveries').addColumn('partner_env', 'text').execute()
  await sql`alter table webhook_deliveries add constraint webhook_deliveries_partner_env_check
    check (partner_env in ('sandbox', 'live')) not valid`.execute(db)
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('webhook_deliveries').dropColumn('partner_env').execute()
}
