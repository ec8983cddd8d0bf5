// `npm run bench -- console [--quick]`: every operator console page timed over HTTP with 1,000,000 stored
// deliveries and as many reaction jobs (100,000 each with --quick) and 100,000 orders in Postgres, a month
// of traffic. Target: every page under 100 ms. Writes bench/results/latest-console(.quick).md and .json.
import { randomBytes } from 'node:crypto'
import { writeFileSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import { sql } from 'kysely'
import pg from 'pg'
import { parseConfig } from '../src/config.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { createLogger } from '../src/logger.js'

const TOKEN = randomBytes(24).toString('hex')
const TARGET_MS = 100

export async function benchConsolePages({ quick }: { quick: boolean }): Promise<void> {
  const root = path.resolve(import.meta.dirname, '..')
  const baseUrl = process.env.BENCH_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test'
  const deliveries = quick ? 100_000 : 1_000_000
  const orders = 100_000
  // two handlers per status change: as many reaction jobs as deliveries
  const events = deliveries / 2
  const reactionJobs = events * 2
  const schema = `bench_console_${randomBytes(4).toString('hex')}`
  const admin = new pg.Client({ connectionString: baseUrl })
  await admin.connect()
  await admin.query(`create schema ${schema}`)
  const url = new URL(baseUrl)
  url.searchParams.set('options', `-c search_path=${schema}`)
  const database = openDatabase({ databaseUrl: url.toString(), poolSize: 4 })
  let server: Server | undefined
  try {
    await migrateToLatest(database.db)
    const seedStarted = performance.now()
    // seeded on a connection of its own: the service's pool bounds each query's time, a million-row insert is longer
    const seeder = new pg.Client({ connectionString: url.toString() })
    await seeder.connect()
    try {
      // a month of deliveries, newest first; 1 in 100 parked, 1 in 500 a trade_mismatch, 1 in 50 a seller event
      await seeder.query(`
        insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference,
                                        observed_status, outcome, order_id, raw_body)
        select 'dlv-' || i, md5(i::text) || md5((i + 1)::text),
               now() - (i * (interval '30 days' / ${deliveries})),
               case when i % 50 = 0 then 'seller.updated' else 'trade.funded' end,
               'trd-' || (i % ${orders}), 'order-' || (i % ${orders}), 'funded',
               case when i % 100 = 0 then 'unmatched' when i % 500 = 1 then 'trade_mismatch' else 'applied' end,
               case when i % 100 = 0 then null else (i % ${orders}) + 1 end,
               '{"trade_id":"trd-' || (i % ${orders}) || '","reference":"REF","status":"funded","external_reference":"order-' || (i % ${orders}) || '"}'
        from generate_series(1, ${deliveries}) as i`)
      await seeder.query(`
        insert into orders (external_reference, trade_id, trade_status, status_source, attention, next_poll_at)
        select 'order-' || i, 'trd-' || i, case when i % 100 = 0 then 'disputed' else 'funded' end, 'webhook',
               case when i % 1000 = 0 then 'trade_not_found' end,
               case when i % 1000 = 0 then null else now() + (i * interval '1 second') end
        from generate_series(0, ${orders - 1}) as i`)
      // the status changes (events) of the month, each order's in sequence, and two handlers' jobs for each:
      // almost all done, 1 in 2,000 events' crm-sync job failed, the last 1 in 500 still pending
      await seeder.query(`
        insert into order_status_history (order_id, from_status, to_status, source, delivery_id, sequence, trade_id,
                                          external_reference, recorded_at)
        select (i % ${orders}) + 1, 'created', 'funded', 'webhook', 'dlv-' || i, 1 + i / ${orders},
               'trd-' || (i % ${orders}), 'order-' || (i % ${orders}),
               now() - ((${events} - i) * (interval '30 days' / ${events}))
        from generate_series(0, ${events - 1}) as i`)
      await seeder.query(`
        insert into reaction_jobs (event_id, order_id, sequence, handler, state, attempts, run_at, last_error,
                                   created_at, updated_at, finished_at)
        select h.event_id, h.order_id, h.sequence, handler.name,
               case when handler.name = 'crm-sync' and h.id % 2000 = 0 then 'failed'
                    when h.id > ${events} - ${events / 500} then 'pending' else 'done' end,
               case when handler.name = 'crm-sync' and h.id % 2000 = 0 then 8 else 1 end, h.recorded_at,
               case when handler.name = 'crm-sync' and h.id % 2000 = 0 then 'Error: CRM answered 503' end,
               h.recorded_at, h.recorded_at, h.recorded_at
        from order_status_history h cross join (values ('ledger'), ('crm-sync')) as handler(name)
        order by h.id, handler.name`)
      await seeder.query('analyze')
    } finally {
      await seeder.end()
    }
    const seedS = (performance.now() - seedStarted) / 1000

    const config = parseConfig({
      PARTNER_API_BASE_URL: 'http://127.0.0.1:1',
      PARTNER_API_KEY_ID: 'pk_bench',
      PARTNER_API_SECRET: randomBytes(24).toString('hex'),
      WEBHOOK_SECRETS: randomBytes(24).toString('hex'),
      DATABASE_URL: url.toString(),
      ADMIN_TOKEN: TOKEN,
      LOG_LEVEL: 'silent',
    })
    const app = createAdminApp({ config, db: database.db, logger: createLogger({ level: 'silent' }) })
    server = await new Promise<Server>((resolve) => {
      const listening = createServer(app).listen(0, '127.0.0.1', () => resolve(listening))
    })
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    const get = async (page: string) => {
      const response = await fetch(`${base}${page}`, { headers: { Authorization: `Bearer ${TOKEN}` } })
      const text = await response.text()
      if (response.status !== 200) throw new Error(`${page}: ${response.status} ${text.slice(0, 300)}`)
      return text
    }
    // a cursor 100 pages deep, as an operator paging back would hold it
    let deep = '/console/deliveries'
    for (let page = 0; page < 100; page++) {
      const next = /<a rel="next" href="([^"]+)"/.exec(await get(deep))?.[1]
      if (!next) break
      deep = next.replace(/&amp;/g, '&')
    }
    let deepReactions = '/console/reactions'
    for (let page = 0; page < 100; page++) {
      const next = /<a rel="next" href="([^"]+)"/.exec(await get(deepReactions))?.[1]
      if (!next) break
      deepReactions = next.replace(/&amp;/g, '&')
    }
    const hourAgo = new Date(Date.now() - 3_600_000).toISOString()
    const pages: [string, string][] = [
      ['overview', '/console/'],
      ['deliveries, newest', '/console/deliveries'],
      ['deliveries, 100 pages deep', deep],
      ['by external reference', '/console/deliveries?reference=order-4242'],
      ['by trade id', '/console/deliveries?trade=trd-4242'],
      ['by delivery id', '/console/deliveries?delivery=dlv-4242'],
      ['by outcome (trade_mismatch)', '/console/deliveries?outcome=trade_mismatch'],
      ['by event kind (seller.updated)', '/console/deliveries?event=seller.updated'],
      ['last hour', `/console/deliveries?from=${encodeURIComponent(hourAgo)}`],
      ['bulk dry run: parked, last hour', `/console/deliveries/reapply?outcome=unmatched&from=${encodeURIComponent(hourAgo)}`],
      ['a delivery', `/console/deliveries/dlv-4242/${(await sql<{ sha: string }>`select body_sha256 as sha from webhook_deliveries where delivery_id = 'dlv-4242'`.execute(database.db)).rows[0]!.sha}`],
      ['orders, newest', '/console/orders'],
      ['orders flagged', '/console/orders?attention=1'],
      ['orders by status (disputed)', '/console/orders?status=disputed'],
      ['an order (its timeline with reactions)', '/console/orders/4243'],
      ['reactions, newest', '/console/reactions'],
      ['reactions, 100 pages deep', deepReactions],
      ['reactions failed', '/console/reactions?state=failed'],
      ['reactions pending', '/console/reactions?state=pending'],
      ['reactions of a handler (crm-sync)', '/console/reactions?handler=crm-sync'],
      ['reactions failed of a handler', '/console/reactions?state=failed&handler=crm-sync'],
      ['a reaction job', `/console/reactions/${(await sql<{ id: string }>`select id from reaction_jobs where state = 'failed' order by id limit 1`.execute(database.db)).rows[0]!.id}`],
      ['retry every failed: confirm page', '/console/reactions/retry-failed'],
      ['reconcile', '/console/reconcile'],
    ]
    const rounds = quick ? 10 : 30
    const { loadavg } = await import('node:os')
    const loadAtStart = loadavg()[0]!
    const results: { page: string; path: string; medianMs: number; p95Ms: number }[] = []
    for (const [name, page] of pages) {
      await get(page)
      const timings: number[] = []
      for (let round = 0; round < rounds; round++) {
        const started = performance.now()
        await get(page)
        timings.push(performance.now() - started)
      }
      timings.sort((a, b) => a - b)
      results.push({
        page: name,
        path: page,
        medianMs: timings[Math.floor(timings.length / 2)]!,
        p95Ms: timings[Math.min(timings.length - 1, Math.ceil(timings.length * 0.95) - 1)]!,
      })
    }
    const loadAtEnd = loadavg()[0]!
    const slowest = Math.max(...results.map((result) => result.medianMs))
    const markdown = [
      `# Operator console pages (${new Date().toISOString()})`,
      '',
      `${deliveries.toLocaleString('en')} deliveries over 30 days, ${orders.toLocaleString('en')} orders and ${reactionJobs.toLocaleString('en')} reaction jobs (two handlers for each of ${events.toLocaleString('en')} status changes; ${(events / 2000).toLocaleString('en')} failed, ${(reactionJobs / 500).toLocaleString('en')} pending) in Postgres (seeded in ${seedS.toFixed(0)} s); each page fetched over HTTP with a bearer token, ${rounds} times after one warm-up; load average ${loadAtStart.toFixed(1)} when the timing started, ${loadAtEnd.toFixed(1)} when it ended (2 cores).`,
      '',
      '| page | median ms | p95 ms |',
      '|---|---|---|',
      ...results.map((result) => `| ${result.page} | ${result.medianMs.toFixed(1)} | ${result.p95Ms.toFixed(1)} |`),
      '',
      `Target: every page under ${TARGET_MS} ms (median): ${slowest < TARGET_MS ? 'met' : 'NOT met'} (slowest median ${slowest.toFixed(1)} ms).`,
      '',
    ].join('\n')
    process.stdout.write(markdown)
    const suffix = `latest-console${quick ? '-quick' : ''}`
    writeFileSync(path.join(root, `bench/results/${suffix}.md`), markdown)
    writeFileSync(path.join(root, `bench/results/${suffix}.json`), `${JSON.stringify({ deliveries, orders, reactionJobs, rounds, seedS, loadAverage: { atStart: loadAtStart, atEnd: loadAtEnd }, results }, null, 2)}\n`)
  } finally {
    await new Promise((resolve) => (server ? server.close(resolve) : resolve(undefined)))
    await database.close()
    await admin.query(`drop schema ${schema} cascade`)
    await admin.end()
  }
}
