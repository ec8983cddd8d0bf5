// What one ingest statement costs against what each delivery in it costs, on Postgres
// (`npx tsx bench/batch-cost.ts [deliveries per size] [sizes,...]`): new matched deliveries written one
// statement at a time over one connection, in batches of each size in turn (the sizes alternated over two
// rounds), and per delivery the statement's backend CPU, the wall time and the WAL. A fixed cost per statement
// shows as CPU per delivery falling with the batch's size; it is what a group commit that writes smaller
// batches (deliveries arriving spread out, not together) pays more of.
import { CompiledQuery } from 'kysely'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { recordDeliveriesAndApply } from '../src/orders/apply-observation.js'
import { observationSettings } from '../src/orders/observations.js'
import { createBenchSchema } from './ab-rounds.js'
import { matchedDelivery } from './matched-delivery.js'
import { cpuMs } from './service-process.js'

const args = process.argv.slice(2)
const perSize = Number(args.find((arg) => /^\d+$/.test(arg)) ?? 3_000)
const sizes = (args.find((arg) => arg.includes(',')) ?? '1,2,4,8,16,32').split(',').map(Number)
const ROUNDS = 2
const ORDERS = 40_000
const STORED = 200_000

const schema = await createBenchSchema('batch_cost')
const handle = openDatabase({ databaseUrl: schema.url, poolSize: 1 })
const { db } = handle
const raw = async <R>(text: string) => (await db.executeQuery<R>(CompiledQuery.raw(text, []))).rows
try {
  await migrateToLatest(db)
  await raw(`insert into orders (external_reference) select 'bench-' || i from generate_series(1, ${ORDERS}) i`)
  // deliveries stored before, so the runs' own do not change the table's statistics much (a plan made for a far
  // smaller table reads all of it per delivery: stale-statistics.ts)
  await raw(`insert into webhook_deliveries (delivery_id, event_type, outcome, raw_body, body_sha256)
    select 'old-' || i, 'trade.funded', 'applied', '{}', encode(sha256(int4send(i)), 'hex') from generate_series(1, ${STORED}) i`)
  await raw('vacuum analyze')
  await raw('checkpoint')
  const [{ pid }] = (await raw<{ pid: number }>('select pg_backend_pid() as pid')) as [{ pid: number }]
  const walLsn = async () => (await raw<{ lsn: string }>('select pg_current_wal_lsn()::text as lsn'))[0]!.lsn
  const walBytes = async (from: string) =>
    Number((await raw<{ bytes: string }>(`select pg_wal_lsn_diff(pg_current_wal_lsn(), '${from}')::bigint as bytes`))[0]!.bytes)

  const settings = observationSettings({ poll: { staleAfterS: 300 } })
  let next = 0
  const item = () => matchedDelivery(next++, ORDERS)

  // a warm-up of every size (prepared statements, caches)
  for (const size of sizes) await recordDeliveriesAndApply(db, Array.from({ length: size }, item), settings)
  const rows = new Map<number, { cpuUs: number[]; wallUs: number[]; wal: number[] }>()
  for (let round = 0; round < ROUNDS; round++) {
    for (const size of round % 2 === 0 ? sizes : [...sizes].reverse()) {
      // statistics as autovacuum keeps them (the machine's cluster may run without it)
      await raw('analyze')
      const cpuBefore = cpuMs(pid)
      const lsn = await walLsn()
      const started = performance.now()
      let written = 0
      while (written < perSize) {
        const batch = Array.from({ length: Math.min(size, perSize - written) }, item)
        const results = await recordDeliveriesAndApply(db, batch, settings)
        if (results.some((result) => typeof result !== 'object' || result.outcome !== 'applied')) throw new Error('a delivery was not applied')
        written += batch.length
      }
      const row = rows.get(size) ?? { cpuUs: [], wallUs: [], wal: [] }
      row.wallUs.push(((performance.now() - started) * 1000) / perSize)
      row.cpuUs.push(((cpuMs(pid) - cpuBefore) * 1000) / perSize)
      row.wal.push((await walBytes(lsn)) / perSize)
      rows.set(size, row)
    }
  }
  const range = (values: number[]) => `${Math.round(Math.min(...values))}-${Math.round(Math.max(...values))}`
  console.log(`${perSize} new matched deliveries per size and round, ${ROUNDS} rounds, ${ORDERS} orders and ${STORED} deliveries stored before, one connection`)
  console.log('| deliveries a statement | backend CPU µs a delivery | wall µs a delivery | WAL bytes a delivery |')
  console.log('| --- | --- | --- | --- |')
  for (const size of sizes) {
    const row = rows.get(size)!
    console.log(`| ${size} | ${range(row.cpuUs)} | ${range(row.wallUs)} | ${range(row.wal)} |`)
  }
} finally {
  await handle.close()
  await schema.drop()
}
