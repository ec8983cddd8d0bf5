// Run as `node --expose-gc --import tsx test/helpers/signal-retention.ts <calls>` (signal-retention.test.ts):
// makes `calls` partner API calls under one caller signal that outlives them all, as the poller's stop
// signal outlives its polls, and prints the heap in use after a full collection before and after them.
import { z } from 'zod'
import { systemClock } from '../../src/clock.js'
import { createLogger } from '../../src/logger.js'
import { PartnerApiTransport } from '../../src/partner-api/partner-api-transport.js'

const calls = Number(process.argv[2] ?? 20_000)
const gc = (globalThis as { gc?: () => void }).gc
if (!gc) throw new Error('run with --expose-gc')
const heapUsed = () => {
  gc()
  gc()
  return process.memoryUsage().heapUsed
}

const transport = new PartnerApiTransport({
  baseUrl: 'http://platform.test',
  keyId: 'pk_retention',
  secret: 'apisec_retention_0b7d2c',
  timeoutMs: 10_000,
  clock: systemClock,
  // the service's logger at its usual level (a test logger keeps every line it is given)
  logger: createLogger({ level: 'info' }),
  fetch: async () => new Response('{"id":"x"}', { status: 200, headers: { 'content-type': 'application/json' } }),
})
const record = z.looseObject({ id: z.string() })
const stop = new AbortController()
const call = () => transport.call('GET', '/trades/x/', undefined, record, { signal: stop.signal })

// the first calls warm up what is made once (code, caches), outside the measurement
for (let i = 0; i < 1_000; i++) await call()
const before = heapUsed()
for (let i = 0; i < calls; i++) await call()
const after = heapUsed()
process.stdout.write(`${JSON.stringify({ calls, before, after })}\n`)
