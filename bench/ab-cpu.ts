// A/B of the receiver's own CPU per request between two compiled trees (`npx tsx bench/ab-cpu.ts distA distB
// [pairs] [requests]`): each round starts one service from each tree in turn on the same seeded schema and
// sends it a fixed number of retries of stored deliveries (the path that is all Node: verify, hash, the
// memory of stored ids, log, metrics, answer) and then of new matched deliveries, and reads the process's
// user + system time from /proc. CPU time per request, unlike req/s, is the process's own work: what else
// runs on a shared machine slows the run but does not add to it (much), and the rounds alternate.
// AB_HANDLER=noop: the services run with one in-process no-op reaction handler (bench/serve-noop-handler.mjs;
// both trees must have that seam) and the new matched deliveries' CPU is read once every job they enqueued is
// done: the figure is then the ingest's and the dispatch's per transition. AB_HANDLER=noop-b: only B's
// services run with it (what one handler costs, with the same tree as A and B). AB_B_ENV='NAME=value ...':
// more of B's environment (a setting's effect, with the same tree as A and B). AB_B_NODE_FLAGS='--flag ...':
// Node's flags for B's services (A's are BENCH_NODE_FLAGS or the image's). AB_B_NODE=/path/to/node: B's services run
// on that Node binary (the same tree as A and B: what another Node version costs or saves). AB_CONSOLE=1: each service
// is first asked for one operator console page, and the load starts once that page's deadline and the second after
// it have passed (what the console leaves behind for the deliveries after it).
import { randomBytes } from 'node:crypto'
import { type MakeDelivery, sendDeliveries } from './send-deliveries.js'
import { backendCpu, backendCpuSince, CONSOLE_TOKEN, createBenchSchema, environmentOfB, inAlternatingPairs, median, reactionsDone, visitConsole } from './ab-rounds.js'
import { cpuMs, startService, stopService } from './service-process.js'

const [distA, distB, pairsArg, requestsArg] = process.argv.slice(2)
if (!distA || !distB) throw new Error('usage: ab-cpu.ts distA distB [pairs] [requests]')
const pairs = Number(pairsArg ?? 3)
const requests = Number(requestsArg ?? 6000)
const handlerIn = (name: string) => process.env.AB_HANDLER === 'noop' || (process.env.AB_HANDLER === 'noop-b' && name === 'B')
const envB = environmentOfB()
const run = `ab${randomBytes(3).toString('hex')}`
let sequence = 0

// one counter for the whole run: no delivery id repeats across rounds
const fire = (port: number, make: MakeDelivery, amount: number) => sendDeliveries(port, () => make(sequence++), amount)

const seen = (index: number) => {
  const k = (index % 5000) + 1
  const body = JSON.stringify({ trade_id: `trd-${k}`, reference: `R-${k}`, status: 'funded', external_reference: `bench-${k}` })
  return { deliveryId: `seen-${k}`, body }
}
const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'resolved']
const matched = (index: number) => {
  const order = (index % 100_000) + 1
  const status = STATUSES[Math.min(Math.floor(index / 100_000), 4)]!
  return { deliveryId: `${run}-m-${index}`, body: JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` }) }
}

const bench = await createBenchSchema('bench')
const { admin, url, schema } = bench
// with a handler: waits until every reaction job so far is done, and every event taken by its stream (the dispatch's CPU is counted too)
const jobsDone = async (name: string) => {
  if (handlerIn(name)) await reactionsDone(url)
}
// Postgres's side of the matched deliveries: the CPU of the service's backends (backendCpu) and the
// database's commits, per request
const commits = async () => {
  await admin.query('select pg_stat_force_next_flush()').catch(() => {})
  const { rows } = await admin.query(`select xact_commit::float8 as n from pg_stat_database where datname = current_database()`)
  return Number(rows[0].n)
}
const results: Record<string, { duplicates: number[]; matched: number[]; pgMatched: number[]; commitsMatched: number[] }> = {
  A: { duplicates: [], matched: [], pgMatched: [], commitsMatched: [] },
  B: { duplicates: [], matched: [], pgMatched: [], commitsMatched: [] },
}
await inAlternatingPairs({ pairs, distA, distB, schema: bench }, async (name, dist) => {
  // a handler's stream left by an earlier round would first take every event committed since (the other
  // tree's too): each service with the handler starts it afresh
  await admin.query(`delete from ${schema}.reaction_streams`).catch(() => {})
  const consoleEnv: Record<string, string> = process.env.AB_CONSOLE === '1' ? { ADMIN_TOKEN: CONSOLE_TOKEN } : {}
  const { child, port, adminPort } = await startService(url, { orders: 100_000, seen: 5000 }, { ...consoleEnv, ...(name === 'B' ? envB : {}) }, dist, {
    noopHandler: handlerIn(name),
    ...(name === 'B' && process.env.AB_B_NODE_FLAGS !== undefined ? { nodeFlags: process.env.AB_B_NODE_FLAGS } : {}),
    ...(name === 'B' && process.env.AB_B_NODE !== undefined ? { node: process.env.AB_B_NODE } : {}),
  })
  try {
    if (process.env.AB_CONSOLE === '1') await visitConsole(adminPort)
    await fire(port, seen, 3000) // warm-up
    let before = cpuMs(child.pid!)
    await fire(port, seen, requests)
    results[name]!.duplicates.push(Math.round(((cpuMs(child.pid!) - before) * 1000) / requests))
    await fire(port, matched, 1000) // warm-up
    await jobsDone(name)
    before = cpuMs(child.pid!)
    const backendsBefore = await backendCpu(admin)
    const commitsBefore = await commits()
    await fire(port, matched, requests)
    await jobsDone(name)
    results[name]!.matched.push(Math.round(((cpuMs(child.pid!) - before) * 1000) / requests))
    const commitsAfter = await commits()
    const backendMs = await backendCpuSince(admin, backendsBefore)
    results[name]!.pgMatched.push(Math.round((backendMs * 1000) / requests))
    // less the two statements of each look of jobsDone()
    results[name]!.commitsMatched.push(Number(((commitsAfter - commitsBefore) / requests).toFixed(2)))
  } finally {
    await stopService(child)
  }
})
for (const name of ['A', 'B']) {
  const { duplicates, matched: applied, pgMatched, commitsMatched } = results[name]!
  console.log(
    `${name}: CPU µs/request, duplicates ${duplicates.join(' ')} (median ${median(duplicates)}); new matched ${applied.join(' ')} (median ${median(applied)}); ` +
      `new matched, Postgres backends ${pgMatched.join(' ')} (median ${median(pgMatched)}), commits/request ${commitsMatched.join(' ')}`,
  )
}
