// One benchmark server, in its own process so the load generator never shares its event loop:
//   bare     Express 5 answering 200 (the framework's limit)
//   minimal  raw body, HMAC check, one INSERT ... ON CONFLICT DO NOTHING (the least a durable receiver does)
//   receiver the far end of the forwarder: reads each request and answers 204 (a partner's fast endpoint),
//            on node:http alone, and keeps when each event arrived (GET /arrivals)
// Prints {"port":N} on stdout once listening.
import { createHmac, timingSafeEqual } from 'node:crypto'
import express from 'express'
import pg from 'pg'
import getRawBody from 'raw-body'
import type { App } from '../src/http/app.js'
import { listen } from '../src/http/server.js'
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
    // when each event arrived (its webhook-id, the time in ms), taken by the bench with GET /arrivals: what
    // commit-to-handler is read from where the cluster records commit times (bench/commit-latency.ts)
    let ids: string[] = []
    let atMs: number[] = []
    app = (req, res) => {
      if (req.method === 'GET' && req.url === '/arrivals') {
        res.setHeader('content-type', 'application/json')
        res.end(JSON.stringify({ ids, atMs }))
        ids = []
        atMs = []
        return
      }
      const id = req.headers['webhook-id']
      if (typeof id === 'string') {
        ids.push(id)
        atMs.push(Date.now())
      }
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
  } else {
    throw new Error(`unknown server kind ${kind}`)
  }
  const server = await listen(app, { port: 0, host: '127.0.0.1' })
  process.stdout.write(`${JSON.stringify({ port: new URL(server.url).port })}\n`)
  // exit cleanly on SIGINT so a --cpu-prof profile is written
  process.once('SIGINT', () => process.exit(0))
  process.once('SIGTERM', () => process.exit(0))
}

await main()
