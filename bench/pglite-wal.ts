// `npx tsx bench/pglite-wal.ts [deliveries] [dist]`: the embedded database's write-ahead log under a long ingest.
// The compiled `serve` (npm run build first; or the tree `dist`) on a fresh DATA_DIR (100,000 orders seeded) takes
// `deliveries` new matched deliveries (default 200,000, 50 at a time); pg_wal's size is read every 250 ms all along.
// Reports pg_wal's peak, its size when the run ended, and its size after a restart on the same directory (stopped as
// Ctrl-C does, started again, read 2 s after it listens), and the service's CPU (user + system, whole process) per
// delivery. PGlite runs Postgres as one process, without a checkpointer: what bounds pg_wal is the service's own
// checkpoints (src/db/pglite-worker.mjs).
import { readdirSync, statSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sendDeliveries } from './send-deliveries.js'
import { cpuMs, startService, stopService } from './service-process.js'

const root = path.resolve(import.meta.dirname, '..')
const deliveries = Number(process.argv[2] ?? 200_000)
const dist = path.resolve(process.argv[3] ?? path.join(root, 'dist'))
const ORDERS = 100_000
const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'resolved']

const dataDir = mkdtempSync(path.join(tmpdir(), 'pglite-wal-'))
const wal = path.join(dataDir, 'pglite', 'pg_wal')
const walMb = () => {
  let bytes = 0
  for (const name of readdirSync(wal)) {
    try {
      bytes += statSync(path.join(wal, name)).size
    } catch {
      // removed meanwhile (a checkpoint recycling it)
    }
  }
  return bytes / 1024 / 1024
}
const matched = (index: number) => {
  const order = (index % ORDERS) + 1
  const status = STATUSES[Math.min(Math.floor(index / ORDERS), 4)]!
  return { deliveryId: `wal-m-${index}`, body: JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: `bench-${order}` }) }
}

try {
  const first = await startService({ dataDir }, { orders: ORDERS, seen: 0 }, {}, dist)
  let peakMb = walMb()
  const sampler = setInterval(() => (peakMb = Math.max(peakMb, walMb())), 250)
  const startMb = walMb()
  const cpuBefore = cpuMs(first.child.pid!)
  const started = Date.now()
  let sent = 0
  // in parts, so that the sampler's timer runs between them as well as during
  while (sent < deliveries) {
    const part = Math.min(20_000, deliveries - sent)
    const base = sent
    await sendDeliveries(first.port, (index) => matched(base + index), part)
    sent += part
  }
  const cpuUsPerDelivery = Math.round(((cpuMs(first.child.pid!) - cpuBefore) * 1000) / deliveries)
  const seconds = (Date.now() - started) / 1000
  // a second more: a check due at the end of the run
  await new Promise((resolve) => setTimeout(resolve, 2000))
  clearInterval(sampler)
  peakMb = Math.max(peakMb, walMb())
  const endMb = walMb()
  await stopService(first.child)
  const stoppedMb = walMb()
  const second = await startService({ dataDir }, { orders: 0, seen: 0 }, {}, dist)
  await new Promise((resolve) => setTimeout(resolve, 2000))
  const afterRestartMb = walMb()
  await stopService(second.child)
  const round = (mb: number) => Math.round(mb)
  console.log(
    JSON.stringify({
      deliveries,
      seconds: Math.round(seconds),
      perSecond: Math.round(deliveries / seconds),
      cpuUsPerDelivery,
      walMb: { start: round(startMb), peak: round(peakMb), end: round(endMb), stopped: round(stoppedMb), afterRestart: round(afterRestartMb) },
    }),
  )
} finally {
  rmSync(dataDir, { recursive: true, force: true })
}
