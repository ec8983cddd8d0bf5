// How the ingest's costs grow with the data (`npm run bench -- growth`): the tables are filled in SQL
// (generate_series, no round trip per row) with deliveries and orders as the ingest leaves them, then
// autovacuum's work is done at once (VACUUM ANALYZE: the visibility map an index-only scan needs, and the
// statistics) and the same ingest as on empty tables is measured again by run.ts. Also here: the plans of
// the two lookups the ingest statement makes per delivery (is this delivery stored? is its id stored with
// another body?), which must stay index-only scans of the primary key however large the table.
import pg from 'pg'

export interface GrowthSeed {
  deliveries: number
  orders: number
  seconds: number
}

const CHUNK = 1_000_000
// transitions stored per seeded order (its history, the reactions' outbox)
const HISTORY_PER_ORDER = 5
const STATUSES = `array['created', 'funded', 'delivered', 'disputed', 'resolved']`

/**
 * Adds `deliveries` stored deliveries and `orders` orders to a migrated schema (the bench's own orders,
 * bench-1.., among them): deliveries spread over the orders and five statuses, most applied, some
 * unmatched and a few of other event types, received one every 100 ms up to now; and five transitions of
 * history per order.
 */
export async function seedGrowth(url: string, { deliveries, orders }: { deliveries: number; orders: number }): Promise<GrowthSeed> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  const started = Date.now()
  try {
    await client.query(
      `insert into orders (external_reference) select 'bench-' || i from generate_series(1, $1::int) i on conflict do nothing`,
      [orders],
    )
    for (let from = 1; from <= deliveries; from += CHUNK) {
      const to = Math.min(deliveries, from + CHUNK - 1)
      await client.query(
        `insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, trade_reference,
           external_reference, observed_status, outcome, order_id, raw_body, applied_at)
         select 'g-' || i, md5(i::text) || md5((-i)::text), now() - ($2::int - i) * interval '100 milliseconds',
           case when i % 50 = 0 then 'seller.updated' else 'trade.' || s end,
           'trd-g-' || o, 'R-' || o, 'bench-' || o, s,
           case when i % 50 = 0 then 'ignored' when i % 20 = 0 then 'unmatched' else 'applied' end,
           case when i % 20 = 0 then null else o end,
           '{"trade_id":"trd-g-' || o || '","reference":"R-' || o || '","status":"' || s || '","external_reference":"bench-' || o || '"}',
           case when i % 20 = 0 then null else now() end
         from generate_series($1::int, $3::int) i,
           lateral (select (i % $4::int) + 1 as o, (${STATUSES})[1 + i % 5] as s) x`,
        [from, deliveries, to, orders],
      )
      process.stderr.write(`growth: ${to.toLocaleString('en')} deliveries stored (${Math.round((Date.now() - started) / 1000)} s)\n`)
    }
    // each order's history as the ingest leaves it: five transitions, each with its event id (random, the
    // column's default) and sequence; in chunks of orders, each statement within the read timeout
    const perChunk = CHUNK / HISTORY_PER_ORDER
    for (let from = 1; from <= orders; from += perChunk) {
      await client.query(
        `insert into order_status_history (order_id, from_status, to_status, source, delivery_id, recorded_at,
           sequence, trade_id, external_reference)
         select o.id, case when n = 1 then null else (${STATUSES})[n - 1] end, (${STATUSES})[n], 'webhook',
           'h-' || o.id || '-' || n, now() - interval '1 day' + n * interval '1 minute', n, 'trd-g-' || o.id,
           o.external_reference
         from orders o, generate_series(1, ${HISTORY_PER_ORDER}) n
         where o.id between $1 and $2`,
        [from, from + perChunk - 1],
      )
    }
    await client.query('vacuum analyze webhook_deliveries')
    await client.query('vacuum analyze orders')
    await client.query('vacuum analyze order_status_history')
    // the seed leaves gigabytes of dirty buffers and WAL behind it: flushed now, not by the checkpoint that
    // would otherwise fall inside the measured run (a table that grew over months carries no such debt)
    await client.query('checkpoint')
    return { deliveries, orders, seconds: Math.round((Date.now() - started) / 1000) }
  } finally {
    await client.end()
  }
}

/** EXPLAIN (ANALYZE, BUFFERS) of the ingest's two per-delivery lookups, for a stored delivery and a new one. */
export async function explainDedupLookups(url: string): Promise<{ plans: string; indexOnly: boolean }> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query<{ delivery_id: string; body_sha256: string }>(
      `select delivery_id, body_sha256 from webhook_deliveries where delivery_id = 'g-1'`,
    )
    const stored = rows[0] ?? { delivery_id: 'g-1', body_sha256: '' }
    const lookups = [
      ['a retry of a stored delivery (same id, same body)', 'stored', `delivery_id = $1 and body_sha256 = $2`, [stored.delivery_id, stored.body_sha256]],
      ['a new delivery', 'stored', `delivery_id = $1 and body_sha256 = $2`, ['new-delivery', stored.body_sha256]],
      ['its id stored with another body (a reused id)', 'reused', `delivery_id = $1 and body_sha256 <> $2`, [stored.delivery_id, stored.body_sha256]],
    ] as const
    const sections: string[] = []
    let indexOnly = true
    // generic plans (parameters, not values), as the prepared ingest statement runs once it is warm
    await client.query(`set plan_cache_mode = force_generic_plan`)
    for (const [name, statement, condition, [id, hash]] of lookups) {
      await client.query(`prepare ${statement}_${sections.length} (text, text) as select 1 from webhook_deliveries w where ${condition}`)
      const explained = await client.query(
        `explain (analyze, buffers) execute ${statement}_${sections.length} (${client.escapeLiteral(id)}, ${client.escapeLiteral(hash)})`,
      )
      const plan = explained.rows.map((row: Record<string, string>) => row['QUERY PLAN']).join('\n')
      if (!/Index Only Scan using webhook_deliveries_pkey/.test(plan) || !/Heap Fetches: 0/.test(plan)) indexOnly = false
      sections.push(`-- ${name}\n${plan}`)
    }
    return { plans: sections.join('\n\n'), indexOnly }
  } finally {
    await client.end()
  }
}
