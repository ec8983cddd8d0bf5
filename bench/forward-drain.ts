// How fast one replica forwards a backlog (`npx tsx bench/forward-drain.ts [dist ...] [--events N]
// [--concurrency 8,32] [--answer-ms 0,5] [--runs R]`): N transitions wait in the forwarder's stream, then the
// compiled `serve` (each dist given, in turn, default dist/) starts with FORWARD_URL pointing at a `node:http`
// receiver in this process that answers 204 after --answer-ms, and REACTION_CONCURRENCY slots. Timed from the
// first forward to the last new `webhook-id`. Also read: the service's CPU per event, and how many job rows
// were updated after they were written (a claim or an outcome of the job loop, or a handed-off handler's
// outcome): 0 when every event was done in its stream batch's one write-back. DRAIN_DEBUG=1 also prints the
// first and last forward's time and each write-back's time (seconds) and done jobs.
import { once } from 'node:events'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import { performance } from 'node:perf_hooks'
import { randomBytes } from 'node:crypto'
import { openDatabase } from '../src/db/open-database.js'
import { createLogger } from '../src/logger.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { createOrder } from '../src/orders/create-order.js'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { type BenchSchema, createBenchSchema, median } from './ab-rounds.js'
import { inParallel } from './reactions-bench.js'
import { cpuMs, startService, stopService } from './service-process.js'

const root = path.resolve(import.meta.dirname, '..')
const args = process.argv.slice(2)
const option = (name: string, fallback: string) => {
  const at = args.indexOf(`--${name}`)
  return at >= 0 ? args[at + 1]! : fallback
}
// the places of the options' values (an option not given has none: its -1 + 1 took the first argument, a tree, for one)
const optionValues = new Set(['--events', '--concurrency', '--answer-ms', '--runs'].map((name) => args.indexOf(name)).filter((at) => at >= 0).map((at) => at + 1))
const dists = args.filter((arg, i) => !arg.startsWith('--') && !optionValues.has(i))
if (dists.length === 0) dists.push(path.join(root, 'dist'))
const events = Number(option('events', '20000'))
const concurrencies = option('concurrency', '8').split(',').map(Number)
const answersMs = option('answer-ms', '5').split(',').map(Number)
const runs = Number(option('runs', '2'))
const STATUSES = ['created', 'funded', 'delivered', 'released']
const FORWARD_SECRET = `whsec_${randomBytes(32).toString('base64')}`

interface DrainResult {
  dist: string
  concurrency: number
  answerMs: number
  eventsPerSecond: number
  cpuUsPerEvent: number
  jobRowUpdates: number
  /** Write-backs that recorded done events (batchesOf), and the median gap between them. */
  batches: number
  medianGapMs: number
}

/** A receiver that answers 204 after `answerMs` and counts each webhook-id once. */
async function startReceiver(answerMs: number) {
  const seen = new Set<string>()
  let first: number | undefined
  let whenAll: { count: number; resolve: () => void } | undefined
  const server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      first ??= performance.now()
      seen.add(String(request.headers['webhook-id']))
      if (whenAll && seen.size >= whenAll.count) whenAll.resolve()
      const answer = () => response.writeHead(204).end()
      if (answerMs > 0) setTimeout(answer, answerMs)
      else answer()
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/forward`,
    get first() {
      return first
    },
    all: (count: number) =>
      new Promise<void>((resolve) => {
        if (seen.size >= count) resolve()
        else whenAll = { count, resolve }
      }),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}

/** `count` transitions over count / 4 orders, committed while no forwarder runs: the stream's backlog. */
async function commitBacklog(url: string, count: number) {
  const database = openDatabase({ databaseUrl: url, poolSize: 8, logger: createLogger({ level: 'silent' }) })
  const settings = { staleAfterS: 21_600, handlersFor: () => [FORWARDER_HANDLER] }
  const orders = Math.ceil(count / STATUSES.length)
  try {
    await inParallel(Array.from({ length: orders }, (_, i) => `drain-${i}`), 8, async (reference) => {
      const { order } = await createOrder(database.db, { externalReference: reference, now: () => new Date() }, settings)
      for (const status of STATUSES) {
        const result = await applyObservation(
          database.db,
          { target: { orderId: order.id }, tradeId: `trd-${reference}`, status, source: 'api', observedAt: new Date() },
          settings,
        )
        if (result.outcome !== 'applied') throw new Error(`${reference} → ${status}: ${result.outcome}`)
      }
    })
  } finally {
    await database.close()
  }
  return orders * STATUSES.length
}

async function drain(dist: string, concurrency: number, answerMs: number): Promise<DrainResult> {
  const schema = await createBenchSchema('drain')
  const receiver = await startReceiver(answerMs)
  const env = { FORWARD_URL: receiver.url, FORWARD_SECRET, REACTION_CONCURRENCY: String(concurrency) }
  try {
    // the first start migrates and places the forwarder's stream; what commits after it is its backlog
    await stopService((await startService(schema.url, { orders: 0, seen: 0 }, env, dist)).child)
    const backlog = await commitBacklog(schema.url, events)
    const updatesBefore = await jobRowUpdates(schema)
    const { child } = await startService(schema.url, { orders: 0, seen: 0 }, env, dist)
    try {
      const cpuBefore = cpuMs(child.pid!)
      await receiver.all(backlog)
      const seconds = (performance.now() - receiver.first!) / 1000
      if (process.env.DRAIN_DEBUG) console.error(`first forward ${new Date(Date.now() - seconds * 1000).toISOString()}, last ${new Date().toISOString()}`)
      const cpu = cpuMs(child.pid!) - cpuBefore
      return {
        dist,
        concurrency,
        answerMs,
        eventsPerSecond: Math.round(backlog / seconds),
        cpuUsPerEvent: Math.round((cpu * 1000) / backlog),
        // read once the service has stopped: its backends' statistics are flushed when they exit
        jobRowUpdates: await stopService(child)
          .then(() => new Promise((resolve) => setTimeout(resolve, 500)))
          .then(() => jobRowUpdates(schema))
          .then((after) => after - updatesBefore),
        ...(await batchesOf(schema)),
      }
    } finally {
      if (child.exitCode === null) await stopService(child)
    }
  } finally {
    await receiver.close()
    await schema.drop()
  }
}

async function jobRowUpdates({ admin, schema }: BenchSchema) {
  const { rows } = await admin.query<{ updates: string }>(
    `select coalesce(sum(n_tup_upd), 0) as updates from pg_stat_user_tables where schemaname = $1 and relname = 'reaction_jobs'`,
    [schema],
  )
  return Number(rows[0]!.updates)
}

/**
 * The write-backs that recorded done events, and the median gap between them: each stream batch's record
 * (reaction_stream_batches, one row a batch since migrations/0011) and each distinct updated_at among done
 * job rows (an outcome the job loop or a handed-off handler wrote).
 */
async function batchesOf({ admin, schema }: BenchSchema) {
  const { rows } = await admin.query<{ at: Date; done: number }>(
    `select finished_at as at, events as done from ${schema}.reaction_stream_batches where cardinality(done) > 0
     union all
     select updated_at, count(*)::int from ${schema}.reaction_jobs where state = 'done' group by 1
     order by 1`,
  )
  if (process.env.DRAIN_DEBUG) console.error(rows.map((row) => `${row.at.toISOString().slice(17, 23)} ${row.done}`).join('\n'))
  const gaps = rows.slice(1).map((row, i) => row.at.getTime() - rows[i]!.at.getTime())
  return { batches: rows.length, medianGapMs: gaps.length > 0 ? median(gaps) : 0 }
}

const results: DrainResult[] = []
for (const answerMs of answersMs) {
  for (const concurrency of concurrencies) {
    for (let run = 0; run < runs; run++) {
      // alternate the trees' order from run to run
      for (const dist of run % 2 === 0 ? dists : [...dists].reverse()) {
        const result = await drain(dist, concurrency, answerMs)
        results.push(result)
        console.error(JSON.stringify(result))
      }
    }
  }
}
console.log(`| tree | REACTION_CONCURRENCY | answer ms | events/s | service CPU µs/event | job rows updated after written | write-backs | median ms between |`)
console.log(`|---|---|---|---|---|---|---|---|`)
for (const r of results) {
  console.log(`| ${path.relative(root, r.dist) || r.dist} | ${r.concurrency} | ${r.answerMs} | ${r.eventsPerSecond.toLocaleString('en')} | ${r.cpuUsPerEvent} | ${r.jobRowUpdates.toLocaleString('en')} | ${r.batches} | ${r.medianGapMs} |`)
}
