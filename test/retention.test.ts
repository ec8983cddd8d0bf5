// Retention: what a pruning pass removes, what it never touches, and how it shares the work between
// replicas. Rows are written with their ages relative to a fake clock's "now".
import { CompiledQuery, type Kysely, sql } from 'kysely'
import pg from 'pg'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { createPruner, PRUNE_LOCK_KEY, type PruneDeps, type RetentionSettings, runPrunePass } from '../src/retention/prune.js'
import { finishRun, listRuns, startRun } from '../src/reconcile/reconcile-run.repository.js'
import type { RunningService } from '../src/service.js'
import {
  findDelivery,
  prunableDeliveriesQuery,
  recordDelivery,
} from '../src/webhooks/delivery.repository.js'
import request from 'supertest'
import { createAdminApp } from '../src/http/admin-app.js'
import { createApp } from '../src/http/app.js'
import { systemClock } from '../src/clock.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { startTestService } from './helpers/test-service.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'
import { runCommand, runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { taggedLogger, testLogger } from './helpers/log-sink.js'
import { eventually } from './helpers/reconcile-poller.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase, useTestDatabase } from './helpers/test-database.js'

const DAY = 86_400_000
const SETTINGS: RetentionSettings = { bodyDays: 30, deliveryDays: 90, batchSize: 2, pauseMs: 0 }

interface Seeded {
  id: string
  ageDays: number
  outcome?: string
}

async function seedDeliveries(db: Kysely<Database>, now: number, deliveries: Seeded[]): Promise<void> {
  await db
    .insertInto('webhookDeliveries')
    .values(
      deliveries.map(({ id, ageDays, outcome = 'applied' }) => ({
        deliveryId: id,
        bodySha256: `sha-${id}`,
        receivedAt: new Date(now - ageDays * DAY),
        eventType: 'trade.funded',
        externalReference: `ref-${id}`,
        outcome,
        rawBody: `{"id":"${id}"}`,
      })),
    )
    .execute()
}

/** Moves the fake clock on a second at a time, letting the pass's waits end, until `pass` has settled. */
async function runOut(pass: Promise<unknown>, clock: FakeClock): Promise<void> {
  let settled = false
  void pass.then(
    () => (settled = true),
    () => (settled = true),
  )
  while (!settled) {
    await clock.advance(1_000)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}

async function deliveryRows(db: Kysely<Database>) {
  const rows = await db.selectFrom('webhookDeliveries').select(['deliveryId', 'rawBody']).orderBy('deliveryId').execute()
  return Object.fromEntries(rows.map((row) => [row.deliveryId, row.rawBody === null ? 'pruned' : 'body']))
}

async function seedJobs(db: Kysely<Database>, now: number, jobs: { state: string; ageDays: number }[]) {
  await db
    .insertInto('reactionJobs')
    .values(
      jobs.map(({ state, ageDays }, index) => ({
        eventId: `00000000-0000-4000-8000-${String(index).padStart(12, '0')}`,
        orderId: 1,
        sequence: index + 1,
        handler: 'forward',
        state,
        runAt: new Date(now - ageDays * DAY),
        createdAt: new Date(now - ageDays * DAY),
        finishedAt: state === 'done' || state === 'skipped' ? new Date(now - ageDays * DAY) : null,
      })),
    )
    .execute()
}

async function jobStates(db: Kysely<Database>) {
  const rows = await db.selectFrom('reactionJobs').select(['state', 'createdAt']).orderBy('id').execute()
  return rows.map((row) => row.state)
}

describe('retention pass', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  let deps: PruneDeps
  beforeEach(async () => {
    clock = new FakeClock(Date.parse('2026-06-01T00:00:00Z'))
    deps = { db: database.db, holdLock: database.holdLock, clock }
    await sql`truncate webhook_deliveries, reaction_jobs, order_status_history, retention_progress, reconcile_runs, reaction_stream_batches`.execute(database.db)
  })

  it('empties old bodies, parked ones too, deletes old rows and done jobs, and keeps history, parked rows and unfinished jobs', async () => {
    const now = clock.now()
    await seedDeliveries(database.db, now, [
      { id: 'd-001', ageDays: 1 },
      { id: 'd-029', ageDays: 29.9 },
      { id: 'd-031a', ageDays: 31 },
      { id: 'd-031b', ageDays: 31 },
      { id: 'd-031c', ageDays: 31 },
      { id: 'd-089', ageDays: 89.9 },
      { id: 'd-091a', ageDays: 91 },
      { id: 'd-091b', ageDays: 91 },
      { id: 'd-091c', ageDays: 91 },
      { id: 'd-400', ageDays: 400 },
      { id: 'parked-040', ageDays: 40, outcome: 'unmatched' },
      { id: 'parked-400', ageDays: 400, outcome: 'unmatched' },
    ])
    await database.db
      .insertInto('orderStatusHistory')
      .values({ orderId: 1, toStatus: 'funded', source: 'webhook', recordedAt: new Date(now - 400 * DAY) })
      .execute()
    await seedJobs(database.db, now, [
      { state: 'done', ageDays: 400 },
      { state: 'pending', ageDays: 300 },
      { state: 'failed', ageDays: 300 },
      { state: 'skipped', ageDays: 300 },
      { state: 'done', ageDays: 91 },
      { state: 'done', ageDays: 89 },
      { state: 'done', ageDays: 1 },
    ])

    const result = await runPrunePass(deps, SETTINGS)

    // batches of 2: several batches per task, ties in received_at included
    expect(result).toMatchObject({ ran: true, interrupted: false, counts: { body: 5, delivery: 4, reaction_job: 2 } })
    expect(await deliveryRows(database.db)).toEqual({
      'd-001': 'body',
      'd-029': 'body',
      'd-031a': 'pruned',
      'd-031b': 'pruned',
      'd-031c': 'pruned',
      'd-089': 'pruned',
      // a parked delivery keeps its row (its order may still come) but not its body, which applying it never reads;
      // the body walk starts at DELIVERY_RETENTION_DAYS, so one parked that long before a first pass keeps it
      'parked-040': 'pruned',
      'parked-400': 'body',
    })
    expect(await jobStates(database.db)).toEqual(['pending', 'failed', 'skipped', 'done', 'done'])
    const history = await database.db.selectFrom('orderStatusHistory').select('toStatus').execute()
    expect(history).toEqual([{ toStatus: 'funded' }])

    // a second pass finds nothing more
    expect((await runPrunePass(deps, SETTINGS)).counts).toEqual({ body: 0, delivery: 0, reaction_job: 0, reconcile_run: 0 })
  })

  it("counts ages by the database's clock when this machine's runs ahead of it, and says so", async () => {
    // rows received by the database's reckoning 1, 31 and 91 days ago; this machine's clock 400 days ahead
    const now = Date.now()
    await seedDeliveries(database.db, now, [
      { id: 'd-001', ageDays: 1 },
      { id: 'd-031', ageDays: 31 },
      { id: 'd-091', ageDays: 91 },
    ])
    // the passes' own lines: another file's in the same worker are not theirs (log-sink.ts, taggedLogger)
    const { logger, entries } = taggedLogger()
    const ahead = { ...deps, clock: new FakeClock(now + 400 * DAY), logger }
    const logged = entries().length

    const dryRun = await runPrunePass(ahead, SETTINGS, { dryRun: true })
    expect(dryRun.counts).toMatchObject({ body: 1, delivery: 1 })
    expect(Math.abs(dryRun.clockAheadS! - 400 * 86_400)).toBeLessThan(60)
    const result = await runPrunePass(ahead, SETTINGS)
    expect(result.counts).toMatchObject({ body: 1, delivery: 1 })
    expect(await deliveryRows(database.db)).toEqual({ 'd-001': 'body', 'd-031': 'pruned' })
    // the cutoffs are the database's: 90 days before its now, not before this machine's
    expect(Math.abs(result.deliveriesBefore.getTime() - (now - 90 * DAY))).toBeLessThan(60_000)
    const warnings = entries()
      .slice(logged)
      .filter((entry) => String(entry.msg).startsWith("retention: this machine's clock is ahead of the database's"))
    expect(warnings).toHaveLength(2)
    expect(warnings[0]!.aheadS).toBeGreaterThan(400 * 86_400 - 60)
    expect(warnings[0]!.aheadS).toBeLessThan(400 * 86_400 + 60)

    // a clock behind the database's is this machine's own: it prunes later, and says nothing
    const behind = { ...deps, clock: new FakeClock(now - 2 * DAY), logger }
    await seedDeliveries(database.db, now, [{ id: 'd-091-again', ageDays: 91 }])
    const late = await runPrunePass(behind, SETTINGS)
    expect(late.counts.delivery).toBe(0)
    expect(late.deliveriesBefore.getTime()).toBe(now - 92 * DAY)
    expect(late.clockAheadS).toBeUndefined()
    expect(entries().slice(logged).filter((entry) => entry.level === 40)).toHaveLength(2)
  })

  // the poller writes a run per cycle that claimed an order: about one per replica every POLL_INTERVAL_S on a
  // partner with open orders, which no pass deleted before
  it('deletes the poller\'s reconcile runs older than the delivery retention and keeps the young ones', async () => {
    const now = clock.now()
    const ages = [400, 120, 91, 91, 91, 89, 1]
    for (const [index, ageDays] of ages.entries()) {
      const runId = await startRun(database.db, { replica: 'host:1', startedAt: new Date(now - ageDays * DAY) })
      // the newest one never finished: its replica died; the oldest such one goes all the same
      if (index !== 0 && index !== ages.length - 1) {
        await finishRun(database.db, runId, { finishedAt: new Date(now - ageDays * DAY + 1_000), polled: 1, changed: 0, errors: 0, stoppedReason: null, clockOffsetS: null })
      }
    }
    expect((await runPrunePass(deps, SETTINGS, { dryRun: true })).counts.reconcile_run).toBe(5)
    expect(await listRuns(database.db, 100)).toHaveLength(7)

    // batches of 2: the walk goes on past full batches and stops at the first young run
    expect((await runPrunePass(deps, SETTINGS)).counts.reconcile_run).toBe(5)
    const kept = await listRuns(database.db, 100)
    expect(kept.map((run) => (now - run.startedAt.getTime()) / DAY)).toEqual([1, 89])
    expect((await runPrunePass(deps, SETTINGS)).counts.reconcile_run).toBe(0)
  })

  // found from outside: a replica whose clock ran a year ahead for a while wrote rows stamped a year ahead at the
  // head of each walk; the walk ended at the first young-looking row, so every pass stopped there and the rows
  // behind them were never deleted (the dry run counted them all)
  it('walks past rows stamped after now at the head of each table and deletes the old ones behind them', async () => {
    const now = clock.now()
    // in id order: three stamped a year ahead (more than a batch of 2), four 91 days old, two a day old
    const ages = [-365, -365, -365, 91, 91, 91, 91, 1, 1]
    for (const ageDays of ages) await startRun(database.db, { replica: 'host:1', startedAt: new Date(now - ageDays * DAY) })
    await seedJobs(database.db, now, ages.map((ageDays) => ({ state: 'done', ageDays })))
    for (const [index, ageDays] of ages.entries()) {
      await sql`insert into reaction_stream_batches (handler, to_position, to_history_id, done, events, finished_at)
        values ('ledger', '1'::xid8, ${index + 1}, array[${index + 1}]::bigint[], 1, ${new Date(now - ageDays * DAY)})`.execute(database.db)
    }
    const dryRun = await runPrunePass(deps, SETTINGS, { dryRun: true })
    expect(dryRun.counts).toMatchObject({ reaction_job: 8, reconcile_run: 4 })

    const pass = await runPrunePass(deps, SETTINGS)
    expect(pass.counts).toMatchObject({ reaction_job: 8, reconcile_run: 4 })
    const ageOf = (at: Date) => Math.round((now - at.getTime()) / DAY)
    expect((await listRuns(database.db, 100)).map((run) => ageOf(run.startedAt)).sort((a, b) => a - b)).toEqual([-365, -365, -365, 1, 1])
    const jobs = await database.db.selectFrom('reactionJobs').select('createdAt').orderBy('id').execute()
    expect(jobs.map((job) => ageOf(job.createdAt))).toEqual([-365, -365, -365, 1, 1])
    const batches = await database.db.selectFrom('reactionStreamBatches').select('finishedAt').orderBy('id').execute()
    expect(batches.map((batch) => ageOf(batch.finishedAt))).toEqual([-365, -365, -365, 1, 1])
    expect((await runPrunePass(deps, SETTINGS)).counts).toMatchObject({ reaction_job: 0, reconcile_run: 0 })
  })

  // found from outside: a `prune` a second terminal ran inside the service pruned 2,500 rows, and neither
  // retention_rows_pruned_total nor the last pass's time moved, so PartnerEscrowPruningStalled (whose runbook says
  // to run it) stayed on until the service's own next pass
  it('counts a prune run inside a service in that service\'s metrics, and a dry run not at all', async () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const config = testConfig()
    const inService = { config, db: database.db, holdLock: database.holdLock, logger: testLogger(), retentionHooks: metrics.retentionHooks }
    await seedDeliveries(database.db, Date.now(), [
      { id: 'd-091', ageDays: 91 },
      { id: 'd-095', ageDays: 95 },
      { id: 'd-001', ageDays: 1 },
    ])
    const read = async () => {
      const text = await metrics.registry.metrics()
      return {
        pruned: /^retention_rows_pruned_total\{what="delivery"\} (\d+)$/m.exec(text)?.[1],
        lastPass: /^retention_last_pass_timestamp_seconds (\S+)$/m.exec(text)?.[1],
      }
    }
    const before = await read()
    expect((await runCommandWith(['prune', '--dry-run'], inService)).code).toBe(0)
    expect(await read()).toEqual(before)
    const startedAt = Date.now()
    expect((await runCommandWith(['prune'], inService)).code).toBe(0)
    const after = await read()
    expect(after.pruned).toBe('2')
    expect(Number(after.lastPass) * 1000).toBeGreaterThanOrEqual(startedAt)
  })

  it('keeps deduplicating a delivery whose body was pruned, and forgets one whose row was deleted', async () => {
    const now = clock.now()
    await seedDeliveries(database.db, now, [
      { id: 'd-031', ageDays: 31 },
      { id: 'd-091', ageDays: 91 },
    ])
    await runPrunePass(deps, SETTINGS)

    const pruned = await findDelivery(database.db, 'd-031')
    expect(pruned).toMatchObject({ deliveryId: 'd-031', rawBody: null, outcome: 'applied' })
    const retry = { eventType: 'trade.funded', rawBody: '{"id":"d-031"}', outcome: 'ignored' as const, receivedAt: new Date(now) }
    // a retry of the 31-day delivery: the same id and body hash, still a duplicate
    expect(await recordDelivery(database.db, { deliveryId: 'd-031', bodySha256: 'sha-d-031', ...retry })).toEqual({
      inserted: false,
      idReused: false,
      replayed: false,
    })
    // past DELIVERY_RETENTION_DAYS the id is forgotten: a replay is stored as new (the status rules decide its effect)
    expect(await findDelivery(database.db, 'd-091')).toBeUndefined()
    expect(await recordDelivery(database.db, { deliveryId: 'd-091', bodySha256: 'sha-d-091', ...retry })).toEqual({
      inserted: true,
      idReused: false,
      replayed: false,
    })
  })

  it('counts in a dry run and changes nothing', async () => {
    const now = clock.now()
    await seedDeliveries(database.db, now, [
      { id: 'd-001', ageDays: 1 },
      { id: 'd-031', ageDays: 31 },
      { id: 'd-091', ageDays: 91 },
      { id: 'parked-400', ageDays: 400, outcome: 'unmatched' },
    ])
    await seedJobs(database.db, now, [
      { state: 'done', ageDays: 91 },
      { state: 'failed', ageDays: 91 },
    ])
    const before = await deliveryRows(database.db)

    const result = await runPrunePass(deps, SETTINGS, { dryRun: true })

    expect(result).toMatchObject({ ran: true, dryRun: true, counts: { body: 1, delivery: 1, reaction_job: 1, reconcile_run: 0 } })
    expect(await deliveryRows(database.db)).toEqual(before)
    expect(await jobStates(database.db)).toEqual(['done', 'failed'])
    const progress = await database.db.selectFrom('retentionProgress').selectAll().execute()
    expect(progress).toEqual([])
  })

  it('starts the body pass where the last one stopped, and prunes bodies as they come of age', async () => {
    const now = clock.now()
    await seedDeliveries(database.db, now, [
      { id: 'd-031', ageDays: 31 },
      { id: 'd-020', ageDays: 20 },
    ])
    expect((await runPrunePass(deps, SETTINGS)).counts.body).toBe(1)
    const mark = await database.db.selectFrom('retentionProgress').select('doneThrough').executeTakeFirstOrThrow()
    expect(new Date(mark.doneThrough).getTime()).toBe(now - 30 * DAY)

    await clock.advance(11 * DAY)
    expect((await runPrunePass(deps, SETTINGS)).counts.body).toBe(1)
    expect(await deliveryRows(database.db)).toEqual({ 'd-020': 'pruned', 'd-031': 'pruned' })
  })

  it('stops between batches when its signal is aborted, keeping what it did', async () => {
    const now = clock.now()
    await seedDeliveries(
      database.db,
      now,
      Array.from({ length: 6 }, (_, index) => ({ id: `d-${index}`, ageDays: 100 + index })),
    )
    const controller = new AbortController()
    const pass = runPrunePass(deps, { ...SETTINGS, pauseMs: 1_000 }, { signal: controller.signal })
    await eventually(() => clock.sleeps.length > 0, 'the pass pauses after its first batch')
    controller.abort()
    const result = await pass
    expect(result).toMatchObject({ interrupted: true, counts: { delivery: 2 } })
    expect(Object.keys(await deliveryRows(database.db))).toHaveLength(4)
  })

  // found from outside: a pass whose lock's session a DBA's job ended counted as finished, so the last-pass time
  // moved on while the bodies were never reached, and PartnerEscrowPruningStalled stayed quiet
  it('tells onPass (the last-pass time) only of a whole pass, never of one cut short', async () => {
    await seedDeliveries(database.db, clock.now(), Array.from({ length: 6 }, (_, index) => ({ id: `p-${index}`, ageDays: 100 + index })))
    const finished: boolean[] = []
    const loop = { intervalMs: 3_600_000, firstDelayMs: 3_600_000 }
    const cut = createPruner({ ...deps, settings: { ...SETTINGS, pauseMs: 1_000, ...loop }, onPass: (result) => finished.push(result.interrupted) })
    const pass = cut.runOnce()
    await eventually(() => clock.sleeps.length > 0, 'the pass pauses after its first batch')
    await cut.stop()
    expect(await pass).toMatchObject({ ran: true, interrupted: true })
    expect(finished).toEqual([])
    const whole = createPruner({ ...deps, settings: { ...SETTINGS, ...loop }, onPass: (result) => finished.push(result.interrupted) })
    expect(await whole.runOnce()).toMatchObject({ ran: true, interrupted: false })
    expect(finished).toEqual([false])
  })
})

describe('a parked delivery whose body was pruned', () => {
  const database = useTestDatabase()
  const config = testConfig()

  it('is applied when its order is created, from its stored columns', async () => {
    await sql`truncate webhook_deliveries, retention_progress, order_status_history, orders cascade`.execute(database.db)
    // received 40 days ago: the body goes at 30, the row stays (under 90, and parked)
    const clock = new FakeClock(Date.now() - 40 * DAY)
    const app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock })
    const parked = await sendWebhook(app, { body: tradePayload('parked-order-1', 'funded'), deliveryId: 'dlv-parked-1' })
    expect(parked.status).toBe(200)
    expect(await findDelivery(database.db, 'dlv-parked-1')).toMatchObject({ outcome: 'unmatched' })

    const result = await runPrunePass({ db: database.db, holdLock: database.holdLock, clock: systemClock }, SETTINGS)
    expect(result.counts).toMatchObject({ body: 1, delivery: 0 })
    expect(await findDelivery(database.db, 'dlv-parked-1')).toMatchObject({ outcome: 'unmatched', rawBody: null })

    const created = await runCommand(['orders', 'create', '--external-reference', 'parked-order-1', '--json'], database.db, config)
    expect(created.code).toBe(0)
    expect(await findOrderByExternalReference(database.db, 'parked-order-1')).toMatchObject({
      tradeStatus: 'funded',
      tradeId: 'trd_parked-order-1',
    })
    expect(await findDelivery(database.db, 'dlv-parked-1')).toMatchObject({ outcome: 'applied' })
  })
})

describe('a delivery whose body was pruned', () => {
  const database = useTestDatabase()
  const TOKEN = 'retention-console-token-0123456789abcdef'
  const config = testConfig({ ADMIN_TOKEN: TOKEN, RETENTION_DAYS: '14', DELIVERY_RETENTION_DAYS: '60' })

  beforeEach(async () => {
    await sql`truncate webhook_deliveries, retention_progress`.execute(database.db)
    const clock = new FakeClock(Date.now())
    await seedDeliveries(database.db, clock.now(), [{ id: 'd-020', ageDays: 20 }])
    await runPrunePass({ db: database.db, holdLock: database.holdLock, clock }, { ...SETTINGS, bodyDays: 14, deliveryDays: 60 })
  })

  it('says so in `deliveries show`, naming the retention, and can still be re-applied', async () => {
    const stored = await findDelivery(database.db, 'd-020')
    expect(stored?.rawBody).toBeNull()

    const text = await runCommand(['deliveries', 'show', 'd-020'], database.db, config)
    expect(text.code).toBe(0)
    expect(text.stdout).toMatch(/rawBody\s+\(pruned: raw bodies are kept 14 days\)/)
    const json = await runCommand(['deliveries', 'show', 'd-020', '--json'], database.db, config)
    expect(JSON.parse(json.stdout)).toMatchObject({ deliveryId: 'd-020', rawBody: null, bodyPrunedAfterDays: 14 })
    // re-applying works from the stored columns, not the body: a pruned body does not stop it
    await database.db
      .updateTable('webhookDeliveries')
      .set({ tradeId: 'trd-20', observedStatus: 'funded' })
      .where('deliveryId', '=', 'd-020')
      .execute()
    const reapply = await runCommand(['deliveries', 'reapply', 'd-020', '--json'], database.db, config)
    expect(reapply.code).toBe(0)
    expect(JSON.parse(reapply.stdout)).toMatchObject({ deliveryId: 'd-020', outcome: 'unmatched' })
  })

  it('shows the console page with a note instead of the body', async () => {
    // the console route looks a delivery up by id and a 64-hex body hash
    const hash = 'a'.repeat(64)
    await database.db.updateTable('webhookDeliveries').set({ bodySha256: hash }).where('deliveryId', '=', 'd-020').execute()
    const admin = createAdminApp({ config, db: database.db, logger: testLogger([TOKEN]) })
    const page = await request(admin).get(`/console/deliveries/d-020/${hash}`).set('Authorization', `Bearer ${TOKEN}`)
    expect(page.status).toBe(200)
    expect(page.text).toContain('Pruned: raw bodies are kept 14 days after receipt')
    expect(page.text).not.toContain('class="body"')
  })
})

describe('serve', () => {
  let service: RunningService | undefined
  let database: TestDatabase | undefined
  afterEach(async () => {
    await service?.stop()
    await database?.close()
    service = undefined
    database = undefined
  })

  it('prunes on its interval and reports it in /metrics', async () => {
    const clock = new FakeClock(Date.parse('2026-06-01T00:00:00Z'))
    database = await createTestDatabase()
    const env: Record<string, string> = { PORT: '0', POLL_ENABLED: 'false', PRUNE_INTERVAL_S: '5' }
    if (database.url) env.DATABASE_URL = database.url
    service = await startTestService({ config: testConfig(env), logger: testLogger(), clock })
    await service.ready
    const db = service.database.db
    const seededAt = clock.now()
    await seedDeliveries(db, seededAt, [
      { id: 'd-001', ageDays: 1 },
      { id: 'd-091', ageDays: 91 },
    ])

    // the first pass comes one interval after start-up (5 s: shorter than the 60 s cap)
    await eventually(() => clock.sleeps.includes(5_000), 'the pruner waits its interval')
    await clock.advance(5_000)
    await eventually(() => service?.pruner?.lastPass !== undefined, 'the first pass finishes')
    expect(await deliveryRows(db)).toEqual({ 'd-001': 'body' })

    const first = service.pruner?.lastPass
    const metrics = await (await fetch(`${service.adminUrl}/metrics`)).text()
    expect(metrics).toMatch(/^retention_rows_pruned_total\{what="delivery"\} 1$/m)
    expect(metrics).toMatch(/^retention_rows_pruned_total\{what="body"\} 0$/m)
    expect(metrics).toMatch(new RegExp(`^webhook_oldest_delivery_timestamp_seconds ${(seededAt - DAY) / 1000}$`, 'm'))
    expect(metrics).toMatch(new RegExp(`^retention_last_pass_timestamp_seconds ${clock.now() / 1000}$`, 'm'))

    // and again one interval later
    await seedDeliveries(db, clock.now(), [{ id: 'd-095', ageDays: 95 }])
    await eventually(() => clock.sleeps.filter((ms) => ms === 5_000).length >= 2, 'the pruner waits again')
    await clock.advance(5_000)
    await eventually(() => service?.pruner?.lastPass?.counts.delivery === 1 && service.pruner.lastPass !== first, 'the next pass finishes')
    expect(await deliveryRows(db)).toEqual({ 'd-001': 'body' })

    const running = service
    service = undefined
    await running.stop()
  })
})

describe('serve on PGlite', () => {
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    service = undefined
  })

  // PGlite has no autovacuum: without a VACUUM the pruned rows kept their place and the table grew by every
  // round of deliveries, though it held none of them (26 MB more per 20,000 deliveries of 1 kB, by hand)
  it('uses the space of pruned deliveries again: the table does not grow pass after pass', async () => {
    const clock = new FakeClock(Date.parse('2026-06-01T00:00:00Z'))
    service = await startTestService({
      // one batch a round: a pass never pauses on the fake clock
      config: testConfig({ PORT: '0', POLL_ENABLED: 'false', PRUNE_INTERVAL_S: '5', PRUNE_BATCH_SIZE: '5000' }),
      logger: testLogger(),
      clock,
    })
    await service.ready
    const running = service
    const db = running.database.db
    const tableBytes = async () =>
      Number((await sql<{ bytes: string }>`select pg_total_relation_size('webhook_deliveries')::text as bytes`.execute(db)).rows[0]!.bytes)
    const sizes: number[] = []
    for (let round = 0; round < 3; round++) {
      await sql`insert into webhook_deliveries (delivery_id, received_at, event_type, outcome, raw_body, body_sha256)
        select ${`r${round}-`} || g, ${new Date(clock.now() - 100 * DAY)}, 'trade.funded', 'applied', repeat('x', 1000), md5(g::text)
        from generate_series(1, 2000) g`.execute(db)
      sizes.push(await tableBytes())
      await eventually(() => clock.sleeps.filter((ms) => ms === 5_000).length > round, 'the pruner waits its interval')
      const before = running.pruner?.lastPass
      await clock.advance(5_000)
      await eventually(() => running.pruner?.lastPass !== undefined && running.pruner.lastPass !== before, 'the pass finishes')
      expect(running.pruner?.lastPass?.counts.delivery).toBe(2000)
    }
    // each round's 2,000 rows take the place the round before freed
    expect(sizes[2]).toBeLessThan(sizes[0]! * 1.25)
  })
})

describePostgres('retention on several replicas (Postgres)', () => {
  const database = useTestDatabase()

  it('prunes on one replica at a time: a pass that finds the lock taken does nothing', async () => {
    await sql`truncate webhook_deliveries, reaction_jobs, retention_progress`.execute(database.db)
    const clock = new FakeClock(Date.parse('2026-06-01T00:00:00Z'))
    await seedDeliveries(
      database.db,
      clock.now(),
      Array.from({ length: 6 }, (_, index) => ({ id: `d-${index}`, ageDays: 100 + index })),
    )
    const first = { db: database.db, holdLock: database.holdLock, clock }
    const other = database.openAnother()
    try {
      // the first replica's pass holds the lock while it pauses between batches (on the fake clock)
      const pass = runPrunePass(first, { ...SETTINGS, pauseMs: 1_000 })
      await eventually(() => clock.sleeps.length > 0, 'the first pass pauses after a batch')
      const second = await runPrunePass({ db: other.db, holdLock: other.holdLock, clock }, SETTINGS)
      expect(second).toMatchObject({ ran: false, counts: { body: 0, delivery: 0, reaction_job: 0 } })
      // a dry run says so too (the runbook's check for a pass stuck behind a lock), and counts nothing
      const dryRun = await runPrunePass({ db: other.db, holdLock: other.holdLock, clock }, SETTINGS, { dryRun: true })
      expect(dryRun).toMatchObject({ ran: false, dryRun: true })
      expect(Object.keys(await deliveryRows(database.db))).toHaveLength(4)

      await runOut(pass, clock)
      expect(await pass).toMatchObject({ ran: true, counts: { delivery: 6 } })
      // released after the pass: the other replica gets it now
      expect(await runPrunePass({ db: other.db, holdLock: other.holdLock, clock }, SETTINGS)).toMatchObject({ ran: true })
    } finally {
      await other.close()
    }
  })

  // advisory locks are the whole database's: a service of another schema in it (a shared database, or another
  // test file's on Postgres) holding its prune lock made every pass here do nothing (`ran: false`) meanwhile
  it('prunes while a service in another schema of the same database holds its own prune lock', async () => {
    await sql`truncate webhook_deliveries, reaction_jobs, retention_progress`.execute(database.db)
    const clock = new FakeClock(Date.parse('2026-06-01T00:00:00Z'))
    await seedDeliveries(database.db, clock.now(), [{ id: 'd-100', ageDays: 100 }])
    const neighbour = await createTestDatabase({ migrate: false })
    try {
      const release = await neighbour.holdLock(PRUNE_LOCK_KEY)
      expect(release).toBeDefined()
      try {
        const result = await runPrunePass({ db: database.db, holdLock: database.holdLock, clock }, SETTINGS)
        expect(result).toMatchObject({ ran: true, counts: { delivery: 1 } })
      } finally {
        await release!()
      }
    } finally {
      await neighbour.close()
    }
  })

  it('gives the lock back when a pass fails', async () => {
    const clock = new FakeClock()
    const failing = { db: database.db, holdLock: database.holdLock, clock }
    // a statement fails mid-pass (here: the table is not there)
    await sql`alter table webhook_deliveries rename to webhook_deliveries_away`.execute(database.db)
    try {
      await expect(runPrunePass(failing, SETTINGS)).rejects.toThrow(/webhook_deliveries/)
    } finally {
      await sql`alter table webhook_deliveries_away rename to webhook_deliveries`.execute(database.db)
    }
    const client = new pg.Client({ connectionString: database.url })
    await client.connect()
    try {
      const held = await client.query(
        `select count(*)::int as held from pg_locks
         where locktype = 'advisory' and classid = $1 and objsubid = 2 and database = (select oid from pg_database where datname = current_database())`,
        [PRUNE_LOCK_KEY],
      )
      expect(held.rows[0].held).toBe(0)
    } finally {
      await client.end()
    }
  })

  it('reads a batch off the received_at index, not the whole table', async () => {
    await sql`truncate webhook_deliveries`.execute(database.db)
    await sql`
      insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, outcome, raw_body)
      select 'dlv-' || i, md5(i::text), now() - (i * interval '3 minutes'), 'trade.funded',
             case when i % 100 = 0 then 'unmatched' else 'applied' end, '{}'
      from generate_series(1, 60000) as i`.execute(database.db)
    await sql`analyze webhook_deliveries`.execute(database.db)
    const now = Date.now()
    for (const what of ['rows', 'bodies'] as const) {
      const compiled = prunableDeliveriesQuery(
        database.db,
        { before: new Date(now - (what === 'rows' ? 90 : 30) * DAY), from: undefined, limit: 1_000 },
        what,
      ).compile()
      const result = await database.db.executeQuery<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
        CompiledQuery.raw(`explain (format json) ${compiled.sql}`, [...compiled.parameters]),
      )
      const nodes = nodesOf(result.rows[0]!['QUERY PLAN'][0].Plan)
      expect(nodes.map((node) => node['Index Name']).filter(Boolean)).toContain('webhook_deliveries_received_idx')
      expect(nodes.map((node) => node['Node Type'])).not.toContain('Seq Scan')
    }
  })
})

describePostgres('retention while deliveries change (Postgres)', () => {
  const database = useTestDatabase()

  it('prunes the bodies after a batch that came back short because a row changed between its selection and its update', async () => {
    await sql`truncate webhook_deliveries, retention_progress`.execute(database.db)
    const clock = new FakeClock(Date.parse('2026-06-01T00:00:00Z'))
    const deps = { db: database.db, holdLock: database.holdLock, clock }
    // oldest first: the first batch of 2 is d-35 and d-34
    await seedDeliveries(database.db, clock.now(), [35, 34, 33, 32, 31].map((ageDays) => ({ id: `d-${ageDays}`, ageDays })))

    // another session changes d-34 (a re-apply records its new outcome) and holds it: the pass's first batch
    // selects d-34 and then waits for it; once that commits, the row's current version is not the one selected
    const other = new pg.Client({ connectionString: database.url })
    await other.connect()
    try {
      await other.query('begin')
      await other.query(`update webhook_deliveries set outcome = 'stale' where delivery_id = 'd-34'`)
      const pass = runPrunePass(deps, SETTINGS)
      await eventually(async () => {
        const { rows } = await sql<{ waiting: number }>`
          select count(*)::int as waiting from pg_stat_activity
          where wait_event_type = 'Lock' and query like '%raw_body%' and datname = current_database()`.execute(database.db)
        return rows[0]!.waiting > 0
      }, 'the first batch waits for the changed row')
      await other.query('commit')
      const first = await pass
      const second = await runPrunePass(deps, SETTINGS)

      expect([first.counts.body, second.counts.body]).toEqual([5, 0])
      expect(await deliveryRows(database.db)).toEqual({
        'd-31': 'pruned',
        'd-32': 'pruned',
        'd-33': 'pruned',
        'd-34': 'pruned',
        'd-35': 'pruned',
      })
    } finally {
      await other.end()
    }
  })
})

interface PlanNode {
  'Node Type': string
  'Index Name'?: string
  Plans?: PlanNode[]
}

function nodesOf(plan: PlanNode): PlanNode[] {
  return [plan, ...(plan.Plans ?? []).flatMap(nodesOf)]
}

// The pass's lock is held in a transaction of its own for the whole pass. Its session must hold no snapshot
// meanwhile: a session idle in its transaction with a backend_xmin keeps every VACUUM in the database (autovacuum's
// too) from removing a row deleted after it, for as long as the pass runs. The lock used to be taken by a statement
// sent with a parameter, whose open portal kept its snapshot: a 33-s pass left an unrelated table's 10,000 deleted
// rows "dead but not yet removable". Under a database default of REPEATABLE READ any statement's snapshot is the
// transaction's, so the lock's transaction says READ COMMITTED itself.
for (const isolation of [undefined, 'repeatable read'] as const) {
  describePostgres(`the prune lock's session while a pass runs${isolation ? `, the database's default ${isolation}` : ''} (Postgres)`, () => {
    const database = useTestDatabase(isolation ? { sessionDefaults: { default_transaction_isolation: isolation } } : {})

    it('holds no snapshot: a VACUUM of another table removes the rows deleted while the pass holds the lock', async () => {
      await sql`truncate webhook_deliveries, reaction_jobs, retention_progress`.execute(database.db)
      const clock = new FakeClock(Date.parse('2026-06-01T00:00:00Z'))
      await seedDeliveries(database.db, clock.now(), Array.from({ length: 6 }, (_, index) => ({ id: `d-${index}`, ageDays: 100 + index })))
      const client = new pg.Client({ connectionString: database.url })
      await client.connect()
      const notices: string[] = []
      client.on('notice', (notice) => notices.push(notice.message ?? ''))
      // the pass pauses after its first batch (on the fake clock), holding the lock
      const pass = runPrunePass({ db: database.db, holdLock: database.holdLock, clock }, { ...SETTINGS, pauseMs: 1_000 })
      try {
        await eventually(() => clock.sleeps.length > 0, 'the pass pauses after a batch')
        const { rows: sessions } = await client.query<{ state: string; backend_xmin: string | null; backend_xid: string | null }>(
          `select a.state, a.backend_xmin::text, a.backend_xid::text from pg_locks l join pg_stat_activity a on a.pid = l.pid
           where l.locktype = 'advisory' and l.classid = $1 and l.objid = hashtext(current_schema())::oid and l.objsubid = 2
             and l.database = (select oid from pg_database where datname = current_database())`,
          [PRUNE_LOCK_KEY],
        )
        expect(sessions).toEqual([{ state: 'idle in transaction', backend_xmin: null, backend_xid: null }])

        await client.query('create table scratch (id int) with (autovacuum_enabled = false)')
        await client.query('insert into scratch select generate_series(1, 1000)')
        await client.query('delete from scratch')
        // other test files' sessions in this database may hold a snapshot for a moment: VACUUM again until none
        // does. The lock's session would hold its snapshot until the pass ends (after this wait)
        let removed = 0
        await eventually(async () => {
          notices.length = 0
          await client.query('vacuum (verbose) scratch')
          const tuples = notices.map((message) => /tuples: (\d+) removed, \d+ remain, (\d+) are dead but not yet removable/.exec(message)).find(Boolean)
          if (!tuples) throw new Error(`VACUUM VERBOSE said no tuple counts: ${notices.join(' | ')}`)
          removed += Number(tuples[1])
          return Number(tuples[2]) === 0
        }, 'a VACUUM removes every deleted row of the scratch table')
        expect(removed).toBe(1000)
      } finally {
        await runOut(pass, clock)
        await client.query('drop table if exists scratch')
        await client.end()
      }
      expect(await pass).toMatchObject({ ran: true, counts: { delivery: 6 } })
    })
  })
}
