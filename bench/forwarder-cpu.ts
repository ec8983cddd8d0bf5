// The forwarder alone, without the service around it (`npx tsx bench/forwarder-cpu.ts distA [distB ...]
// [--events N] [--concurrency C] [--rounds R]`): each compiled tree's createForwarder, in a process of its own,
// sends N events, C at a time, to bench/server.ts's receiver (another process, answering 204), and reports
// the process's CPU per event (user + system, from process.cpuUsage) and the time its garbage collector took
// per event. The trees take turns, their order alternating from round to round; the first 2,000 events of a
// process are a warm-up and not counted. What bench/forward-drain.ts measures with the stream, the database
// and the dispatcher around it, this measures of the handler itself.
import { spawn } from 'node:child_process'
import { once, setMaxListeners } from 'node:events'
import path from 'node:path'
import { randomBytes, randomUUID } from 'node:crypto'
import { PerformanceObserver } from 'node:perf_hooks'
import { pathToFileURL } from 'node:url'
import { median } from './ab-rounds.js'
import { startBenchServer } from './service-process.js'

const root = path.resolve(import.meta.dirname, '..')
const args = process.argv.slice(2)
const valued = new Set(['--events', '--concurrency', '--rounds', '--child'])
const option = (name: string, fallback: string) => {
  const at = args.indexOf(`--${name}`)
  return at >= 0 ? args[at + 1]! : fallback
}
const dists = args.filter((arg, i) => !arg.startsWith('--') && !(i > 0 && valued.has(args[i - 1]!)))
const events = Number(option('events', '20000'))
const concurrency = Number(option('concurrency', '32'))
const rounds = Number(option('rounds', '3'))
const WARM_UP = 2_000

interface Measured {
  cpuUsPerEvent: number
  /** Of it, in the process's own code (user time): the kernel's sending and receiving is system time. */
  userUsPerEvent: number
  gcUsPerEvent: number
}

/** In the child: forwards `events` events through `dist`'s forwarder to `url`, and prints what it measured. */
async function child(dist: string, url: string): Promise<void> {
  const { createForwarder } = (await import(pathToFileURL(path.join(dist, 'src/reactions/forwarder.js')).href)) as typeof import('../src/reactions/forwarder.js')
  const { createLogger } = (await import(pathToFileURL(path.join(dist, 'src/logger.js')).href)) as typeof import('../src/logger.js')
  const logger = createLogger({ level: 'info' })
  const forward = createForwarder({ url, secret: `whsec_${randomBytes(32).toString('base64')}`, timeoutMs: 10_000, logger })
  // one signal for every attempt, as a stream batch gives its handlers
  const signal = new AbortController().signal
  setMaxListeners(0, signal)
  const context = { signal, attempt: 1, logger }
  let gcMs = 0
  const observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) gcMs += entry.duration
  })
  const send = async (count: number) => {
    let next = 0
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        for (let i = next++; i < count; i = next++) {
          const now = new Date()
          await forward(
            {
              eventId: randomUUID(),
              type: 'trade.funded',
              orderId: 100_000 + i,
              externalReference: `bench-${100_000 + i}`,
              tradeId: `trd-${100_000 + i}`,
              from: 'created',
              to: 'funded',
              source: 'webhook',
              sequence: 2,
              occurredAt: now,
            },
            context,
          )
        }
      }),
    )
  }
  await send(WARM_UP)
  observer.observe({ entryTypes: ['gc'] })
  const before = process.cpuUsage()
  await send(events)
  const cpu = process.cpuUsage(before)
  observer.disconnect()
  const measured: Measured = {
    cpuUsPerEvent: (cpu.user + cpu.system) / events,
    userUsPerEvent: cpu.user / events,
    gcUsPerEvent: (gcMs * 1000) / events,
  }
  process.stdout.write(`${JSON.stringify(measured)}\n`)
  process.exit(0)
}

async function runOnce(dist: string, url: string): Promise<Measured> {
  const flags = (process.env.BENCH_NODE_FLAGS ?? '--max-semi-space-size=8 --max-old-space-size=512').split(' ').filter(Boolean)
  // BENCH_CPU_PROF=dir: a V8 profile of each forwarding process (bench/profile-summary.ts)
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : []
  const forwarding = spawn(process.execPath, [...profile, ...flags, '--import', 'tsx', import.meta.filename, '--child', dist, url, '--events', String(events), '--concurrency', String(concurrency)], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  let output = ''
  forwarding.stdout!.on('data', (chunk) => (output += chunk))
  const [code] = await once(forwarding, 'exit')
  if (code !== 0) throw new Error(`the forwarding process exited with ${code}`)
  return JSON.parse(output.trim().split('\n').at(-1)!) as Measured
}

if (args.includes('--child')) {
  const at = args.indexOf('--child')
  await child(args[at + 1]!, args[at + 2]!)
} else {
  if (dists.length === 0) dists.push(path.join(root, 'dist'))
  const receiver = await startBenchServer('receiver', {})
  const url = `http://127.0.0.1:${receiver.port}/forward`
  const results = new Map<string, Measured[]>(dists.map((dist) => [dist, []]))
  try {
    for (let round = 0; round < rounds; round++) {
      for (const dist of round % 2 === 0 ? dists : [...dists].reverse()) {
        const measured = await runOnce(dist, url)
        results.get(dist)!.push(measured)
        console.error(JSON.stringify({ round, dist: path.relative(root, dist) || dist, ...measured }))
      }
    }
  } finally {
    receiver.child.kill('SIGINT')
    await once(receiver.child, 'exit')
  }
  console.log(`${events.toLocaleString('en')} events a run, ${concurrency} at a time, ${rounds} rounds`)
  // each tree against the first within a round, whose runs were next to each other: what the machine's drift
  // moves less than the figures themselves
  const first = results.get(dists[0]!)!
  console.log('| tree | CPU µs/event (each round) | median | of it user time (median) | GC µs/event (median) | CPU against the first tree, each round | median | user time against the first tree (median) |')
  console.log('|---|---|---|---|---|---|---|---|')
  for (const [dist, measured] of results) {
    const cpu = measured.map((m) => m.cpuUsPerEvent)
    const ratios = cpu.map((value, round) => value / first[round]!.cpuUsPerEvent)
    const userRatios = measured.map((m, round) => m.userUsPerEvent / first[round]!.userUsPerEvent)
    console.log(
      `| ${path.relative(root, dist) || dist} | ${cpu.map((v) => v.toFixed(1)).join(', ')} | ${median(cpu).toFixed(1)} | ${median(measured.map((m) => m.userUsPerEvent)).toFixed(1)} | ${median(measured.map((m) => m.gcUsPerEvent)).toFixed(1)} | ${ratios.map((r) => r.toFixed(2)).join(', ')} | ${median(ratios).toFixed(2)} | ${median(userRatios).toFixed(2)} |`,
    )
  }
}
