import { type Kysely, sql } from 'kysely'

// orders.partner_env: the platform environment (PARTNER_ENV, sandbox or live) the order's trade lives in, set when the
// order is first linked to a trade (apply-observation.ts), from the PARTNER_ENV of the service or command that linked
// it. A partner going live on the same database had every open sandbox order polled against the live platform: each
// was answered 404, flagged trade_not_found and never polled again. Now the poller's claim leaves an order of the other
// environment as it is (src/orders/poll-schedule.repository.ts), and a webhook or an API answer for it does not move it.
//
// Null for an order not linked yet, and for one linked before this column until an observation of its trade is
// applied (a poll's answer, a webhook): then the environment of the service that applied it. Null is taken as the
// environment the service runs in. Nullable, no default: a catalog change only, no rewrite of the table. In no index: it is written once, with the
// trade id, and the claim reads it as a filter.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .alterTable('orders')
    .addColumn('partner_env', 'text', (col) => col.check(sql`partner_env in ('sandbox', 'live')`))
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('orders').dropColumn('partner_env').execute()
}
