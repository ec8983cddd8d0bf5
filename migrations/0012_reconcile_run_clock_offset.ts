import type { Kysely } from 'kysely'

// reconcile_runs.clock_offset_s: seconds the platform's clock was ahead of this machine's (negative: behind),
// read from the Date header of the 401 that stopped the run, when that was past CLOCK_OFFSET_THRESHOLD_S
// (src/partner-api/clock-offset.ts); null for every other run. Without it a refused run said only
// "unauthorized", and the offset that explained it was in one log line. Adding a nullable column without a
// default is a catalog change only: no rewrite, no scan.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('reconcile_runs').addColumn('clock_offset_s', 'integer').execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('reconcile_runs').dropColumn('clock_offset_s').execute()
}
