// What the indexes of webhook_deliveries cost the ingest (`npx tsx bench/index-cost.ts`): one table of
// stored deliveries (1,000,000 by default, the growth bench's rows) is copied once per index set, and new
// deliveries are written into each copy in alternating rounds, two ways:
// - insert: the ingest's delivery insert alone (json_to_recordset, ON CONFLICT DO NOTHING, RETURNING),
//   run under EXPLAIN (ANALYZE, WAL): the WAL it writes is counted per statement, so other sessions'
//   writes on the same server do not enter the figure;
// - ingest: the real statement (recordDeliveriesAndApply: lock the order, insert the delivery, move the
//   order, write its history), with the copy renamed to webhook_deliveries for its round.
// Postgres CPU per row is the backend's own (/proc/<pid>/stat, so the database must run on this machine).
// Read WAL and CPU as ratios within one run; the commit rate is set by the shared disk and cores. The WAL
// bytes are mostly full-page images, whose number depends on when the server's checkpoints fall (every
// index page's first change after one is logged whole): compare the records per row for the rest.
// Options: --deliveries N --orders N --rounds N --rows N (per variant, way and round) --batch N (rows per
// statement) --only 1,2 (variants by number; the first is always in). BENCH_DATABASE_URL names the
// database; the bench works in a schema of its own, dropped at the end unless --keep.
import { randomBytes, randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import os from 'node:os'
import { parseArgs } from 'node:util'
import { sql } from 'kysely'
import pg from 'pg'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { NO_REACTION_HANDLERS, recordDeliveriesAndApply, type DeliveryObservation } from '../src/orders/apply-observation.js'
import { seedGrowth } from './growth-bench.js'

const { values: options } = parseArgs({
  options: {
    deliveries: { type: 'string', default: '1000000' },
    orders: { type: 'string', default: '100000' },
    rounds: { type: 'string', default: '5' },
    rows: { type: 'string', default: '3000' },
    batch: { type: 'string', default: '10' },
    keep: { type: 'boolean', default: false },
    // a comma-separated list of variant numbers (0 = all), for a longer run of a few
    only: { type: 'string' },
  },
})
const DELIVERIES = Number(options.deliveries)
const ORDERS = Number(options.orders)
const ROUNDS = Number(options.rounds)
const ROWS = Number(options.rows)
const BATCH = Number(options.batch)

// Each variant: the migrated schema's indexes minus some, plus others (named with the table's name as
// it is after the copy; every index is on webhook_deliveries).
interface Variant {
  name: string
  drop: string[]
  add: string[]
  /** A setting for the writing sessions (SET), when the variant is one. */
  setting?: string
}
const CONSOLE_INDEXES = ['outcome_idx', 'event_type_idx', 'unapplied_trade_idx', 'unapplied_reference_idx']
const PARTIAL_OUTCOME = `(outcome, received_at) where outcome <> 'applied'`
const VARIANTS: Variant[] = [
  { name: 'as migrated', drop: [], add: [] },
  // an identical copy: how far two measurements of the same index set differ
  { name: 'as migrated, a second copy', drop: [], add: [] },
  {
    name: "outcome_idx without applied rows (where outcome <> 'applied')",
    drop: ['outcome_idx'],
    add: [`outcome_idx on %t ${PARTIAL_OUTCOME}`],
  },
  { name: 'without event_type_idx', drop: ['event_type_idx'], add: [] },
  // the trade and reference indexes as migrations 0003 to 0013 had them: an entry for every delivery
  {
    name: 'trade_idx and reference_idx of every delivery (before 0014)',
    drop: ['unapplied_trade_idx', 'unapplied_reference_idx'],
    add: ['trade_idx on %t (trade_id, received_at)', 'reference_idx on %t (external_reference, received_at)'],
  },
  { name: 'without the 4 console indexes', drop: CONSOLE_INDEXES, add: [] },
  // not an index set: the server setting that compresses the full-page images, set for the session only
  { name: 'as migrated, wal_compression = lz4', drop: [], add: [], setting: 'wal_compression = lz4' },
].filter((_, n) => n === 0 || options.only === undefined || options.only.split(',').map(Number).includes(n))

const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'cancelled', 'released']

interface Row {
  deliveryId: string
  bodySha256: string
  eventType: string
  tradeId: string
  tradeReference: string
  externalReference: string
  status: string
  rawBody: string
}

// new deliveries as the seed's rows are (growth-bench.ts), on random orders, 1 in 20 for a reference with
// no order yet (parked as unmatched); delivery ids are UUIDs, as the platform's are
function newRows(count: number): Row[] {
  return Array.from({ length: count }, () => {
    const order = 1 + Math.floor(Math.random() * ORDERS)
    const reference = Math.random() < 0.05 ? `missing-${randomUUID()}` : `bench-${order}`
    const status = STATUSES[Math.floor(Math.random() * STATUSES.length)]!
    const tradeId = `trd-g-${order}`
    return {
      deliveryId: randomUUID(),
      bodySha256: randomBytes(32).toString('hex'),
      eventType: `trade.${status}`,
      tradeId,
      tradeReference: `R-${order}`,
      externalReference: reference,
      status,
      rawBody: JSON.stringify({ trade_id: tradeId, reference: `R-${order}`, status, external_reference: reference }),
    }
  })
}

/** The delivery insert of the ingest statement (apply-observation.ts), with its outcome given. */
function insertStatement(table: string): string {
  return `explain (analyze, wal, timing off, summary off, format json)
    insert into ${table}
      (delivery_id, body_sha256, received_at, event_type, trade_id, trade_reference, external_reference,
       observed_status, outcome, order_id, raw_body, applied_at)
    select i.delivery_id, i.body_sha256, now(), i.event_type, i.trade_id, i.trade_reference, i.external_reference,
      i.status, i.outcome, i.order_id, i.raw_body, case when i.outcome = 'applied' then now() end
    from json_to_recordset($1::json) as i(delivery_id text, body_sha256 text, event_type text, trade_id text,
      trade_reference text, external_reference text, status text, outcome text, order_id int, raw_body text)
    on conflict (delivery_id, body_sha256) do nothing
    returning delivery_id, body_sha256`
}

/** utime + stime of a process, in seconds (Linux; the database must run on this machine). */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
  // fields 14 and 15 of stat, in clock ticks of 1/100 s
  return (Number(fields[11]) + Number(fields[12])) / 100
}

interface Totals {
  rows: number
  cpuS: number
  wallS: number
  walBytes: number
  walRecords: number
  walFpi: number
}
const emptyTotals = (): Totals => ({ rows: 0, cpuS: 0, wallS: 0, walBytes: 0, walRecords: 0, walFpi: 0 })

interface PlanNode {
  'WAL Records'?: number
  'WAL FPI'?: number
  'WAL Bytes'?: number
}

async function main(): Promise<void> {
  const baseUrl = process.env.BENCH_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test'
  const schema = `index_cost_${randomBytes(4).toString('hex')}`
  const url = new URL(baseUrl)
  url.searchParams.set('options', `-c search_path=${schema}`)
  const admin = new pg.Client({ connectionString: url.toString() })
  await admin.connect()
  const loadAtStart = os.loadavg().map((value) => value.toFixed(2))
  process.stderr.write(`index-cost: schema ${schema}, load average ${loadAtStart.join(' ')}\n`)
  try {
    await admin.query(`create schema ${schema}`)
    const setup = openDatabase({ databaseUrl: url.toString(), poolSize: 1 })
    await migrateToLatest(setup.db)
    await setup.close()
    const seed = await seedGrowth(url.toString(), { deliveries: DELIVERIES, orders: ORDERS })
    process.stderr.write(`index-cost: seeded ${DELIVERIES.toLocaleString('en')} deliveries in ${seed.seconds} s\n`)

    // the migrated indexes, as Postgres itself states them
    const { rows: indexes } = await admin.query<{ indexname: string; indexdef: string }>(
      `select indexname, indexdef from pg_indexes where schemaname = $1 and tablename = 'webhook_deliveries' order by indexname`,
      [schema],
    )
    process.stderr.write(`index-cost: ${indexes.map((index) => index.indexname).join(', ')}\n`)
    const tables: string[] = []
    for (const [n, variant] of VARIANTS.entries()) {
      const table = `wd_${n}`
      tables.push(table)
      await admin.query(`create table ${table} (like webhook_deliveries including defaults including constraints)`)
      await admin.query(`insert into ${table} select * from webhook_deliveries order by received_at`)
      for (const { indexname, indexdef } of indexes) {
        const suffix = indexname.replace('webhook_deliveries_', '')
        if (variant.drop.includes(suffix)) continue
        if (suffix === 'pkey') await admin.query(`alter table ${table} add constraint ${table}_pkey primary key (delivery_id, body_sha256)`)
        else await admin.query(indexdef.replace(indexname, `${table}_${suffix}`).replace(/ ON \S+ /, ` ON ${table} `))
      }
      for (const definition of variant.add) await admin.query(`create index ${table}_${definition.replace('%t', table)}`)
      await admin.query(`vacuum analyze ${table}`)
      process.stderr.write(`index-cost: ${table} = ${variant.name} built\n`)
    }
    await admin.query(`drop table webhook_deliveries`)

    const { rows: sizes } = await admin.query<{ table: string; indexes: string; count: string }>(
      `select c.relname as table, pg_size_pretty(pg_indexes_size(c.oid)) as indexes,
         (select count(*) from pg_index i where i.indrelid = c.oid) as count
       from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = $1 and c.relname like 'wd\\_%'`,
      [schema],
    )

    const insert = new Map(tables.map((table) => [table, emptyTotals()]))
    const ingest = new Map(tables.map((table) => [table, emptyTotals()]))
    const insertRate = new Map(tables.map((table) => [table, [] as number[]]))
    const ingestRate = new Map(tables.map((table) => [table, [] as number[]]))
    const client = new pg.Client({ connectionString: url.toString() })
    await client.connect()
    const pid = (await client.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid
    try {
      for (let round = 0; round < ROUNDS; round++) {
        // a different variant first each round
        const order = tables.map((_, n) => tables[(n + round) % tables.length]!)
        for (const table of order) {
          const { setting } = VARIANTS[tables.indexOf(table)]!
          // the delivery insert alone
          await client.query(setting ? `set ${setting}` : 'reset all')
          const totals = insert.get(table)!
          const rows = newRows(ROWS)
          let cpu = cpuSeconds(pid)
          let started = performance.now()
          for (let from = 0; from < rows.length; from += BATCH) {
            const batch = rows.slice(from, from + BATCH).map((row) => ({
              delivery_id: row.deliveryId,
              body_sha256: row.bodySha256,
              event_type: row.eventType,
              trade_id: row.tradeId,
              trade_reference: row.tradeReference,
              external_reference: row.externalReference,
              status: row.status,
              outcome: row.externalReference.startsWith('missing-') ? 'unmatched' : 'applied',
              order_id: row.externalReference.startsWith('missing-') ? null : Number(row.externalReference.slice(6)),
              raw_body: row.rawBody,
            }))
            const result = await client.query<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(insertStatement(table), [JSON.stringify(batch)])
            const plan = result.rows[0]!['QUERY PLAN'][0].Plan
            totals.walBytes += plan['WAL Bytes'] ?? 0
            totals.walRecords += plan['WAL Records'] ?? 0
            totals.walFpi += plan['WAL FPI'] ?? 0
          }
          let wall = (performance.now() - started) / 1000
          totals.rows += rows.length
          totals.cpuS += cpuSeconds(pid) - cpu
          totals.wallS += wall
          insertRate.get(table)!.push(rows.length / BATCH / wall)

          // the real ingest statement, on this copy renamed to webhook_deliveries
          await admin.query(`alter table ${table} rename to webhook_deliveries`)
          const database = openDatabase({ databaseUrl: url.toString(), poolSize: 1 })
          try {
            // one connection in the pool: the setting and the pid are the statements' own
            if (setting) await sql.raw(`set ${setting}`).execute(database.db)
            const ingestPid = (await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(database.db)).rows[0]!.pid
            const ingestTotals = ingest.get(table)!
            const items: DeliveryObservation[][] = []
            const fresh = newRows(ROWS)
            for (let from = 0; from < fresh.length; from += BATCH) {
              // one statement names an order at most once
              const seen = new Set<string>()
              items.push(
                fresh
                  .slice(from, from + BATCH)
                  .filter((row) => !seen.has(row.externalReference) && seen.add(row.externalReference))
                  .map((row) => ({
                    delivery: { deliveryId: row.deliveryId, eventType: row.eventType, rawBody: row.rawBody, bodySha256: row.bodySha256 },
                    observation: {
                      target: { externalReference: row.externalReference },
                      tradeId: row.tradeId,
                      tradeReference: row.tradeReference,
                      externalReference: row.externalReference,
                      status: row.status,
                      source: 'webhook' as const,
                      deliveryId: row.deliveryId,
                      observedAt: new Date(),
                    },
                  })),
              )
            }
            const settings = { staleAfterS: 3600, handlersFor: NO_REACTION_HANDLERS }
            await recordDeliveriesAndApply(database.db, items[0]!, settings)
            cpu = cpuSeconds(ingestPid)
            started = performance.now()
            let written = 0
            for (const batch of items.slice(1)) {
              await recordDeliveriesAndApply(database.db, batch, settings)
              written += batch.length
            }
            wall = (performance.now() - started) / 1000
            ingestTotals.rows += written
            ingestTotals.cpuS += cpuSeconds(ingestPid) - cpu
            ingestTotals.wallS += wall
            ingestRate.get(table)!.push((items.length - 1) / wall)
          } finally {
            await database.close()
            await admin.query(`alter table webhook_deliveries rename to ${table}`)
          }
        }
        process.stderr.write(`index-cost: round ${round + 1} of ${ROUNDS} done, load average ${os.loadavg()[0]!.toFixed(2)}\n`)
      }
    } finally {
      await client.end()
    }

    const loadAtEnd = os.loadavg().map((value) => value.toFixed(2))
    const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
    const perRow = (totals: Totals, key: keyof Totals) => totals[key] / totals.rows
    const first = tables[0]!
    const cells = (n: number, value: number, reference: number, digits = 0) =>
      `${value.toFixed(digits)}${n === 0 ? '' : ` (${(value / reference).toFixed(2)}×)`}`
    const lines = [
      `${DELIVERIES.toLocaleString('en')} deliveries stored, ${ORDERS.toLocaleString('en')} orders; ${ROUNDS} rounds of ` +
        `${ROWS.toLocaleString('en')} rows per variant and way, ${BATCH} rows per statement (one commit each); ` +
        `load average ${loadAtStart.join(' ')} at the start, ${loadAtEnd.join(' ')} at the end.`,
      '',
      '| variant | indexes (size) | insert: WAL bytes/row | WAL records/row | FPI/row | insert: CPU µs/row | ' +
        'insert: commits/s (median) | ingest: CPU µs/row | ingest: commits/s (median) |',
      '|---|---|---|---|---|---|---|---|---|',
      ...VARIANTS.map((variant, n) => {
        const table = tables[n]!
        const size = sizes.find((row) => row.table === table)!
        const [i, g] = [insert.get(table)!, ingest.get(table)!]
        const [i0, g0] = [insert.get(first)!, ingest.get(first)!]
        return [
          variant.name,
          `${size.count} (${size.indexes})`,
          cells(n, perRow(i, 'walBytes'), perRow(i0, 'walBytes')),
          cells(n, perRow(i, 'walRecords'), perRow(i0, 'walRecords'), 2),
          perRow(i, 'walFpi').toFixed(3),
          cells(n, perRow(i, 'cpuS') * 1e6, perRow(i0, 'cpuS') * 1e6),
          median(insertRate.get(table)!).toFixed(0),
          cells(n, perRow(g, 'cpuS') * 1e6, perRow(g0, 'cpuS') * 1e6),
          median(ingestRate.get(table)!).toFixed(0),
        ].join(' | ').replace(/^/, '| ').concat(' |')
      }),
    ]
    process.stdout.write(`${lines.join('\n')}\n`)
  } finally {
    if (!options.keep) await admin.query(`drop schema ${schema} cascade`)
    await admin.end()
  }
}

await main()
