// `npx tsx bench/sandbox-state.ts [changes]`: what one change costs the local sandbox's state file
// (src/sandbox/sandbox-state.ts) as the state grows. For 100, 1,000, 4,000 and 20,000 trades (SANDBOX_STATE_SIZES
// to choose others): a state file of that many trades is written as a previous run would have left it, a sandbox
// is created over it (as `npm start` does in local mode) and `changes` (200) changes are made through the signed
// API (each trade funded, then delivered, then released), one call after another. Per change: the call's time (ms: client, HTTP, the route and the save, all in this
// one process, as local mode shares its event loop with the receiver), the bytes written to files and the flushes
// (fsync/fdatasync), counted by wrapping node:fs. The first change after the start is reported on its own. Ratios
// are against the first size, measured in the same run. Webhooks are dropped (faults dropRate 1), so no retry
// adds writes of its own.
import fs, { mkdtempSync, rmSync, statSync, readdirSync, writeFileSync } from 'node:fs'
import { syncBuiltinESMExports } from 'node:module'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'
import { systemClock } from '../src/clock.js'
import { createLogger } from '../src/logger.js'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { createSandbox } from '../src/sandbox/create-sandbox.js'

const changes = Number(process.argv[2] ?? 200)
const sizes = (process.env.SANDBOX_STATE_SIZES ?? '100,1000,4000,20000').split(',').map(Number)
const keyId = 'pk_bench_state'
const apiSecret = 'bench-state-api-secret-0123456789abcdef'
const webhookSecret = 'bench-state-webhook-secret-0123456789'

// every file write and flush of this process, counted (stdout and stderr aside)
const counted = { bytes: 0, flushes: 0 }
const original = { writeSync: fs.writeSync, fsyncSync: fs.fsyncSync, fdatasyncSync: fs.fdatasyncSync }
fs.writeSync = ((fd: number, buffer: string | NodeJS.ArrayBufferView, ...rest: unknown[]) => {
  const written = (original.writeSync as (...args: unknown[]) => number)(fd, buffer, ...rest)
  if (fd > 2) counted.bytes += written
  return written
}) as typeof fs.writeSync
fs.fsyncSync = (fd) => {
  counted.flushes++
  original.fsyncSync(fd)
}
fs.fdatasyncSync = (fd) => {
  counted.flushes++
  original.fdatasyncSync(fd)
}
syncBuiltinESMExports()

function tradeRecord(index: number) {
  const at = new Date(Date.UTC(2026, 0, 1) + index * 1000).toISOString()
  return {
    trade_id: `trd_${index.toString(16).padStart(16, '0')}`,
    reference: `TRD-${String(index + 1).padStart(6, '0')}`,
    status: 'created',
    external_reference: `order-${index}-${'x'.repeat(24)}`,
    title: 'Used bicycle, 56 cm frame, with lights',
    amount: '120.00',
    currency: 'EUR',
    seller_id: `seller-${index % 97}`,
    buyer_name: 'Ada Lovelace',
    buyer_phone: '+447700900123',
    milestones: null,
    dispute: null,
    resolution: null,
    created_at: at,
    updated_at: at,
  }
}

interface Row {
  trades: number
  fileBytes: number
  first: { ms: number; bytes: number; flushes: number }
  meanMs: number
  p50Ms: number
  p95Ms: number
  maxMs: number
  bytesPerChange: number
  maxBytes: number
  flushesPerChange: number
}

const quantile = (sorted: number[], q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!

async function measure(trades: number): Promise<Row> {
  const directory = mkdtempSync(path.join(tmpdir(), 'bench-sandbox-state-'))
  const stateFile = path.join(directory, 'sandbox-state.json')
  const state = { version: 1, sequence: trades, trades: Array.from({ length: trades }, (_, i) => tradeRecord(i)), funded: [], pendingWebhooks: [] }
  writeFileSync(stateFile, `${JSON.stringify(state)}\n`, { mode: 0o600 })
  const fileBytes = statSync(stateFile).size
  const sandbox = createSandbox({
    keyId,
    apiSecret,
    webhookSecret,
    stateFile,
    faults: { dropRate: 1 },
    logger: createLogger({ level: 'error', secrets: [apiSecret, webhookSecret] }),
  })
  const client = new PartnerApiClient({
    baseUrl: await sandbox.listen(0),
    keyId,
    secret: apiSecret,
    env: 'sandbox',
    kind: 'marketplace',
    timeoutMs: 60_000,
    clock: systemClock,
    logger: createLogger({ level: 'error', secrets: [apiSecret] }),
  })
  const change = async (index: number) => {
    const before = { ...counted }
    const started = performance.now()
    // each trade funded, then delivered, then released: up to three changes a trade
    const tradeId = state.trades[index % trades]!.trade_id
    const step = Math.floor(index / trades)
    await (step === 0 ? client.fundTrade(tradeId) : step === 1 ? client.deliverTrade(tradeId) : client.releaseTrade(tradeId))
    return { ms: performance.now() - started, bytes: counted.bytes - before.bytes, flushes: counted.flushes - before.flushes }
  }
  try {
    const first = await change(0)
    const measured = []
    for (let i = 1; i <= changes; i++) measured.push(await change(i))
    const times = measured.map((m) => m.ms).toSorted((a, b) => a - b)
    const bytes = measured.map((m) => m.bytes)
    const sum = (values: number[]) => values.reduce((total, value) => total + value, 0)
    const row: Row = {
      trades,
      fileBytes,
      first,
      meanMs: sum(times) / changes,
      p50Ms: quantile(times, 0.5),
      p95Ms: quantile(times, 0.95),
      maxMs: times.at(-1)!,
      bytesPerChange: sum(bytes) / changes,
      maxBytes: Math.max(...bytes),
      flushesPerChange: sum(measured.map((m) => m.flushes)) / changes,
    }
    const files = readdirSync(directory).map((name) => `${name} ${statSync(path.join(directory, name)).size} B`)
    console.error(`${trades} trades: files after ${changes + 1} changes: ${files.join(', ')}`)
    return row
  } finally {
    await sandbox.close()
    rmSync(directory, { recursive: true, force: true })
  }
}

const rows: Row[] = []
for (const trades of sizes) rows.push(await measure(trades))
const base = rows[0]!
const fixed = (value: number, digits = 2) => value.toFixed(digits)
const kb = (value: number) => `${(value / 1024).toFixed(1)} KiB`
console.log(`sandbox state: ${changes} changes (fund, deliver, release) per size, node ${process.version}, ${new Date().toISOString()}`)
console.log('')
console.log('| trades | state file | first change | mean ms | p50 | p95 | max | written per change (mean, max) | flushes per change | mean ms vs first size | bytes vs first size |')
console.log('|---|---|---|---|---|---|---|---|---|---|---|')
for (const row of rows) {
  console.log(
    `| ${row.trades} | ${kb(row.fileBytes)} | ${fixed(row.first.ms)} ms, ${kb(row.first.bytes)} | ${fixed(row.meanMs)} | ${fixed(row.p50Ms)} | ${fixed(row.p95Ms)} | ${fixed(row.maxMs)} | ${kb(row.bytesPerChange)}, ${kb(row.maxBytes)} | ${fixed(row.flushesPerChange)} | ${fixed(row.meanMs / base.meanMs)}× | ${fixed(row.bytesPerChange / base.bytesPerChange)}× |`,
  )
}
