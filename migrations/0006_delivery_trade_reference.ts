import { type Kysely, sql } from 'kysely'

// webhook_deliveries.trade_reference: the trade's `reference` field of a trade event, stored as the ingest
// parsed it. A parked (unmatched) delivery applied later, or a delivery an operator re-applies, is applied
// from its columns alone, never by parsing its raw body again (which retention may have pruned by then).
// Parked rows stored before this migration get it from their body; other rows need it for nothing (their
// order already took its trade reference when they were applied).
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('webhook_deliveries').addColumn('trade_reference', 'text').execute()
  // one-word aliases: the service's database handle renames result columns to camelCase
  const { rows } = await sql<{ id: string; hash: string; body: string }>`
    select delivery_id as id, body_sha256 as hash, raw_body as body from webhook_deliveries
    where outcome = 'unmatched'`.execute(db)
  for (const row of rows) {
    const reference = referenceOf(row.body)
    if (reference === null) continue
    await sql`update webhook_deliveries set trade_reference = ${reference}
      where delivery_id = ${row.id} and body_sha256 = ${row.hash}`.execute(db)
  }
}

function referenceOf(rawBody: string): string | null {
  try {
    const reference = (JSON.parse(rawBody.replace(/^\ufeff/, '')) as { reference?: unknown }).reference
    return typeof reference === 'string' ? reference : null
  } catch {
    return null
  }
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('webhook_deliveries').dropColumn('trade_reference').execute()
}
