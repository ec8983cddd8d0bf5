// What one no-op reaction handler's dispatch costs per event on its own, without the ingest beside it
// (`npx tsx bench/dispatch-cpu.ts distA distB [pairs] [events]`). Each round ingests `events` new transitions
// through a service without handlers, then starts the tree's service with the no-op handler
// (bench/serve-noop-handler.mjs), rewinds its stream to just before those transitions and times the drain
// until each has its done job: twice, and only the second drain is counted (the first warms the JIT up).
// Reported per event: the service's CPU (its main thread apart) and the CPU of the service's Postgres backends.
// A and B alternate within each pair, as in ab-cpu.ts. AB_B_ENV='NAME=value ...': more of the environment of B's
// service with the handler (a setting's effect, with the same tree as A and B).
import { backendCpu, backendCpuSince, createBenchSchema, environmentOfB, inAlternatingPairs, median } from './ab-rounds.js'
import { sendDeliveries } from './send-deliveries.js'
import { cpuMs, startService, stopService } from './service-process.js'

const [distA, distB, pairsArg, eventsArg] = process.argv.slice(2)
if (!distA || !distB) throw new Error('usage: dispatch-cpu.ts distA distB [pairs] [events]')
const pairs = Number(pairsArg ?? 3)
const events = Number(eventsArg ?? 40_000)
const ORDERS = 20_000
const STATUSES = ['funded', 'delivered', 'disputed', 'resolved', 'released']

const bench = await createBenchSchema('dispatch')
const { admin, url, schema } = bench

// the process's main thread's CPU: its task of the same id
const mainThreadMs = (pid: number) => cpuMs(pid, pid)
let sequence = 0
const ingest = async (dist: string) => {
  const { child, port } = await startService(url, { orders: ORDERS, seen: 0 }, {}, dist)
  try {
    const first = sequence
    await sendDeliveries(
      port,
      () => {
        const index = sequence++ - first
        const order = (index % ORDERS) + 1
        const status = STATUSES[Math.floor(index / ORDERS) % STATUSES.length]
        const body = JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` })
        return { deliveryId: `${schema}-${sequence}`, body }
      },
      events,
    )
  } finally {
    await stopService(child)
  }
}

// rewinds the no-op handler's stream to just before the last `events` transitions and waits until it has handled
// each: its place at the newest transition, written back, and no job of it unfinished. (A first attempt that
// succeeds leaves no job row, only its stream batch's record, since migrations/0011: counting done jobs waited for
// ever.)
const drain = async () => {
  const place = `select stream_position::text as position, id::text from ${schema}.order_status_history
     where stream_position is not null order by stream_position desc, id desc`
  const { rows } = await admin.query<{ position: string; id: string }>(`${place} offset $1 limit 1`, [events])
  const { rows: newest } = await admin.query<{ position: string; id: string }>(`${place} limit 1`)
  const from = rows[0] ?? { position: '0', id: '0' }
  await admin.query(`truncate ${schema}.reaction_jobs`)
  await admin.query(`update ${schema}.reaction_streams set position = $1::xid8, history_id = $2 where handler = 'noop'`, [from.position, from.id])
  await admin.query(`notify reaction_jobs`)
  for (;;) {
    const { rows: handled } = await admin.query(
      `select 1 from ${schema}.reaction_streams
        where handler = 'noop' and (position, history_id) >= ($1::xid8, $2::bigint)
          and not exists (select 1 from ${schema}.reaction_jobs where handler = 'noop' and state <> 'done')`,
      [newest[0]!.position, newest[0]!.id],
    )
    if (handled.length > 0) return
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

const results: Record<string, { service: number[]; main: number[]; postgres: number[] }> = {
  A: { service: [], main: [], postgres: [] },
  B: { service: [], main: [], postgres: [] },
}
await inAlternatingPairs({ pairs, distA, distB, schema: bench }, async (name, dist) => {
  await admin.query(`delete from ${schema}.reaction_streams`).catch(() => {})
  await ingest(dist)
  const { child } = await startService(url, { orders: ORDERS, seen: 0 }, name === 'B' ? environmentOfB() : {}, dist, { noopHandler: true })
  try {
    // its stream exists once the dispatcher started
    for (;;) {
      const { rows } = await admin.query(`select 1 from ${schema}.reaction_streams where handler = 'noop'`)
      if (rows.length > 0) break
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    await drain()
    const service = cpuMs(child.pid!)
    const main = mainThreadMs(child.pid!)
    const postgres = await backendCpu(admin)
    await drain()
    results[name]!.service.push(Math.round(((cpuMs(child.pid!) - service) * 1000) / events))
    results[name]!.main.push(Math.round(((mainThreadMs(child.pid!) - main) * 1000) / events))
    results[name]!.postgres.push(Math.round(((await backendCpuSince(admin, postgres)) * 1000) / events))
  } finally {
    await stopService(child)
  }
})
for (const name of ['A', 'B']) {
  const { service, main, postgres } = results[name]!
  console.log(
    `${name}: CPU µs/event of a warm drain: service ${service.join(' ')} (median ${median(service)}), its main thread ${main.join(' ')} ` +
      `(median ${median(main)}); Postgres's backends ${postgres.join(' ')} (median ${median(postgres)})`,
  )
}
