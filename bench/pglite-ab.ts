// A/B of the PGlite ingest between two compiled trees (`npx tsx bench/pglite-ab.ts distA distB [pairs] [seconds]`):
// each pair starts `serve` on embedded PGlite from each tree in turn (A first in even pairs, B first in odd ones),
// on one data directory seeded with orders, sends it a closed-loop load of new matched deliveries (50 connections,
// a fresh range of orders per run) and reads req/s, p50/p99, and the CPU per request of the process, of its HTTP
// thread and of the database's thread (/proc, by thread), after a warm-up of AB_WARM_UP_S seconds (8: a start runs
// PGlite's WebAssembly unoptimised while V8 compiles it on other threads). The machine's noise moves both sides of a
// pair alike; on a busy machine it is still larger than most changes (bench/results/rounds.md, 2026-12-06).
// Each run also reads the process's resident memory after its load, now and at its peak (/proc: VmRSS, VmHWM).
// AB_B_ENV='NAME=value ...': more of B's environment.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import autocannon from 'autocannon'
import { deliveryHeaders } from './bench-secrets.js'
import { cpuMs, startService, stopService } from './service-process.js'
import { environmentOfB, median } from './ab-rounds.js'

const [distA, distB, pairsArg, secondsArg] = process.argv.slice(2)
if (!distA || !distB) throw new Error('usage: pglite-ab.ts distA distB [pairs] [seconds]')
const pairs = Number(pairsArg ?? 3)
const seconds = Number(secondsArg ?? 8)
const warmUpS = Number(process.env.AB_WARM_UP_S ?? 8)
const ORDERS = 20_000
const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'resolved']
const envB = environmentOfB()
const run = `pab${Date.now().toString(36)}`
let sequence = 0
const dataDir = mkdtempSync(path.join(os.tmpdir(), 'pglite-ab-'))

/** The CPU (ms) of each thread of `pid`, by thread id; the database's thread is the one that used most besides the main thread. */
function threadCpu(pid: number): Map<number, number> {
  return new Map(readdirSync(`/proc/${pid}/task`).map((tid) => [Number(tid), cpuMs(pid, Number(tid))]))
}

/** The process's resident memory now and at its peak, MB (/proc's VmRSS and VmHWM). */
function residentMb(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8')
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? 0)
  return { rss: Math.round(kb('VmRSS') / 1024), peak: Math.round(kb('VmHWM') / 1024) }
}

async function load(port: number, offset: number, duration = seconds) {
  let first: number | undefined
  const result = await autocannon({
    url: `http://127.0.0.1:${port}`,
    connections: 50,
    pipelining: 1,
    duration,
    requests: [
      {
        method: 'POST',
        path: '/webhooks/partner',
        setupRequest: ((request: Record<string, unknown>) => {
          const index = sequence++
          first ??= index
          const order = offset + ((index - first) % ORDERS) + 1
          const status = STATUSES[Math.min(Math.floor((index - first) / ORDERS), 4)]!
          const body = JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` })
          request.body = body
          request.headers = deliveryHeaders(body, `${run}-m-${index}`)
          return request
        }) as never,
      },
    ],
  })
  return result
}

const rows: Record<string, unknown>[] = []
let round = 0
try {
  for (let pair = 0; pair < pairs; pair++) {
    const order: ['A' | 'B', string][] = pair % 2 === 0 ? [['A', distA], ['B', distB]] : [['B', distB], ['A', distA]]
    for (const [name, dist] of order) {
      const offset = round++ * ORDERS
      const { child, port } = await startService({ dataDir }, { orders: ORDERS * pairs * 4, seen: 5000 }, name === 'B' ? envB : {}, path.resolve(dist))
      try {
        // the warm-up, on orders of its own
        await load(port, (pairs * 2 + round - 1) * ORDERS, warmUpS)
        const pid = child.pid!
        const before = threadCpu(pid)
        const load1 = os.loadavg()[0]!
        const result = await load(port, offset)
        const after = threadCpu(pid)
        const memory = residentMb(pid)
        const requests = result.requests.total
        const used = [...after].map(([tid, ms]) => [tid, ms - (before.get(tid) ?? 0)] as const).sort((a, b) => b[1] - a[1])
        const main = used.find(([tid]) => tid === pid)?.[1] ?? 0
        const others = used.filter(([tid]) => tid !== pid)
        const database = others[0]?.[1] ?? 0
        const rest = others.slice(1).reduce((sum, [, ms]) => sum + ms, 0)
        const us = (ms: number) => Math.round((ms * 1000) / Math.max(1, requests))
        const row = {
          pair, side: name, rps: Math.round(result.requests.average), p50: result.latency.p50, p99: result.latency.p99,
          non2xx: result.non2xx, errors: result.errors,
          cpuUs: us(main + database + rest), mainUs: us(main), databaseUs: us(database), otherThreadsUs: us(rest), load1: Number(load1.toFixed(2)),
          rssMb: memory.rss, peakRssMb: memory.peak,
        }
        rows.push(row)
        console.log(JSON.stringify(row))
      } finally {
        await stopService(child)
      }
    }
  }
} finally {
  rmSync(dataDir, { recursive: true, force: true })
}
for (const side of ['A', 'B']) {
  const mine = rows.filter((row) => row.side === side)
  const pick = (key: string) => mine.map((row) => row[key] as number)
  console.log(`${side}: req/s ${pick('rps').join(', ')} (median ${median(pick('rps'))}); CPU µs/request ${pick('cpuUs').join(', ')} (median ${median(pick('cpuUs'))}); database thread ${pick('databaseUs').join(', ')}; HTTP thread ${pick('mainUs').join(', ')}; peak RSS MB ${pick('peakRssMb').join(', ')}`)
}
