// A/B of one schema change's cost to the full ingest (`AB_B_SQL='drop index …; alter table …' npx tsx
// bench/ab-schema.ts [pairs] [requests]`): two bench schemas, A as migrated and B with AB_B_SQL run on it once
// after its first service migrated and seeded it (statements split on `;`, each run alone, so VACUUM may be one).
// Each pair starts the compiled service on A and on B in turn and sends it `requests` new matched deliveries that
// walk a fresh set of orders through their lifecycle (each order created, funded, delivered, disputed and resolved
// within the run, so an order's first update, which links its trade id, is one of five). Per request: the
// service's CPU, its Postgres backends' CPU, the WAL written and, of the updates of `orders`, how many were HOT.
// WAL_STATS=1: the WAL of each run by record type (pg_walinspect, Postgres 15+, in the bench database's public
// schema: `create extension pg_walinspect` as a superuser).
import { randomBytes } from 'node:crypto'
import pg from 'pg'
import { backendCpu, backendCpuSince, createBenchSchema, median } from './ab-rounds.js'
import { sendDeliveries } from './send-deliveries.js'
import { cpuMs, startService, stopService } from './service-process.js'

const pairs = Number(process.argv[2] ?? 3)
const requests = Number(process.argv[3] ?? 10_000)
const statementsOfB = (process.env.AB_B_SQL ?? '').split(';').filter((statement) => statement.trim())
const WARM_UP = 1_000
const run = randomBytes(3).toString('hex')
const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'resolved']
// each run its own orders, each taken through the five statuses
const perStatus = Math.ceil((requests + WARM_UP) / STATUSES.length)
let firstOrder = 0
const matched = (index: number) => {
  const order = firstOrder + (index % perStatus) + 1
  const status = STATUSES[Math.min(Math.floor(index / perStatus), STATUSES.length - 1)]!
  return { deliveryId: `${run}-${firstOrder}-${index}`, body: JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` }) }
}

const A = await createBenchSchema('aba')
const B = await createBenchSchema('abb')
const position = async (client: pg.Client) => (await client.query<{ lsn: string }>('select pg_current_wal_lsn()::text as lsn')).rows[0]!.lsn
const walBetween = async (client: pg.Client, from: string, to: string) =>
  Number((await client.query<{ bytes: string }>('select pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::text as bytes', [from, to])).rows[0]!.bytes)
const updates = async (client: pg.Client, schema: string) => {
  await client.query('select pg_stat_force_next_flush()').catch(() => {})
  const { rows } = await client.query('select n_tup_upd::int as all, n_tup_hot_upd::int as hot from pg_stat_user_tables where schemaname = $1 and relname = $2', [schema, 'orders'])
  return rows[0] as { all: number; hot: number }
}
const results: Record<'A' | 'B', { server: number[]; postgres: number[]; wal: number[]; hot: string[] }> = {
  A: { server: [], postgres: [], wal: [], hot: [] },
  B: { server: [], postgres: [], wal: [], hot: [] },
}
let changed = false
try {
  for (let pair = 0; pair < pairs; pair++) {
    const order: ['A' | 'B', typeof A][] = pair % 2 === 0 ? [['A', A], ['B', B]] : [['B', B], ['A', A]]
    for (const [name, schema] of order) {
      const { child, port } = await startService(schema.url, { orders: 500_000, seen: 5000 }, {})
      try {
        const admin = schema.admin
        if (name === 'B' && !changed) {
          changed = true
          await admin.query(`set search_path = ${schema.schema}`)
          for (const statement of statementsOfB) await admin.query(statement)
          await admin.query('reset search_path')
        }
        let sequence = 0
        const fire = (amount: number) => sendDeliveries(port, () => matched(sequence++), amount)
        await fire(WARM_UP)
        const updatesBefore = await updates(admin, schema.schema)
        const serverBefore = cpuMs(child.pid!)
        const backendsBefore = await backendCpu(admin)
        const walFrom = await position(admin)
        await fire(requests)
        const walTo = await position(admin)
        results[name].server.push(Math.round(((cpuMs(child.pid!) - serverBefore) * 1000) / requests))
        results[name].postgres.push(Math.round(((await backendCpuSince(admin, backendsBefore)) * 1000) / requests))
        results[name].wal.push(Math.round((await walBetween(admin, walFrom, walTo)) / requests))
        await new Promise((resolve) => setTimeout(resolve, 600))
        const updatesAfter = await updates(admin, schema.schema)
        results[name].hot.push(`${updatesAfter.hot - updatesBefore.hot}/${updatesAfter.all - updatesBefore.all}`)
        if (process.env.WAL_STATS) {
          const { rows } = await admin.query(
            `select "resource_manager/record_type" as type, count, combined_size, fpi_size from public.pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true)
             where count > 0 order by combined_size desc limit 8`,
            [walFrom, walTo],
          )
          for (const row of rows) {
            console.log(`${name} pair ${pair + 1}: ${row.type} ${(row.count / requests).toFixed(2)}/request, ${Math.round(row.combined_size / requests)} B/request (full pages ${Math.round(row.fpi_size / requests)})`)
          }
        }
        firstOrder += perStatus
      } finally {
        await stopService(child)
      }
    }
  }
} finally {
  await A.drop()
  await B.drop()
}
for (const name of ['A', 'B'] as const) {
  const { server, postgres, wal, hot } = results[name]
  console.log(
    `${name}: per request, service CPU µs ${server.join(' ')} (median ${median(server)}); Postgres backends µs ${postgres.join(' ')} (median ${median(postgres)}); ` +
      `WAL bytes ${wal.join(' ')} (median ${median(wal)}); HOT updates of orders ${hot.join(' ')}`,
  )
}
