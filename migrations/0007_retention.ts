import { type Kysely, sql } from 'kysely'

// Retention (src/retention/prune.ts):
// - webhook_deliveries.raw_body becomes nullable: null is a body pruned after RETENTION_DAYS. The row,
//   its body hash and so the deduplication key stay until DELIVERY_RETENTION_DAYS. Dropping NOT NULL is
//   a catalog change only: no rewrite, no scan.
// - retention_progress: how far each pruning task has come (the body pass's "pruned through" time), so a
//   pass starts where the last one stopped instead of re-reading weeks of already pruned rows.
// The passes walk webhook_deliveries_received_idx (0001) and reaction_jobs' primary key: no new index
// on the ingest path.
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`alter table webhook_deliveries alter column raw_body drop not null`.execute(db)
  await db.schema
    .createTable('retention_progress')
    .addColumn('task', 'text', (col) => col.primaryKey())
    .addColumn('done_through', 'timestamptz', (col) => col.notNull())
    .addColumn('updated_at', 'timestamptz', (col) => col.notNull().defaultTo(sql`now()`))
    .execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropTable('retention_progress').execute()
  // a pruned body cannot come back: the old schema has no way to say "pruned", so those rows go
  await sql`delete from webhook_deliveries where raw_body is null`.execute(db)
  await sql`alter table webhook_deliveries alter column raw_body set not null`.execute(db)
}
