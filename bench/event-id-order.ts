// `npx tsx bench/event-id-order.ts [deliveries] [rounds]` (run `npm run build` first): what the order of event
// ids costs the ingest once the history is large (migration 0008). Two schemas, each with 1,000,000 orders and
// 5,000,000 transitions of history (growth-bench.ts's seed): one with random event ids, as before 0008, and
// one as migrated (time-ordered ids). In alternating rounds, each after a CHECKPOINT (the moment a random
// write is dearest: the first change to a page after it writes the whole page to the WAL), the compiled
// receiver takes the same number of new matched deliveries into each, and the WAL they wrote is read from
// pg_current_wal_lsn(): bytes per delivery, a figure no other load on the machine changes. The receiver's
// CPU per delivery is printed beside it.
import { once } from 'node:events'
import pg from 'pg'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { seedGrowth } from './growth-bench.js'
import { sendDeliveries } from './send-deliveries.js'
import { cpuMs, startService } from './service-process.js'

const deliveries = Number(process.argv[2] ?? 20_000)
const rounds = Number(process.argv[3] ?? 2)
const baseUrl = process.env.BENCH_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test'
const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'resolved']
const run = Date.now().toString(36)
const schemas = { random: `event_ids_random_${run}`, ordered: `event_ids_ordered_${run}` }

const admin = new pg.Client({ connectionString: baseUrl })
await admin.connect()
const urlOf = (schema: string) => {
  const url = new URL(baseUrl)
  url.searchParams.set('options', `-c search_path=${schema}`)
  return url.toString()
}

async function prepare(schema: string, random: boolean): Promise<void> {
  await admin.query(`create schema ${schema}`)
  const database = openDatabase({ databaseUrl: urlOf(schema), poolSize: 1 })
  await migrateToLatest(database.db)
  await database.close()
  if (random) await admin.query(`alter table ${schema}.order_status_history alter column event_id set default gen_random_uuid()`)
  const seeded = await seedGrowth(urlOf(schema), { deliveries: 0, orders: 1_000_000 })
  process.stderr.write(`${schema}: seeded in ${seeded.seconds} s\n`)
}

async function ingest(schema: string, firstOrder: number): Promise<{ walBytes: number; cpuUs: number; rps: number }> {
  const { child, port } = await startService(urlOf(schema), { orders: 0, seen: 0 })
  try {
    // each round its own orders, climbing the lifecycle one status per pass over them
    const make = (index: number) => {
      const order = firstOrder + (index % 40_000)
      const status = STATUSES[Math.min(Math.floor(index / 40_000), STATUSES.length - 1)]
      const body = JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` })
      return { body, deliveryId: `${run}-${schema}-${firstOrder}-${index}` }
    }
    let sent = 0
    const fire = (amount: number) => sendDeliveries(port, () => make(sent++), amount)
    await fire(1_000)
    await admin.query('checkpoint')
    const [{ lsn: before }] = (await admin.query(`select pg_current_wal_lsn() as lsn`)).rows
    const cpuBefore = cpuMs(child.pid!)
    const result = await fire(deliveries)
    const cpu = cpuMs(child.pid!) - cpuBefore
    const [{ bytes }] = (await admin.query(`select pg_wal_lsn_diff(pg_current_wal_lsn(), $1) as bytes`, [before])).rows
    return { walBytes: Math.round(Number(bytes) / deliveries), cpuUs: Math.round((cpu * 1000) / deliveries), rps: Math.round(result.requests.average) }
  } finally {
    child.kill('SIGINT')
    await once(child, 'exit')
  }
}

try {
  await prepare(schemas.random, true)
  await prepare(schemas.ordered, false)
  const results: Record<string, { walBytes: number; cpuUs: number; rps: number }[]> = { random: [], ordered: [] }
  for (let round = 0; round < rounds; round++) {
    // each round its own orders, so every delivery is a transition and writes one history row
    const order = (['random', 'ordered'] as const)
    for (const kind of round % 2 === 0 ? order : [...order].reverse()) {
      results[kind]!.push(await ingest(schemas[kind], 100_000 + round * 40_000 + 1))
    }
  }
  console.log(JSON.stringify({ deliveries, rounds, loadAverage: (await import('node:os')).loadavg().map((value) => Number(value.toFixed(2))), results }))
} finally {
  for (const schema of Object.values(schemas)) await admin.query(`drop schema if exists ${schema} cascade`)
  await admin.end()
}
