// Where the receiver allocates, per delivery (`npx tsx bench/alloc-profile.ts [dist] [requests]`, after `npm run
// build`): the compiled `serve` on Postgres (BENCH_DATABASE_URL, a schema of its own), with V8's sampling heap
// profiler loaded (bench/alloc-sampler.mjs), sent a fixed number of new matched deliveries, then of retries of
// stored ones, 50 connections; each load sampled alone. The bytes are an estimate from samples (V8 scales each
// sample by its chance of being taken), of everything allocated on the main thread, freed since or not.
//
// ALLOC_FORWARD=1: with the forwarder as the one reaction handler, sending each transition to bench/server.ts's
// receiver (another process): the matched load is then sampled until every transition it made was forwarded, and
// its bytes a request are the ingest's and the forwarding's. ALLOC_NOOP=1: the same with one in-process no-op handler
// (bench/serve-noop-handler.mjs) in the forwarder's place: the stream's dispatch without a request. ALLOC_CONSOLE=1: the service first answers one operator
// console page, and the loads start once that page's deadline and the second after it have passed.
//
// Bytes, unlike time, do not grow with what else runs on the machine: this is a measure a shared machine keeps.
// They do move a little with timing, as the group commit's statements carry more or fewer deliveries each.
// The collector's share of the CPU follows what survives a young collection more than what is allocated, so
// fewer bytes a request is a means to less collection, not a measure of it.
import { randomBytes } from 'node:crypto'
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { CONSOLE_TOKEN, createBenchSchema, reactionsDone, visitConsole } from './ab-rounds.js'
import { type MakeDelivery, sendDeliveries } from './send-deliveries.js'
import { startBenchServer, startService, stopService } from './service-process.js'

interface HeapNode {
  callFrame: { functionName: string; url: string; lineNumber: number }
  selfSize: number
  children: HeapNode[]
}

const root = path.resolve(import.meta.dirname, '..')
const dist = path.resolve(process.argv[2] ?? path.join(root, 'dist'))
const requests = Number(process.argv[3] ?? 20_000)
const top = Number(process.env.ALLOC_TOP ?? 20)
const run = `al${randomBytes(3).toString('hex')}`

const seen: MakeDelivery = (index) => {
  const k = (index % 5000) + 1
  return { deliveryId: `seen-${k}`, body: JSON.stringify({ trade_id: `trd-${k}`, reference: `R-${k}`, status: 'funded', external_reference: `bench-${k}` }) }
}
let sequence = 0
const matched: MakeDelivery = () => {
  const index = sequence++
  const order = (index % 100_000) + 1
  return {
    deliveryId: `${run}-m-${index}`,
    body: JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status: 'funded', external_reference: `bench-${order}` }),
  }
}

/** The package or source file nearest up the stack from a frame (what asked for the bytes), else Node's own. */
function ownerOf(stack: HeapNode[]): string {
  for (let i = stack.length - 1; i >= 0; i--) {
    const url = stack[i]!.callFrame.url
    const inPackage = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url)
    if (inPackage) return inPackage[1]!
    if (/\/src\//.test(url)) return url.replace(/^.*\/(src\/)/, '$1')
  }
  return 'node internals'
}

function summarize(file: string, count: number) {
  const head = JSON.parse(readFileSync(file, 'utf8')).head as HeapNode
  const functions = new Map<string, number>()
  const owners = new Map<string, number>()
  let total = 0
  const walk = (node: HeapNode, stack: HeapNode[]) => {
    const here = [...stack, node]
    if (node.selfSize > 0) {
      total += node.selfSize
      const { functionName, url, lineNumber } = node.callFrame
      const where = url.replace(/^.*node_modules\//, '').replace(/^file:\/\/.*\/src\//, 'src/').replace(/^node:/, '')
      const key = `${functionName || '(anonymous)'}${where ? ` ${where}:${lineNumber + 1}` : ''}`
      functions.set(key, (functions.get(key) ?? 0) + node.selfSize)
      const owner = ownerOf(here)
      owners.set(owner, (owners.get(owner) ?? 0) + node.selfSize)
    }
    for (const child of node.children) walk(child, here)
  }
  walk(head, [])
  const rows = (totals: Map<string, number>) =>
    [...totals.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([key, bytes]) => `| \`${key}\` | ${Math.round(bytes / count).toLocaleString('en')} | ${((bytes / total) * 100).toFixed(1)} % |`)
  return { perRequest: Math.round(total / count), functions: rows(functions), owners: rows(owners) }
}

const dir = mkdtempSync(path.join(os.tmpdir(), 'alloc-profile-'))
const bench = await createBenchSchema('alloc')
try {
  const file = path.join(dir, 'load.heapprofile')
  const receiver = process.env.ALLOC_FORWARD === '1' ? await startBenchServer('receiver', {}) : undefined
  const noopHandler = !receiver && process.env.ALLOC_NOOP === '1'
  const forwarding: Record<string, string> = receiver
    ? { FORWARD_URL: `http://127.0.0.1:${receiver.port}/forward`, FORWARD_SECRET: `whsec_${randomBytes(32).toString('base64')}` }
    : {}
  const consoleEnv: Record<string, string> = process.env.ALLOC_CONSOLE === '1' ? { ADMIN_TOKEN: CONSOLE_TOKEN } : {}
  const { child, port, adminPort } = await startService(bench.url, { orders: 100_000, seen: 5000 }, { ALLOC_PROFILE_FILE: file, ...forwarding, ...consoleEnv }, dist, {
    nodeFlags: `${process.env.BENCH_NODE_FLAGS ?? '--max-semi-space-size=8 --max-old-space-size=512'} --import=${path.join(root, 'bench/alloc-sampler.mjs')}`,
    noopHandler,
  })
  // one load sampled: the first SIGUSR2 starts the sampler, the second writes its profile
  const sampled = async (slug: string, make: MakeDelivery) => {
    rmSync(file, { force: true })
    process.kill(child.pid!, 'SIGUSR2')
    await sendDeliveries(port, make, requests)
    await forwarded()
    process.kill(child.pid!, 'SIGUSR2')
    while (!existsSync(file)) await new Promise((resolve) => setTimeout(resolve, 100))
    // written in one call, but seen before it ends: read it once its size holds
    for (let size = -1; size !== statSync(file).size; ) {
      size = statSync(file).size
      await new Promise((resolve) => setTimeout(resolve, 300))
    }
    // ALLOC_KEEP=dir keeps each load's profile there (Chrome's DevTools opens a .heapprofile)
    if (process.env.ALLOC_KEEP) copyFileSync(file, path.join(process.env.ALLOC_KEEP, `${slug}.heapprofile`))
    return summarize(file, requests)
  }
  // with a handler: until every transition so far was taken by its stream and no job of it is left
  const forwarded = async () => {
    if (receiver || noopHandler) await reactionsDone(bench.url)
  }
  try {
    if (process.env.ALLOC_CONSOLE === '1') await visitConsole(adminPort)
    // warm-up of both paths, unsampled
    await sendDeliveries(port, seen, 3000)
    await sendDeliveries(port, matched, 3000)
    const loads: Array<[string, string, MakeDelivery]> = [
      ['matched', 'new matched deliveries', matched],
      ['retries', 'retries of stored deliveries', seen],
    ]
    const reports: string[] = []
    for (const [slug, name, make] of loads) {
      const summary = await sampled(slug, make)
      reports.push(
        [
          `### ${name}: ${summary.perRequest.toLocaleString('en')} bytes allocated a request (${requests.toLocaleString('en')} requests)`,
          '',
          '| function (its own allocations), line | bytes a request | share |',
          '| --- | --- | --- |',
          ...summary.functions,
          '',
          '| package or source file nearest up the stack | bytes a request | share |',
          '| --- | --- | --- |',
          ...summary.owners,
          '',
        ].join('\n'),
      )
    }
    console.log(
      `## Allocations of the receiver${receiver ? ', the forwarder its one reaction handler' : noopHandler ? ', an in-process no-op its one reaction handler' : ''}, ${new Date().toISOString()}, ${process.version}, ${dist}\n\n${reports.join('\n')}`,
    )
  } finally {
    await stopService(child)
    if (receiver) await stopService(receiver.child)
  }
} finally {
  await bench.drop()
  rmSync(dir, { recursive: true, force: true })
}
