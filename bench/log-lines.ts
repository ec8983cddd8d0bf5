// The CPU a log line costs the process that logs it, through the service's own logger to stdout (`npx tsx
// bench/log-lines.ts distA distB [rounds] [lines]`, compiled trees): each round runs one child per tree in turn,
// logging the per-delivery line `lines` times, yielding every 50 as a server under load does, once to a reader that
// reads and once to one that reads nothing for 2 s (a slow log shipper: the lines wait in the writer). Each child
// reports its own user + system CPU over the loop, per line.
import { spawn } from 'node:child_process'
import path from 'node:path'
import { median } from './ab-rounds.js'

const [distA, distB, roundsArg, linesArg] = process.argv.slice(2)
if (!distA || !distB) throw new Error('usage: log-lines.ts distA distB [rounds] [lines]')
const rounds = Number(roundsArg ?? 3)
const lines = Number(linesArg ?? 20_000)

const child = `
const { createLogger } = await import(process.argv[1] + '/src/logger.js')
const logger = createLogger({ level: 'info', secrets: ['never-shown-0123456789'] })
const lines = Number(process.argv[2])
const before = process.cpuUsage()
for (let i = 0; i < lines; i++) {
  logger.info({ deliveryId: 'd-' + i, outcome: 'applied', eventType: 'trade.funded' }, 'webhook received')
  if (i % 50 === 0) await new Promise((resolve) => setImmediate(resolve))
}
const cpu = process.cpuUsage(before)
process.stderr.write(String((cpu.user + cpu.system) / lines))
setTimeout(() => process.exit(0), 100)
`

async function cpuPerLine(dist: string, readAfterMs: number): Promise<number> {
  const proc = spawn(process.execPath, ['--input-type=module', '-e', child, path.resolve(dist), String(lines)], { stdio: ['ignore', 'pipe', 'pipe'] })
  proc.stdout.pause()
  setTimeout(() => proc.stdout.resume().on('data', () => {}), readAfterMs)
  let report = ''
  proc.stderr.on('data', (chunk) => (report += chunk))
  await new Promise((resolve) => proc.on('close', resolve))
  return Number(Number(report).toFixed(2))
}

for (const [name, readAfterMs] of [['a reader that reads', 0], ['a reader that reads nothing for 2 s', 2000]] as const) {
  const results: Record<string, number[]> = { A: [], B: [] }
  for (let round = 0; round < rounds; round++) {
    results.A!.push(await cpuPerLine(distA, readAfterMs))
    results.B!.push(await cpuPerLine(distB, readAfterMs))
  }
  console.log(`${name}: µs of CPU a line, A ${results.A!.join(' ')} (median ${median(results.A!)}), B ${results.B!.join(' ')} (median ${median(results.B!)})`)
}
