// A/B of one reaction handler's commit-to-handler latency under a full-speed ingest, between
// two compiled trees (`npx tsx bench/noop-latency-ab.ts distA distB [pairs] [requests]`). Each round starts
// one tree's service with the handler (bench/serve-noop-handler.mjs, which notes when each call began), sends
// `requests` new matched deliveries over 50 connections, and reads from the cluster's commit times
// (track_commit_timestamp = on, bench/commit-latency.ts) how long each transition waited for its handler; and
// the CPU per transition beside it (the service's, its Postgres backends'), since a stream that reads more often
// costs the ingest CPU. Not a rate: autocannon ends a fixed number of requests on its one-second tick, so a
// rate read from its duration moves in steps of a second. A and B alternate within each pair (ab-rounds.ts).
// AB_B_ENV='NAME=value ...': more of B's environment. AB_HANDLER=forwarder: the forwarder instead, POSTing to a
// receiver in its own process (bench/server.ts), each transition's latency read to its arrival there.
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { backendCpu, backendCpuSince, createBenchSchema, environmentOfB, inAlternatingPairs, median } from './ab-rounds.js'
import { type Arrivals, commitTimesTracked, commitToArrivalLatency } from './commit-latency.js'
import { sendDeliveries } from './send-deliveries.js'
import { cpuMs, startBenchServer, startService, stopService } from './service-process.js'

const [distA, distB, pairsArg, requestsArg] = process.argv.slice(2)
if (!distA || !distB) throw new Error('usage: noop-latency-ab.ts distA distB [pairs] [requests]')
const pairs = Number(pairsArg ?? 3)
const requests = Number(requestsArg ?? 30_000)
const ORDERS = 100_000
const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'resolved']
const envB = environmentOfB()
const forwarder = process.env.AB_HANDLER === 'forwarder'
if (!forwarder && process.env.AB_HANDLER && process.env.AB_HANDLER !== 'noop') throw new Error('AB_HANDLER is noop or forwarder')

const bench = await createBenchSchema('latency')
const { admin, url, schema } = bench
if (!(await commitTimesTracked(url))) throw new Error('the cluster does not record commit times (track_commit_timestamp = off)')
let sequence = 0
// each transition a new one: order k climbs the lifecycle one status per 100,000 deliveries
const matched = (index: number) => {
  const order = (index % ORDERS) + 1
  const status = STATUSES[Math.min(Math.floor(index / ORDERS), STATUSES.length - 1)]!
  return { deliveryId: `${schema}-${index}`, body: JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` }) }
}
interface Round {
  p50: number[]
  p99: number[]
  max: number[]
  /** CPU µs per transition, the ingest's and the dispatch's: the service's, and its Postgres backends'. */
  cpu: number[]
  pgCpu: number[]
}
const results: Record<string, Round> = {
  A: { p50: [], p99: [], max: [], cpu: [], pgCpu: [] },
  B: { p50: [], p99: [], max: [], cpu: [], pgCpu: [] },
}
// the forwarder's far end: every transition is POSTed there, and it keeps when each arrived
const receiver = forwarder ? await startBenchServer('receiver', {}) : undefined
const takeArrivals = async () => (await (await fetch(`http://127.0.0.1:${receiver!.port}/arrivals`)).json()) as Arrivals
const handlerEnv = (startsFile: string): Record<string, string> =>
  receiver
    ? { FORWARD_URL: `http://127.0.0.1:${receiver.port}/forward`, FORWARD_SECRET: `whsec_${randomBytes(32).toString('base64')}` }
    : { BENCH_HANDLER_STARTS: startsFile }
// AB_WARM_UP=N: N rounds of the first tree before the pairs, not counted. The first round on a new schema (its
// 100,000 orders just seeded) read the forwarder's p99 at 174-879 ms in six runs on 2026-12-06 (load 10 to 26), in
// four of them above every later round of its run: whichever tree ran first was charged for it
let warmUps = Number(process.env.AB_WARM_UP ?? 0)
const scratch: Round = { p50: [], p99: [], max: [], cpu: [], pgCpu: [] }
const round = async (name: 'A' | 'B', dist: string, into: Round, label: string = name) => {
  await admin.query(`delete from ${schema}.reaction_streams`).catch(() => {})
  const startsDir = mkdtempSync(path.join(os.tmpdir(), 'noop-latency-'))
  const startsFile = path.join(startsDir, 'starts.json')
  const { child, port } = await startService(url, { orders: ORDERS, seen: 0 }, { ...(name === 'B' ? envB : {}), ...handlerEnv(startsFile) }, dist, {
    noopHandler: !receiver,
  })
  let since: Date | undefined
  try {
    await sendDeliveries(port, () => matched(sequence++), 2000) // warm-up
    await new Promise((resolve) => setTimeout(resolve, 1000))
    if (receiver) await takeArrivals() // the warm-up's and an earlier round's
    since = new Date()
    const cpuBefore = cpuMs(child.pid!)
    const backendsBefore = await backendCpu(admin)
    await sendDeliveries(port, () => matched(sequence++), requests)
    // the last events' handlers: the stream's next reads (the forwarder's, its last batch's requests too)
    await new Promise((resolve) => setTimeout(resolve, receiver ? 3000 : 1000))
    into.cpu.push(Math.round(((cpuMs(child.pid!) - cpuBefore) * 1000) / requests))
    into.pgCpu.push(Math.round(((await backendCpuSince(admin, backendsBefore)) * 1000) / requests))
  } finally {
    await stopService(child)
  }
  const arrivals = receiver ? await takeArrivals() : (JSON.parse(readFileSync(startsFile, 'utf8')) as Arrivals)
  const latency = await commitToArrivalLatency(url, arrivals, since)
  rmSync(startsDir, { recursive: true, force: true })
  into.p50.push(Number(latency.p50Ms.toFixed(1)))
  into.p99.push(Number(latency.p99Ms.toFixed(1)))
  into.max.push(Number(latency.maxMs.toFixed(1)))
  console.log(`${label}: CPU µs/transition ${into.cpu.at(-1)} + Postgres ${into.pgCpu.at(-1)}, commit-to-handler p50 ${into.p50.at(-1)} ms, p99 ${into.p99.at(-1)} ms, max ${into.max.at(-1)} ms (${latency.samples} samples)`)
}
await inAlternatingPairs({ pairs, distA, distB, schema: bench }, async (name, dist) => {
  for (; warmUps > 0; warmUps--) await round(name, dist, scratch, `${name} (warm-up, not counted)`)
  await round(name, dist, results[name]!)
})
if (receiver) {
  receiver.child.kill('SIGINT')
  await once(receiver.child, 'exit')
}
for (const name of ['A', 'B']) {
  const { p50, p99, max, cpu, pgCpu } = results[name]!
  console.log(`${name}: CPU µs/transition median ${median(cpu)} + Postgres ${median(pgCpu)}; commit-to-handler p50 median ${median(p50)} ms, p99 ${p99.join(' ')} (median ${median(p99)}) ms, max median ${median(max)} ms`)
}
