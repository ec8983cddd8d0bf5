// `npm run bench -- prune`: ingest latency while `serve` prunes 1,000,000 old deliveries, against the same
// ingest with the pruner held off, in one run on Postgres. The receiver is the compiled `serve` with
// PRUNE_INTERVAL_S=1; the bench holds the retention advisory lock (as another replica pruning would) to keep
// it off, and lets go of it to let it prune. Also measured: the pass's delete rate under load, and a
// batched DELETE's rate with no pause and no load (the number the README's partitioning decision uses).
// Writes bench/results/latest-prune(-quick).md and .json.
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { setTimeout as delay } from 'node:timers/promises'
import pg from 'pg'
import { PRUNE_LOCK_KEY } from '../src/retention/prune.js'
import { startService } from './service-process.js'

const root = path.resolve(import.meta.dirname, '..')

export interface LoadRun {
  name: string
  requests: number
  rps: number
  p50: number
  p99: number
  non2xx: number
  errors: number
}

export interface PruneBenchDeps {
  url: string
  quick: boolean
  durationS: number
  orders: number
  /** Drives the receiver at `port` for `seconds` with deliveries for the seeded orders. */
  load: (name: string, port: number, seconds: number) => Promise<LoadRun>
}

const DAY_S = 86_400

async function seedOldDeliveries(client: pg.Client, count: number, prefix: string): Promise<number> {
  const started = performance.now()
  // 100 to 130 days old, spread evenly; bodies the size of a trade event
  await client.query(
    `insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference,
                                     observed_status, outcome, raw_body)
     select $2 || i, md5(i::text) || md5($2 || i), now() - interval '100 days' - (i * ($3::float8 / $1) * interval '1 second'),
            'trade.funded', 'trd-old-' || i, 'old-' || i, 'funded', 'applied',
            '{"trade_id":"trd-old-' || i || '","reference":"R-' || i || '","status":"funded","external_reference":"old-' || i || '"}'
     from generate_series(1, $1::int) as i`,
    [count, prefix, 30 * DAY_S],
  )
  await client.query('analyze webhook_deliveries')
  return (performance.now() - started) / 1000
}

async function prunedSoFar(adminPort: number): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text()
  return Number(/^retention_rows_pruned_total\{what="delivery"\} (\d+)/m.exec(text)?.[1] ?? 0)
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  return sorted.length % 2 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2
}

export async function runPruneBench({ url, quick, durationS, orders, load }: PruneBenchDeps): Promise<void> {
  const rows = 1_000_000
  const rounds = quick ? 1 : 3
  const lock = new pg.Client({ connectionString: url })
  await lock.connect()
  const without: LoadRun[] = []
  const during: LoadRun[] = []
  let seedSeconds = 0
  let prunedDuringLoad = 0
  let loadSecondsPruning = 0
  const rawRows = quick ? 100_000 : 300_000
  let rawRate: number
  try {
    // rounds in turn, each with a fresh serve: the held-off run, then the run while it prunes; stopping the
    // service stops its pass between two batches, and the next round's pass goes on from there
    for (let round = 0; round < rounds; round++) {
      // taken before the service starts, so its first tick finds it held; after a round, this waits until
      // the stopped service's session (and its lock) is gone
      await lock.query('select pg_advisory_lock($1::bigint)', [PRUNE_LOCK_KEY])
      const service = await startService(url, { orders, seen: 0 }, { PRUNE_INTERVAL_S: '1' })
      try {
        if (round === 0) {
          seedSeconds = await seedOldDeliveries(lock, rows, 'old-')
          await lock.query('vacuum analyze webhook_deliveries')
          await lock.query('checkpoint')
        }
        // longer than the other benches' warm-up: the held-off run comes first on a fresh process
        await load('warm-up', service.port, 5)
        without.push(await load(`round ${round + 1}: ingest, pruner held off`, service.port, durationS))
        await lock.query('select pg_advisory_unlock($1::bigint)', [PRUNE_LOCK_KEY])
        // the pruner's next tick (within a second) takes the lock: the load starts once it has pruned a batch
        while ((await prunedSoFar(service.adminPort)) === 0) await delay(50)
        const started = performance.now()
        const before = await prunedSoFar(service.adminPort)
        during.push(await load(`round ${round + 1}: ingest while serve prunes`, service.port, durationS))
        const pruned = (await prunedSoFar(service.adminPort)) - before
        if (pruned === 0) throw new Error('nothing pruned during the load')
        prunedDuringLoad += pruned
        loadSecondsPruning += (performance.now() - started) / 1000
      } finally {
        service.child.kill('SIGINT')
        await new Promise((resolve) => service.child.once('exit', resolve))
      }
    }
    const { rows: left } = await lock.query<{ left: string }>(
      `select count(*) as left from webhook_deliveries where delivery_id like 'old-%'`,
    )
    if (Number(left[0]!.left) === 0) throw new Error('the pass ended before the last load did: seed more rows')

    // the raw rate: batches of 1,000 back to back, no pause, no load (what dropping a partition replaces)
    await lock.query(`delete from webhook_deliveries where delivery_id like 'old-%'`)
    await seedOldDeliveries(lock, rawRows, 'raw-')
    await lock.query('vacuum analyze webhook_deliveries')
    const rawStarted = performance.now()
    for (;;) {
      const { rowCount } = await lock.query(
        `delete from webhook_deliveries where ctid = any(array(
           select ctid from webhook_deliveries where received_at < now() - interval '90 days' and outcome <> 'unmatched'
           order by received_at limit 1000))`,
      )
      if (!rowCount) break
    }
    rawRate = rawRows / ((performance.now() - rawStarted) / 1000)
  } finally {
    await lock.end()
  }

  const baselineP99 = median(without.map((run) => run.p99))
  const pruningP99 = median(during.map((run) => run.p99))
  const ratio = pruningP99 / baselineP99
  const underLoadRate = prunedDuringLoad / loadSecondsPruning
  const report = {
    date: new Date().toISOString(),
    rows,
    rounds,
    durationS,
    seedSeconds,
    runs: [...without, ...during],
    baselineP99,
    pruningP99,
    p99Ratio: ratio,
    prunedDuringLoad,
    prunedRowsPerSecondUnderLoad: Math.round(underLoadRate),
    rawDeleteRowsPerSecond: Math.round(rawRate),
    rawRows,
  }
  const runs = without.flatMap((run, index) => [run, during[index]!])
  const table = [
    '| run | req/s | p50 ms | p99 ms | non-2xx | errors |',
    '|---|---|---|---|---|---|',
    ...runs.map((run) => `| ${run.name} | ${run.rps} | ${run.p50} | ${run.p99} | ${run.non2xx} | ${run.errors} |`),
  ].join('\n')
  const markdown = `# Retention benchmark

${report.date}. Postgres; the compiled \`serve\` (PRUNE_INTERVAL_S=1, batches of 1,000, 50 ms pause); ${rows.toLocaleString('en')} deliveries 100 to 130 days old seeded (${seedSeconds.toFixed(0)} s), then vacuumed and checkpointed; ${rounds} round(s) of two ${durationS} s load runs on a fresh \`serve\`: first with the pruner held off (the bench holds the retention lock, as another replica pruning would), then while it prunes. Matched deliveries for ${orders.toLocaleString('en')} orders, 50 connections.

## Targets

| target | measured | met |
|---|---|---|
| ingest p99 while pruning within 1.5× of without (medians over the rounds) | ${pruningP99} / ${baselineP99} ms = ${ratio.toFixed(2)}× | ${ratio <= 1.5 ? 'yes' : 'no'} |

## Ingest

${table}

## Delete rates

| measure | value |
|---|---|
| rows pruned during the loads (${loadSecondsPruning.toFixed(0)} s in all) | ${prunedDuringLoad.toLocaleString('en')}, ${Math.round(underLoadRate).toLocaleString('en')} rows/s (with the 50 ms pauses, under ingest load) |
| batched DELETE of 1,000 by ctid, back to back, no load (${rawRows.toLocaleString('en')} rows) | ${Math.round(rawRate).toLocaleString('en')} rows/s |
`
  process.stdout.write(markdown)
  const suffix = quick ? 'latest-prune-quick' : 'latest-prune'
  writeFileSync(path.join(root, `bench/results/${suffix}.md`), markdown)
  writeFileSync(path.join(root, `bench/results/${suffix}.json`), `${JSON.stringify(report, null, 2)}\n`)
}
