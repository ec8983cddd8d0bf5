// One benchmark server, in its own process so the load generator never shares its event loop:
//   bare     Express 5 answering 200 (the framework's limit)
//   minimal  raw body, HMAC check, one INSERT ... ON CONFLICT DO NOTHING (the least a durable receiver does)
//   full     the real service's app: verify, dedup, apply, history, logging on (to /dev/null)
//   receiver the far end of the forwarder: reads each request and answers 204 (a partner's fast endpoint),
//            on node:http alone
// Prints {"port":N} on stdout once listening.
import { createHmac, timingSafeEqual } from 'node:crypto'
import express from 'express'
import pino from 'pino'
import pg from 'pg'
import getRawBody from 'raw-body'
import { systemClock } from '../src/clock.js'
import { parseConfig } from '../src/config.js'
import type { Database } from '../src/db/database.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { type Kysely, sql } from 'kysely'
import { type App, createApp } from '../src/http/app.js'
import { listen } from '../src/http/server.js'
import { createLogger } from '../src/logger.js'
import { BENCH_SECRET } from './bench-secrets.js'

const kind = process.argv[2]
const databaseUrl = process.env.BENCH_DATABASE_URL || undefined
const poolSize = 10

async function main(): Promise<void> {
  let app: App
  if (kind === 'bare') {
    const bare = express()
    bare.post('/webhooks/partner', (_req, res) => {
      res.json({ received: true })
    })
    app = bare
  } else if (kind === 'receiver') {
    // node:http without Express: it stands for a system on another machine, so it takes as little as it can
    // of the two cores the service shares with it
    app = (req, res) => {
      req.resume()
      req.once('end', () => {
        res.statusCode = req.method === 'POST' && req.url === '/forward' ? 204 : 404
        res.end()
      })
    }
  } else if (kind === 'minimal') {
    const pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize })
    const minimal = express()
    app = minimal
    minimal.post('/webhooks/partner', async (req, res) => {
      const body = await getRawBody(req, { limit: 256 * 1024 })
      const header = req.get('x-partner-signature') ?? ''
      const expected = createHmac('sha256', BENCH_SECRET).update(body).digest()
      const presented = Buffer.from(header.slice(7), 'hex')
      if (presented.length !== 32 || !timingSafeEqual(expected, presented)) {
        res.status(401).end()
        return
      }
      await pool.query('insert into bench_minimal (delivery_id, body) values ($1, $2) on conflict do nothing', [
        req.get('x-partner-delivery-id'),
        body.toString('utf8'),
      ])
      res.json({ received: true })
    })
  } else if (kind === 'full') {
    const config = parseConfig({
      DATABASE_URL: databaseUrl ?? '',
      DATA_DIR: process.env.BENCH_DATA_DIR ?? 'memory://',
      PARTNER_API_BASE_URL: 'http://127.0.0.1:1',
      PARTNER_API_KEY_ID: 'pk_bench',
      PARTNER_API_SECRET: 'bench-api-secret-0123456789abcdef',
      WEBHOOK_SECRETS: BENCH_SECRET,
      DATABASE_POOL_SIZE: String(poolSize),
      METRICS_ENABLED: 'true',
    })
    const logger = createLogger({ level: 'info', secrets: [BENCH_SECRET], destination: pino.destination('/dev/null') })
    const database = openDatabase({ databaseUrl, dataDir: config.dataDir, poolSize, logger })
    await migrateToLatest(database.db)
    await seed(database.db, Number(process.env.BENCH_ORDERS ?? 0), Number(process.env.BENCH_SEEN_DELIVERIES ?? 0))
    const { createMetrics } = await import('../src/metrics/metrics.js')
    app = createApp({ config, db: database.db, logger, clock: systemClock, metrics: createMetrics({ poolStats: database.poolStats }) })
  } else {
    throw new Error(`unknown server kind ${kind}`)
  }
  const server = await listen(app, { port: 0, host: '127.0.0.1' })
  process.stdout.write(`${JSON.stringify({ port: new URL(server.url).port })}\n`)
  // exit cleanly on SIGINT so a --cpu-prof profile is written
  process.once('SIGINT', () => process.exit(0))
  process.once('SIGTERM', () => process.exit(0))
}

// orders bench-1..N to match, and deliveries seen-1..M for the duplicate path
async function seed(db: Kysely<Database>, orders: number, seen: number): Promise<void> {
  if (orders > 0) {
    await sql`insert into orders (external_reference) select 'bench-' || i from generate_series(1, ${orders}::int) i
      on conflict do nothing`.execute(db)
  }
  if (seen > 0) {
    // the exact body the bench's retries send (run.ts, seen()): a delivery is its id and its body's hash
    await sql`insert into webhook_deliveries (delivery_id, event_type, outcome, raw_body, body_sha256)
      select 'seen-' || i, 'trade.funded', 'applied', body, encode(sha256(convert_to(body, 'UTF8')), 'hex')
      from generate_series(1, ${seen}::int) i,
        lateral (select '{"trade_id":"trd-' || i || '","reference":"R-' || i || '","status":"funded","external_reference":"bench-' || i || '"}' as body) seen
      on conflict do nothing`.execute(db)
  }
}

await main()
