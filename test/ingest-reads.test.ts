// What the ingest statement reads for a delivery must not grow with the tables. The statement is prepared, so
// after a few runs Postgres keeps one generic plan for it, chosen on the statistics of that moment and never
// looked at again until they change. Counted here from the database's own statistics (rows read through each
// index, rows read by sequential scans): the work done, whatever the plan's shape and the machine's speed.
import { createHash } from 'node:crypto'
import { type Kysely, sql } from 'kysely'
import { describe, expect, it, vi } from 'vitest'
import type { Database } from '../src/db/database.js'
import { analyzeChangedTables, analyzeIfParkedOutgrown, STATISTICS_CHECK_INTERVAL_MS, watchStatistics } from '../src/db/statistics-watch.js'
import { recordDeliveriesAndApply } from '../src/orders/apply-observation.js'
import { observationSettings, webhookObservation } from '../src/orders/observations.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, taggedLogger, testLogger } from './helpers/log-sink.js'
import { eventually } from './helpers/reconcile-poller.js'
import { testConfig } from './helpers/test-config.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'
import { useTestDatabase } from './helpers/test-database.js'
import { startTestService } from './helpers/test-service.js'

const settings = observationSettings({ poll: { staleAfterS: 300 } })

function delivery(order: number, status: string, id: string) {
  const reference = `reads-${order}`
  const body = JSON.stringify({ trade_id: `trd-${order}`, reference: `R-${order}`, status, external_reference: reference })
  return {
    delivery: { deliveryId: id, eventType: `trade.${status}`, rawBody: body, bodySha256: createHash('sha256').update(body).digest('hex') },
    observation: webhookObservation({ externalReference: reference, tradeId: `trd-${order}`, tradeReference: `R-${order}`, status }, id, new Date()),
  }
}

interface Reads {
  /** Rows of `orders` read: through any of its indexes, and by sequential scans. */
  orders: number
  /** Rows of `webhook_deliveries` read by sequential scans. */
  deliveriesScanned: number
}

// one connection (poolSize 1 on Postgres; PGlite has one), so the statistics this session gathered are the
// ingest's, and are flushed before they are read
async function reads(db: Kysely<Database>): Promise<Reads> {
  await sql`select pg_stat_force_next_flush()`.execute(db)
  await sql`select pg_stat_clear_snapshot()`.execute(db)
  const { rows } = await sql<{ orders: string; deliveriesScanned: string }>`
    select
      (select coalesce(sum(idx_tup_read), 0) from pg_stat_user_indexes where relid = 'orders'::regclass)
        + (select coalesce(seq_tup_read, 0) from pg_stat_user_tables where relid = 'orders'::regclass) as orders,
      (select coalesce(seq_tup_read, 0) from pg_stat_user_tables where relid = 'webhook_deliveries'::regclass)
        as deliveries_scanned`.execute(db)
  return { orders: Number(rows[0]!.orders), deliveriesScanned: Number(rows[0]!.deliveriesScanned) }
}

describe('the ingest statement as the tables grow', () => {
  const database = useTestDatabase({ poolSize: 1 })

  it("reads a few rows of orders for each delivery, with 20,000 orders stored (an order's first event included)", async () => {
    const { db } = database
    const ORDERS = 20_000
    await sql`insert into orders (external_reference) select 'reads-' || i from generate_series(1, ${ORDERS}::int) i`.execute(db)
    // the statistics autovacuum would keep (PGlite has none; the service analyzes there itself)
    await sql`analyze orders`.execute(db)

    // enough statements for the generic plan (Postgres plans the first five for their values)
    const BATCHES = 40
    const BATCH = 10
    const before = await reads(db)
    for (let batch = 0; batch < BATCHES; batch++) {
      const items = Array.from({ length: BATCH }, (_, k) => delivery(batch * BATCH + k + 1, 'funded', `reads-${batch}-${k}`))
      const results = await recordDeliveriesAndApply(db, items, settings)
      expect(results.map((result) => (typeof result === 'object' ? result.outcome : result))).toEqual(items.map(() => 'applied'))
    }
    const after = await reads(db)

    const delivered = BATCHES * BATCH
    // per delivery: its order by external reference, the trade id's other owner (none), the order's update by
    // id; a statement that hashed every order's trade id read 20,000 a statement (2,000 a delivery here)
    expect((after.orders - before.orders) / delivered).toBeLessThanOrEqual(5)
  })
})

// A burst of parked deliveries on a table whose statistics counted none: autovacuum waits for a tenth of the table to
// change, and meanwhile the ingest's look for an earlier parked copy of each body read every parked row
describe('the ingest after a burst of deliveries parked for references with no order', () => {
  const database = useTestDatabase({ poolSize: 1 })

  const indexReads = async (db: Kysely<Database>) => {
    await sql`select pg_stat_force_next_flush()`.execute(db)
    await sql`select pg_stat_clear_snapshot()`.execute(db)
    const { rows } = await sql<{ read: string }>`
      select coalesce(sum(idx_tup_read), 0) as read from pg_stat_user_indexes where relid = 'webhook_deliveries'::regclass`.execute(db)
    return Number(rows[0]!.read)
  }
  const parkedBatches = async (db: Kysely<Database>, first: number, batches: number) => {
    for (let batch = 0; batch < batches; batch++) {
      const items = Array.from({ length: 10 }, (_, k) => delivery(900_000 + first + batch * 10 + k, 'funded', `parked-${first}-${batch}-${k}`))
      const results = await recordDeliveriesAndApply(db, items, settings)
      expect(results.map((result) => (typeof result === 'object' ? result.outcome : result))).toEqual(items.map(() => 'unmatched'))
    }
  }

  it('has its statistics refreshed once the parked rows outgrow them (each look of the watch), and then reads a few index entries a delivery', async () => {
    const { db } = database
    await sql`
      insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference, observed_status, outcome, raw_body)
      select 'applied-' || i, md5(i::text) || md5(i::text), now(), 'trade.funded', 'trd-' || i, 'reads-' || i, 'funded', 'applied', '{}'
      from generate_series(1, 5000) i`.execute(db)
    await sql`analyze webhook_deliveries`.execute(db)
    // nothing outgrew the statistics yet
    expect(await analyzeIfParkedOutgrown(db)).toBe(false)
    // the burst, as the ingest stores it
    await sql`
      insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference, observed_status, outcome, raw_body)
      select 'burst-' || i, md5('b' || i) || md5('b' || i), now(), 'trade.funded', 'trd-b-' || i, 'burst-' || i, 'funded', 'unmatched', '{}'
      from generate_series(1, 3000) i`.execute(db)

    expect(await analyzeIfParkedOutgrown(db)).toBe(true)
    // and once analyzed, not again until they outgrow the new figure
    expect(await analyzeIfParkedOutgrown(db)).toBe(false)
    // enough statements for the generic plan, then the ones measured
    await parkedBatches(db, 0, 8)
    const before = await indexReads(db)
    await parkedBatches(db, 1_000, 10)
    // per delivery: its key, its reference's parked rows (none), the order it has not: a few, not 3,000
    expect((await indexReads(db)) - before).toBeLessThanOrEqual(100 * 10)
  })

  it('reads no parked row at a look once the planner counts many: its figure already has them looked up by reference', async () => {
    const { db } = database
    await sql`
      insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference, observed_status, outcome, raw_body)
      select 'many-' || i, md5('m' || i) || md5('m' || i), now(), 'trade.funded', 'trd-m-' || i, 'many-' || i, 'funded', 'unmatched', '{}'
      from generate_series(1, 30000) i`.execute(db)
    await sql`analyze webhook_deliveries`.execute(db)
    const tableReads = async () => {
      await sql`select pg_stat_force_next_flush()`.execute(db)
      await sql`select pg_stat_clear_snapshot()`.execute(db)
      const { rows } = await sql<{ read: string }>`
        select coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) as read from pg_stat_user_tables where relid = 'webhook_deliveries'::regclass`.execute(db)
      return Number(rows[0]!.read) + (await indexReads(db))
    }
    const before = await tableReads()
    expect(await analyzeIfParkedOutgrown(db)).toBe(false)
    expect((await tableReads()) - before).toBe(0)
  })
})

// The watch's looks are 10 s apart; a burst parks thousands in that time. The service looks at once when it parked
// 1,000 since the last look. Its clock here never moves, so the 10-s look never comes.
describe('the service during a burst of parked deliveries', () => {
  const database = useTestDatabase()

  it('refreshes the statistics once it parked 1,000 deliveries since they last counted, without waiting for its look', async () => {
    const clock = new FakeClock()
    const config = testConfig({ PORT: '0', POLL_ENABLED: 'false', ...(database.url ? { DATABASE_URL: database.url } : {}) })
    // the service's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
    const own = taggedLogger()
    const service = await startTestService({ config, logger: own.logger, clock })
    try {
      await service.ready
      const { db } = service.database
      await sql`
        insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference, observed_status, outcome, raw_body)
        select 'applied-' || i, md5(i::text) || md5(i::text), now(), 'trade.funded', 'trd-' || i, 'reads-' || i, 'funded', 'applied', '{}'
        from generate_series(1, 5000) i`.execute(db)
      // the planner counts no parked delivery; autovacuum, which could count them first, stays out of the way
      await sql`alter table webhook_deliveries set (autovacuum_enabled = false)`.execute(db)
      await sql`analyze webhook_deliveries`.execute(db)
      const park = async (first: number, count: number) => {
        const sent = Array.from({ length: count }, (_, k) => first + k)
        // 20 at a time, as the platform's retries arrive side by side
        for (let start = 0; start < sent.length; start += 20) {
          const statuses = await Promise.all(
            sent.slice(start, start + 20).map(async (n) => {
              const body = JSON.stringify(tradePayload(`burst-${n}`, 'funded'))
              const answer = await fetch(`${service.url}/webhooks/partner`, {
                method: 'POST',
                headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `burst-${n}`, 'x-partner-signature': signBody(body) },
                body,
              })
              return answer.status
            }),
          )
          expect(statuses.filter((status) => status !== 200)).toEqual([])
        }
      }
      const before = await analyzes(db, 'webhook_deliveries')
      const linesBefore = own.entries().length
      await park(1, 990)
      // fewer than 1,000: nothing counted them yet
      expect(await analyzes(db, 'webhook_deliveries')).toBe(before)
      await park(991, 30)
      // the statistics view counts the analyze before the service hears it finished and says so: wait for the line
      const refreshed = expect.objectContaining({ msg: 'planner statistics refreshed: parked deliveries outgrew them' })
      await vi.waitFor(() => expect(own.entries().slice(linesBefore)).toContainEqual(refreshed), { timeout: 30_000, interval: 50 })
      expect(await analyzes(db, 'webhook_deliveries')).toBeGreaterThan(before)
      const written = own.entries().slice(linesBefore)
      expect(written.filter((line) => Number(line.level) >= 40)).toEqual([])
    } finally {
      await service.stop()
    }
  })
})

// A burst's count that cannot run (the database away, an analyze that cannot get its lock) said it once per 1,000
// parked deliveries: 22 lines in 32 s. It is one line until a look succeeds, as the looks' own failures are.
describe('the burst count while the database fails it', () => {
  const database = useTestDatabase({ poolSize: 1 })

  it('says so once, however many bursts fail, and again only after a look has worked', async () => {
    let away = true
    // statements refused while away
    let refused = 0
    // every statement of the watch fails while `away`, before it reaches the database
    const db = database.db.withPlugin({
      transformQuery: (args) => {
        if (away) {
          refused += 1
          throw new Error('connect ECONNREFUSED 127.0.0.1:5432')
        }
        return args.node
      },
      transformResult: async (args) => args.result,
    })
    const clock = new FakeClock()
    const watch = watchStatistics({ db, logger: testLogger(), clock })
    const lines = logEntries().length
    const failures = () => logEntries().slice(lines).filter((line) => line.msg === 'cannot count the parked deliveries; the next look tries again')
    try {
      for (let burst = 0; burst < 5; burst++) {
        watch.parkedStored(1_000)
        // each burst's count ran, and failed: one ended before the next burst came
        await eventually(() => refused === burst + 1, 'the burst is counted')
        await eventually(() => failures().length >= 1, 'the failed count is said')
        await new Promise((resolve) => setImmediate(resolve))
      }
      expect(failures()).toHaveLength(1)
      expect(failures()[0]).toEqual(expect.objectContaining({ level: 40, err: expect.objectContaining({ message: expect.stringContaining('ECONNREFUSED') }) }))

      // a look that works: said, and a later failure is said again
      away = false
      await eventually(() => clock.pendingSleepers > 0, 'the watch waits its interval')
      await clock.advance(STATISTICS_CHECK_INTERVAL_MS)
      await eventually(() => logEntries().slice(lines).some((line) => line.msg === 'the planner statistics watch works again'), 'the look works')
      away = true
      watch.parkedStored(1_000)
      await eventually(() => failures().length === 2, 'the next failed count is said')
    } finally {
      away = false
      await watch.stop()
    }
  })
})

// A look that came while a burst's count ran counted and analyzed the same table beside it: two analyzes of one
// table at once, the second waiting for the first's lock. The look now waits for the count.
describe('a look while a burst is counted', () => {
  const database = useTestDatabase({ poolSize: 2 })

  it('starts its statements only once the count has ended', async () => {
    // the count of parked rows is held after it ran, until released
    let release: () => void = () => {}
    const held = new Promise<void>((resolve) => (release = resolve))
    let counting = false
    const startedWhileCounting: string[] = []
    const isCount = (node: { kind: string; sqlFragments?: readonly string[] }) =>
      node.kind === 'RawNode' && (node.sqlFragments ?? []).join('?').includes('outcome = \'unmatched\' limit')
    const db = database.db.withPlugin({
      transformQuery: (args) => {
        const node = args.node as unknown as { kind: string; sqlFragments?: readonly string[] }
        if (isCount(node)) counting = true
        else if (counting) startedWhileCounting.push((node.sqlFragments ?? [node.kind]).join('?').trim().slice(0, 40))
        return args.node
      },
      transformResult: async (args) => {
        if (counting && 'rows' in (args.result.rows[0] ?? {})) {
          await held
          counting = false
        }
        return args.result
      },
    })
    const clock = new FakeClock()
    const watch = watchStatistics({ db, logger: testLogger(), clock })
    try {
      watch.parkedStored(1_000)
      await eventually(() => counting, 'the burst is being counted')
      // the look's time comes while the count is held
      await eventually(() => clock.pendingSleepers > 0, 'the watch waits its interval')
      await clock.advance(STATISTICS_CHECK_INTERVAL_MS)
      await new Promise((resolve) => setTimeout(resolve, 200))
      expect(startedWhileCounting).toEqual([])
      release()
      // the look runs once the count has ended, and waits for its next interval
      await eventually(() => clock.pendingSleepers > 0 && !counting, 'the look ran')
      expect(startedWhileCounting).toEqual([])
    } finally {
      release()
      await watch.stop()
    }
  })

  it('leaves a burst that comes during a look to that look\'s own count', async () => {
    // the look's read of the changed tables is held after it ran, until released
    let release: () => void = () => {}
    const held = new Promise<void>((resolve) => (release = resolve))
    let holding = false
    let counts = 0
    const text = (node: { kind: string; sqlFragments?: readonly string[] }) => (node.kind === 'RawNode' ? (node.sqlFragments ?? []).join('?') : '')
    const db = database.db.withPlugin({
      transformQuery: (args) => {
        const sqlText = text(args.node as unknown as { kind: string; sqlFragments?: readonly string[] })
        if (sqlText.includes('outcome = \'unmatched\' limit')) counts += 1
        if (sqlText.includes('from pg_stat_user_tables')) holding = true
        return args.node
      },
      transformResult: async (args) => {
        if (holding) {
          await held
          holding = false
        }
        return args.result
      },
    })
    const clock = new FakeClock()
    const watch = watchStatistics({ db, logger: testLogger(), clock })
    try {
      await eventually(() => clock.pendingSleepers > 0, 'the watch waits its interval')
      await clock.advance(STATISTICS_CHECK_INTERVAL_MS)
      await eventually(() => holding, 'the look reads the changed tables')
      watch.parkedStored(1_000)
      await new Promise((resolve) => setTimeout(resolve, 200))
      expect(counts).toBe(0)
      release()
      await eventually(() => clock.pendingSleepers > 0, 'the look ended')
      // the look's own count, and no other
      expect(counts).toBe(1)
    } finally {
      release()
      await watch.stop()
    }
  })
})

// PGlite has no autovacuum: the service keeps the statistics itself (db/statistics-watch.ts)
describe('the embedded database as its deliveries grow', () => {
  const database = useTestDatabase({ kind: 'pglite' })

  const ingest = async (db: Kysely<Database>, first: number, batches: number) => {
    for (let batch = 0; batch < batches; batch++) {
      const items = Array.from({ length: 10 }, (_, k) => delivery(first + batch * 10 + k, 'funded', `grown-${first}-${batch}-${k}`))
      await recordDeliveriesAndApply(db, items, settings)
    }
  }

  it('analyzes a table that changed past autovacuum\'s threshold, and the ingest then looks its deliveries up by index', async () => {
    const { db } = database
    await sql`insert into orders (external_reference) select 'reads-' || i from generate_series(1, 2000) i`.execute(db)
    // statistics taken while the deliveries were none, as an early analyze or VACUUM leaves them
    await sql`analyze`.execute(db)
    const start = await reads(db)
    // the generic plan is made on those statistics, and kept while the table grows under it
    await ingest(db, 1, 6)
    // 60 deliveries: past 50 + 10 % of none, but a table this small is left as it is (analyzed now, its
    // statistics would make the whole-table scan the plan again)
    expect(await analyzeChangedTables(db)).not.toContain('webhook_deliveries')
    await ingest(db, 61, 74)
    const grown = await reads(db)
    expect(grown.deliveriesScanned - start.deliveriesScanned).toBeGreaterThan(0)

    // 800 deliveries and as many orders moved: past 50 + 10 % of what each table held when last analyzed
    expect(await analyzeChangedTables(db)).toEqual(expect.arrayContaining(['orders', 'webhook_deliveries']))
    // nothing changed since: nothing to analyze
    expect(await analyzeChangedTables(db)).toEqual([])
    await ingest(db, 1001, 40)
    const after = await reads(db)
    expect(after.deliveriesScanned - grown.deliveriesScanned).toBe(0)
  })

  it('is analyzed by the service every 10 s of its clock, where a table changed enough', async () => {
    const clock = new FakeClock()
    const own = taggedLogger()
    const service = await startTestService({ config: testConfig({ PORT: '0', POLL_ENABLED: 'false' }), logger: own.logger, clock })
    try {
      await service.ready
      const { db } = service.database
      const analyzed = async () => {
        await sql`select pg_stat_clear_snapshot()`.execute(db)
        const { rows } = await sql<{ count: string }>`select analyze_count::text as count from pg_stat_user_tables
          where relid = 'webhook_deliveries'::regclass`.execute(db)
        return Number(rows[0]!.count)
      }
      await sql`insert into orders (external_reference) select 'reads-' || i from generate_series(1, 3000) i`.execute(db)
      await ingest(db, 1, 80)
      const linesBefore = own.entries().length
      const before = await analyzed()
      await eventually(() => clock.sleeps.includes(STATISTICS_CHECK_INTERVAL_MS), 'the watch waits its interval')
      await clock.advance(STATISTICS_CHECK_INTERVAL_MS)
      await vi.waitFor(async () => expect(await analyzed()).toBe(before + 1), { timeout: 30_000, interval: 50 })
      const written = own.entries().slice(linesBefore)
      expect(written).toContainEqual(
        expect.objectContaining({ msg: 'planner statistics refreshed', tables: expect.arrayContaining(['orders', 'webhook_deliveries']) }),
      )
      expect(written.filter((line) => Number(line.level) >= 40)).toEqual([])
    } finally {
      await service.stop()
    }
  })
})

// the number of analyzes run by hand (the service's), not autovacuum's (autoanalyze_count)
async function analyzes(db: Kysely<Database>, table: string): Promise<number> {
  await sql`select pg_stat_clear_snapshot()`.execute(db)
  const { rows } = await sql<{ count: string }>`select analyze_count::text as count from pg_stat_user_tables
    where relid = ${table}::regclass`.execute(db)
  return Number(rows[0]!.count)
}

// A Postgres may run with autovacuum off (or track_counts, which it works from): the service stands in for its
// analyzes there, and says so, while it is off
describe('the statistics watch on a database whose autovacuum is turned off and on', () => {
  // one connection (PGlite has one): the counts of each insert are flushed before the watch looks
  const database = useTestDatabase({ poolSize: 1 })

  it('analyzes only while autovacuum is off, with a warning when it starts and a line when it stops', async () => {
    const { db } = database
    const clock = new FakeClock()
    let autovacuumOn = false
    const watch = watchStatistics({ db, logger: testLogger(), clock, whileAutovacuumOff: true, autovacuum: async () => autovacuumOn })
    // one look: the watch sleeps again once it has looked (it is this clock's only sleeper)
    const look = async () => {
      const sleeps = clock.sleeps.length
      const lines = logEntries().length
      await clock.advance(STATISTICS_CHECK_INTERVAL_MS)
      await eventually(() => clock.sleeps.length > sleeps, 'the look ends')
      return logEntries().slice(lines)
    }
    const change = async (rows: number, from: number) => {
      await sql`insert into orders (external_reference) select 'watch-' || i from generate_series(${from}::int, ${from + rows - 1}::int) i`.execute(db)
      await sql`select pg_stat_force_next_flush()`.execute(db)
      await sql`select 1`.execute(db)
    }
    try {
      // nothing read yet: no sample of database_autovacuum_off
      expect(watch.autovacuumOff()).toBeUndefined()
      await change(2000, 1)
      const before = await analyzes(db, 'orders')
      const off = await look()
      expect(off.filter((line) => String(line.msg).startsWith('autovacuum is off'))).toHaveLength(1)
      expect(await analyzes(db, 'orders')).toBe(before + 1)
      expect(watch.autovacuumOff()).toBe(true)

      // still off: analyzed again as rows change, no second warning
      await change(2000, 2001)
      const stillOff = await look()
      expect(stillOff.filter((line) => String(line.msg).startsWith('autovacuum'))).toEqual([])
      expect(await analyzes(db, 'orders')).toBe(before + 2)

      // on: autovacuum's work again, however many rows changed
      autovacuumOn = true
      await change(2000, 4001)
      const on = await look()
      expect(on.map((line) => String(line.msg))).toContain('autovacuum is on: the service leaves the planner statistics to it again')
      expect(await analyzes(db, 'orders')).toBe(before + 2)
      expect(watch.autovacuumOff()).toBe(false)
      const stillOn = await look()
      expect(stillOn.filter((line) => String(line.msg).startsWith('autovacuum'))).toEqual([])
      expect(await analyzes(db, 'orders')).toBe(before + 2)

      // off again: warned again, and the rows changed meanwhile analyzed
      autovacuumOn = false
      const offAgain = await look()
      expect(offAgain.filter((line) => String(line.msg).startsWith('autovacuum is off'))).toHaveLength(1)
      expect(await analyzes(db, 'orders')).toBe(before + 3)
    } finally {
      await watch.stop()
    }
  })
})

// The service on Postgres: whether it analyzes follows the cluster's own settings (this machine's shared
// cluster runs with autovacuum off; a cluster with it on takes the other branch)
describe.skipIf(!process.env.TEST_DATABASE_URL)('the service on Postgres, and autovacuum', () => {
  // one connection: the counts of its insert are flushed to the statistics before the watch looks
  const database = useTestDatabase({ kind: 'postgres', poolSize: 1 })

  it('analyzes its changed tables itself, with one warning, exactly when the cluster runs without autovacuum', async () => {
    const { db } = database
    const { rows } = await sql<{ autovacuum: string; trackCounts: string }>`
      select current_setting('autovacuum') as autovacuum, current_setting('track_counts') as track_counts`.execute(db)
    const off = rows[0]!.autovacuum === 'off' || rows[0]!.trackCounts === 'off'
    const clock = new FakeClock()
    const own = taggedLogger()
    const service = await startTestService({
      config: testConfig({ PORT: '0', POLL_ENABLED: 'false', DATABASE_URL: database.url! }),
      logger: own.logger,
      clock,
    })
    try {
      await service.ready
      await sql`insert into orders (external_reference) select 'service-watch-' || i from generate_series(1, 3000) i`.execute(db)
      await sql`select pg_stat_force_next_flush()`.execute(db)
      await sql`select 1`.execute(db)
      const before = await analyzes(db, 'orders')
      const lines = own.entries().length
      const intervals = () => clock.sleeps.filter((ms) => ms === STATISTICS_CHECK_INTERVAL_MS).length
      await eventually(() => intervals() > 0, 'the watch waits its interval')
      const intervalsBefore = intervals()
      // the operator's gauge (and PartnerEscrowAutovacuumOff, deploy/prometheus/alerts.yml) reads the same look:
      // no sample before it
      const gauge = async () => /^database_autovacuum_off (\d)$/m.exec(await (await fetch(`${service.adminUrl}/metrics`)).text())?.[1]
      expect(await gauge()).toBeUndefined()
      await clock.advance(STATISTICS_CHECK_INTERVAL_MS)
      await vi.waitFor(async () => expect(await gauge()).toBe(off ? '1' : '0'), { timeout: 30_000, interval: 50 })
      if (off) {
        await vi.waitFor(async () => expect(await analyzes(db, 'orders')).toBe(before + 1), { timeout: 30_000, interval: 50 })
        const warnings = own.entries().slice(lines).filter((line) => Number(line.level) >= 40)
        expect(warnings.map((line) => line.msg)).toEqual([expect.stringMatching(/^autovacuum is off on the database/)])
      } else {
        // one look's time: the watch sleeps its interval again once it has looked
        await eventually(() => intervals() > intervalsBefore, 'the watch looks and waits again')
        expect(await analyzes(db, 'orders')).toBe(before)
        expect(own.entries().slice(lines).filter((line) => Number(line.level) >= 40)).toEqual([])
      }
    } finally {
      await service.stop()
    }
  })
})
