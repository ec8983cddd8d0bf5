import type { Kysely } from 'kysely'

// The operator console lists reaction jobs newest first by state (failed and pending are what an operator
// looks for, among a table that is mostly done jobs) and by handler. Without these each list would walk the
// primary key backwards through every done job. The partial indexes of 0004 do not serve: they hold no
// done or skipped job and are not in id order.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.createIndex('reaction_jobs_state_idx').on('reaction_jobs').columns(['state', 'id']).execute()
  await db.schema.createIndex('reaction_jobs_handler_idx').on('reaction_jobs').columns(['handler', 'id']).execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropIndex('reaction_jobs_state_idx').execute()
  await db.schema.dropIndex('reaction_jobs_handler_idx').execute()
}
