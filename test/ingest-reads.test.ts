// What the ingest statement reads for a delivery must not grow with the tables. The statement is prepared, so
// after a few runs Postgres keeps one generic plan for it, chosen on the statistics of that moment and never
// looked at again until they change. Counted here from the database's own statistics (rows read through each
// index, rows read by sequential scans): the work done, whatever the plan's shape and the machine's speed.
import { createHash } from 'node:crypto'
import { type Kysely, sql } from 'kysely'
import { describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { recordDeliveriesAndApply } from '../src/orders/apply-observation.js'
import { observationSettings, webhookObservation } from '../src/orders/observations.js'
import { useTestDatabase } from './helpers/test-database.js'

const settings = observationSettings({ staleAfterS: 300 })

function delivery(order: number, status: string, id: string) {
  const reference = `reads-${order}`
  const body = JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: reference })
  return {
    delivery: { deliveryId: id, eventType: `trade.${status}`, rawBody: body, bodySha256: createHash('sha256').update(body).digest('hex') },
    observation: webhookObservation({ externalReference: reference, tradeId: `trd-${order}`, tradeReference: `R-${order}`, status }, id, new Date()),
  }
}

interface Reads {
  /** Rows of `orders` read: through any of its indexes, and by sequential scans. */
  orders: number
  /** Rows of `webhook_deliveries` read by sequential scans. */
  deliveriesScanned: number
}

// one connection (poolSize 1 on Postgres; PGlite has one), so the statistics this session gathered are the
// ingest's, and are flushed before they are read
async function reads(db: Kysely<Database>): Promise<Reads> {
  await sql`select pg_stat_force_next_flush()`.execute(db)
  await sql`select pg_stat_clear_snapshot()`.execute(db)
  const { rows } = await sql<{ orders: string; deliveriesScanned: string }>`
    select
      (select coalesce(sum(idx_tup_read), 0) from pg_stat_user_indexes where relid = 'orders'::regclass)
        + (select coalesce(seq_tup_read, 0) from pg_stat_user_tables where relid = 'orders'::regclass) as orders,
      (select coalesce(seq_tup_read, 0) from pg_stat_user_tables where relid = 'webhook_deliveries'::regclass)
        as deliveries_scanned`.execute(db)
  return { orders: Number(rows[0]!.orders), deliveriesScanned: Number(rows[0]!.deliveriesScanned) }
}

describe('the ingest statement as the tables grow', () => {
  const database = useTestDatabase({ poolSize: 1 })

  it("reads a few rows of orders for each delivery, with 20,000 orders stored (an order's first event included)", async () => {
    const { db } = database
    const ORDERS = 20_000
    await sql`insert into orders (external_reference) select 'reads-' || i from generate_series(1, ${ORDERS}::int) i`.execute(db)
    // the statistics autovacuum would keep
    await sql`analyze orders`.execute(db)

    // enough statements for the generic plan (Postgres plans the first five for their values)
    const BATCHES = 40
    const BATCH = 10
    const before = await reads(db)
    for (let batch = 0; batch < BATCHES; batch++) {
      const items = Array.from({ length: BATCH }, (_, k) => delivery(batch * BATCH + k + 1, 'funded', `reads-${batch}-${k}`))
      const results = await recordDeliveriesAndApply(db, items, settings)
      expect(results.map((result) => (result === 'duplicate' ? result : result.outcome))).toEqual(items.map(() => 'applied'))
    }
    const after = await reads(db)

    const delivered = BATCHES * BATCH
    // per delivery: its order by external reference, the trade id's other owner (none), the order's update by
    // id; a statement that hashed every order's trade id read 20,000 a statement (2,000 a delivery here)
    expect((after.orders - before.orders) / delivered).toBeLessThanOrEqual(5)
  })
})
