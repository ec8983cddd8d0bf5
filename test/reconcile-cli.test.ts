// `reconcile --once | --report | --requeue`, run in-process through the CLI runner (the same code path and
// exit-code contract as a real process) against a local platform that checks every signature.
import { createServer as createHttpServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createServer } from 'node:net'
import { sql } from 'kysely'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { type Clock, systemClock } from '../src/clock.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import {
  type PlannedAnswer,
  type RecordedRequest,
  type RecordingServer,
  startRecordingServer,
} from './helpers/partner-api-recording-server.js'
import { claimDueOrders } from '../src/orders/poll-schedule.repository.js'
import { reportedRun, startRun } from '../src/reconcile/reconcile-run.repository.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { parseConfig } from '../src/config.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

let database: TestDatabase
let server: RecordingServer
let context: CliContext
let answer: (request: RecordedRequest) => PlannedAnswer

const tradeIdOf = (path: string) => decodeURIComponent(path.split('/').at(-2)!)
const delivered = (request: RecordedRequest): PlannedAnswer => {
  const tradeId = tradeIdOf(request.path)
  return {
    status: 200,
    body: tradeRecord({
      trade_id: tradeId,
      external_reference: tradeId.replace(/^tr_/, ''),
      status: 'delivered',
    }),
  }
}

beforeAll(async () => {
  database = await createTestDatabase()
  server = await startRecordingServer({ secret: TEST_API_SECRET, answer: (request) => answer(request) })
  const config = testConfig({ PARTNER_API_BASE_URL: server.url, POLL_CONCURRENCY: '1' })
  context = { config, logger: testLogger([TEST_API_SECRET]), db: database.db }
})
afterAll(async () => {
  await server.close()
  await database.close()
})
beforeEach(async () => {
  answer = delivered
  server.requests.length = 0
  await database.db.deleteFrom('orders').execute()
  await database.db.deleteFrom('reconcileRuns').execute()
})

function cli(...args: string[]) {
  return runCommandWith(args, context)
}

const past = (s: number) => new Date(Date.now() - s * 1000)

async function databaseNow(): Promise<number> {
  const { rows } = await sql<{ now: Date }>`select statement_timestamp() as now`.execute(database.db)
  return new Date(rows[0]!.now).getTime()
}

describe('reconcile --once', () => {
  it('polls the due orders with signed GETs, applies the answers and prints the run', async () => {
    await insertOrders(database.db, [
      { externalReference: 'cli-a', nextPollAt: past(60) },
      { externalReference: 'cli-b', nextPollAt: past(30) },
    ])
    const result = await cli('reconcile', '--once')
    expect(result.stderr).toBe('')
    expect(result.code).toBe(0)
    expect(result.stdout).toMatch(/^run \d+: claimed 2, polled 2, changed 2, errors 0 \(applied 2\)\n$/)
    expect(server.requests.map((request) => [request.method, request.path, request.signatureValid])).toEqual([
      ['GET', '/api/partner/v1/trades/tr_cli-a/', true],
      ['GET', '/api/partner/v1/trades/tr_cli-b/', true],
    ])
    expect((await orderByReference(database.db, 'cli-a')).tradeStatus).toBe('delivered')
  })

  it('prints the summary as JSON and records a run even when nothing was due', async () => {
    const result = await cli('reconcile', '--once', '--json')
    expect(result.code).toBe(0)
    const summary = JSON.parse(result.stdout)
    expect(summary).toMatchObject({ claimed: 0, polled: 0, changed: 0, errors: 0, stoppedReason: null })
    expect(summary.runId).toEqual(expect.any(Number))
    expect(summary.replica).toMatch(/^cli:/)
    const runs = await database.db.selectFrom('reconcileRuns').select('id').execute()
    expect(runs.map((run) => run.id)).toEqual([summary.runId])
  })

  it('exits 1 and names the credentials when the platform answers 401', async () => {
    await insertOrders(database.db, [
      { externalReference: 'cli-a', nextPollAt: past(60) },
      { externalReference: 'cli-b', nextPollAt: past(30) },
    ])
    answer = () => ({ status: 401, body: { error: { code: 'invalid_signature', message: 'bad signature' } } })
    const result = await cli('reconcile', '--once')
    expect(result.code).toBe(1)
    expect(result.stdout).toContain('stopped: unauthorized')
    expect(result.stderr).toBe('stopped: the platform answered 401 (check PARTNER_API_KEY_ID / PARTNER_API_SECRET / PARTNER_ENV) [unauthorized]\n')
    expect(server.requests).toHaveLength(1)
    expect((await orderByReference(database.db, 'cli-b')).pollLeaseToken).toBeNull()
  })

  // run in a second terminal of `serve`, its polls were counted nowhere: a 401 there reached no alert
  it("counts its polls in the service's poller_polls_total when it runs inside the service", async () => {
    await insertOrders(database.db, [
      { externalReference: 'cli-a', nextPollAt: past(60) },
      { externalReference: 'cli-b', nextPollAt: past(30) },
    ])
    const counted: string[] = []
    const result = await runCommandWith(['reconcile', '--once'], { ...context, onPollResult: ({ result }) => counted.push(result) })
    expect(result.code).toBe(0)
    expect(counted).toEqual(['applied', 'applied'])
  })

  it('exits 1 with [throttled] when the platform asks it to slow down, and says when the rest is due', async () => {
    await insertOrders(database.db, [
      { externalReference: 'cli-a', nextPollAt: past(60) },
      { externalReference: 'cli-b', nextPollAt: past(30) },
    ])
    answer = () => ({ status: 429, headers: { 'retry-after': '120' }, body: { error: { code: 'throttled', message: 'slow down' } } })
    const result = await cli('reconcile', '--once')
    expect(result.code).toBe(1)
    expect(result.stdout).toContain('stopped: throttled')
    expect(result.stderr).toMatch(/^stopped: the platform asked us to slow down \(429 or Retry-After\); the orders not polled are due again at \d{4}-\d\d-\d\dT[\d:.]+Z \[throttled\]\n$/)
    expect(server.requests).toHaveLength(1)
  })
})

describe('reconcile --once against a platform that is failing', () => {
  it('exits 1 with [platform_failing] once polls in a row failed there, the rest given back', async () => {
    await insertOrders(
      database.db,
      Array.from({ length: 12 }, (_, i) => ({ externalReference: `cli-down-${i}`, nextPollAt: past(60 - i) })),
    )
    answer = () => ({ status: 503, body: { error: { code: 'unavailable', message: 'down for maintenance' } } })
    const result = await cli('reconcile', '--once')
    expect(result.code).toBe(1)
    expect(result.stdout).toContain('stopped: platform_failing')
    expect(result.stderr).toContain(
      'stopped: the platform is failing (polls in a row ended in its errors after their retries); the orders not polled were given back [platform_failing]\n',
    )
    // five orders in a row (POLL_CONCURRENCY is 1 here), each with the client's four attempts; the others never asked
    const asked = new Set(server.requests.map((request) => request.path))
    expect(asked.size).toBe(5)
    expect(server.requests).toHaveLength(20)
    const untouched = await database.db.selectFrom('orders').select('pollAttempts').where('pollAttempts', '=', 0).execute()
    expect(untouched).toHaveLength(7)
  })
})

describe('reconcile --report', () => {
  it('shows the latest runs, newest first, as a table or JSON', async () => {
    await insertOrders(database.db, [{ externalReference: 'cli-a', nextPollAt: past(60) }])
    await cli('reconcile', '--once')
    await cli('reconcile', '--once')

    const table = await cli('reconcile', '--report')
    expect(table.code).toBe(0)
    const lines = table.stdout.trim().split('\n')
    expect(lines[0]).toMatch(/^id\s+replica\s+started\s+seconds\s+polled\s+changed\s+errors\s+stopped$/)
    expect(lines).toHaveLength(3)

    const json = await cli('reconcile', '--report', '--limit', '1', '--json')
    const runs = JSON.parse(json.stdout)
    expect(runs).toHaveLength(1)
    expect(runs[0]).toMatchObject({ polled: 0, changed: 0, errors: 0, stoppedReason: null })
  })

  it('says so when there are no runs', async () => {
    const result = await cli('reconcile', '--report')
    expect(result.stdout).toBe('(no reconciliation runs yet)\n')
  })
})

// What a cycle whose process was killed (SIGKILL, a host lost) leaves: its run written with no end, and the orders it
// claimed leased until its lease (300 s) runs out. The review that killed `reconcile --once` mid-cycle found the run
// shown `running` with 0 polled until retention deleted it, and the next `--once` claiming nothing without a word.
async function killedCycle(startedAt: Date, orders: number): Promise<{ runId: number; leaseEnd: Date }> {
  await claimDueOrders(database.db, { now: startedAt, limit: orders, leaseS: 300, leaseToken: 'killed-cycle', partnerEnv: 'sandbox' })
  const runId = await startRun(database.db, { replica: 'cli:elsewhere:1', startedAt })
  return { runId, leaseEnd: new Date(startedAt.getTime() + 300_000) }
}

describe('reconcile --report of a run whose process stopped', () => {
  // a run is judged by how long ago it started by the database's time: the runs below start that long before it, a
  // minute either side of the longest a cycle runs (the exact bound: reportedRun, below)
  const MARGIN_MS = 60_000
  const startedAgo = async (ageMs: number) => new Date((await databaseNow()) - ageMs)
  const report = (args: string[], config = context.config, clock?: Clock) =>
    runCommandWith(['reconcile', '--report', ...args], { ...context, config, ...(clock ? { clock } : {}) })

  // the defaults (PARTNER_API_TIMEOUT_MS 10 s, DATABASE_STATEMENT_TIMEOUT_MS 14 s): the lease's 300 s, 40 s of four
  // GET attempts and 180 s of three Retry-After waits, and 15 s for each of four statements after the last poll
  it('shows a run with no end past 580 s after its start unfinished, its counts unknown, and one not past that running', async () => {
    await insertOrders(database.db, [{ externalReference: 'cli-a', nextPollAt: past(60) }])
    await cli('reconcile', '--once')
    const { runId: dead } = await killedCycle(await startedAgo(580_000 + MARGIN_MS), 0)
    const { runId: live } = await killedCycle(await startedAgo(580_000 - MARGIN_MS), 0)

    const table = await report([])
    expect(table.code).toBe(0)
    const lines = table.stdout.split('\n')
    expect(lines[1]).toMatch(new RegExp(`^${live}\\s+cli:elsewhere:1\\s+\\S+\\s+running\\s+-\\s+-\\s+-\\s+-$`))
    expect(lines[2]).toMatch(new RegExp(`^${dead}\\s+cli:elsewhere:1\\s+\\S+\\s+unfinished\\s+-\\s+-\\s+-\\s+-$`))
    expect(lines[3]).toMatch(/^\d+\s+cli:\S+\s+\S+\s+\d+\.\d\s+1\s+1\s+0\s+-$/)
    expect(lines.slice(4)).toEqual([
      `unfinished (run ${dead}): no end recorded 580 s after the start, past the longest a cycle runs: its process stopped ` +
        '(killed, its host lost) or lost the database; its counts are unknown, and its orders came due again when their lease ran out',
      '',
    ])

    const runs = JSON.parse((await report(['--json'])).stdout)
    expect(runs.map((run: { state: string }) => run.state)).toEqual(['running', 'unfinished', 'finished'])
    expect(runs[0]).toMatchObject({ id: live, finishedAt: null, polled: null, changed: null, errors: null })
    expect(runs[1]).toMatchObject({ id: dead, finishedAt: null, polled: null, changed: null, errors: null })
    expect(runs[2]).toMatchObject({ polled: 1, changed: 1, errors: 0, stoppedReason: null })
  })

  it('takes the longest a cycle runs from PARTNER_API_TIMEOUT_MS and DATABASE_STATEMENT_TIMEOUT_MS', async () => {
    await killedCycle(await startedAgo(492_000 + MARGIN_MS), 0)
    await killedCycle(await startedAgo(492_000 - MARGIN_MS), 0)
    // 300 s, 4 × 1 s and 3 × 60 s for the GET, 4 × (1 + 1) s
    const result = await report([], testConfig({ PARTNER_API_TIMEOUT_MS: '1000', DATABASE_STATEMENT_TIMEOUT_MS: '1000' }))
    const states = result.stdout.split('\n').slice(1, 3).map((line) => line.split(/\s+/)[3])
    expect(states).toEqual(['running', 'unfinished'])
    expect(result.stdout).toContain('no end recorded 492 s after the start')
  })

  it('takes the lease of the longest a cycle runs from POLL_LEASE_S', async () => {
    await killedCycle(await startedAgo(680_000 + MARGIN_MS), 0)
    await killedCycle(await startedAgo(680_000 - MARGIN_MS), 0)
    // 400 s, 220 s for the GET, 4 × 15 s
    const result = await report([], testConfig({ POLL_LEASE_S: '400' }))
    const states = result.stdout.split('\n').slice(1, 3).map((line) => line.split(/\s+/)[3])
    expect(states).toEqual(['running', 'unfinished'])
    expect(result.stdout).toContain('no end recorded 680 s after the start')
  })

  it('is running up to the longest a cycle runs after its start, to the millisecond, and unfinished past it (reportedRun)', () => {
    const now = new Date('2026-12-05T12:00:00.000Z')
    const run = (ageMs: number) => ({
      id: 1,
      replica: 'r:1',
      startedAt: new Date(now.getTime() - ageMs),
      finishedAt: null,
      polled: 0,
      changed: 0,
      errors: 0,
      stoppedReason: null,
      clockOffsetS: null,
    })
    expect(reportedRun(run(580_000), now, 580_000)).toMatchObject({ state: 'running', polled: null, changed: null, errors: null })
    expect(reportedRun(run(580_001), now, 580_000)).toMatchObject({ state: 'unfinished', polled: null, changed: null, errors: null })
    expect(reportedRun({ ...run(600_000), finishedAt: now }, now, 580_000)).toMatchObject({ state: 'finished', polled: 0 })
  })

  // found by review: the state was judged by the reading machine's clock against the start its replica wrote, so a
  // command on a machine 10 minutes ahead called a cycle under way unfinished ("its process stopped"), and one 10
  // minutes behind called a killed run running for 10 minutes more
  it.each([
    ['ahead', 600_000],
    ['behind', -600_000],
  ])("judges a run by the database's time, not by the clock of a machine 10 minutes %s", async (_side, offsetMs) => {
    const { runId: dead } = await killedCycle(await startedAgo(580_000 + MARGIN_MS), 0)
    const { runId: live } = await killedCycle(await startedAgo(MARGIN_MS), 0)
    const skewed: Clock = { now: () => Date.now() + offsetMs, monotonicNow: () => performance.now(), sleep: systemClock.sleep }
    const runs = JSON.parse((await report(['--json'], context.config, skewed)).stdout) as { id: number; state: string }[]
    expect(runs.map((run) => [run.id, run.state])).toEqual([
      [live, 'running'],
      [dead, 'unfinished'],
    ])
    const table = await report([], context.config, skewed)
    expect(table.stdout).toContain(`unfinished (run ${dead}): no end recorded 580 s after the start`)
    expect(table.stdout).not.toContain(`run ${live}`)
  })
})

describe('reconcile --once with POLL_LEASE_S', () => {
  it('leases each order it claims for POLL_LEASE_S: its lease and its next poll end that long after the claim', async () => {
    // near the database's time: a clock far from it claims nothing (db/clock-guard.ts)
    const at = Math.floor(Date.now() / 1000) * 1000
    await insertOrders(database.db, [{ externalReference: 'cli-leased', nextPollAt: new Date(at - 60_000) }])
    // the platform looks at the order while its GET is in flight, then answers
    const seen: { pollLeaseToken: string | null; pollLeaseExpiresAt: Date | null; nextPollAt: Date | null }[] = []
    const platform = createHttpServer((req, res) => {
      req.resume()
      void database.db
        .selectFrom('orders')
        .select(['pollLeaseToken', 'pollLeaseExpiresAt', 'nextPollAt'])
        .where('externalReference', '=', 'cli-leased')
        .executeTakeFirstOrThrow()
        .then((order) => {
          seen.push(order)
          res.writeHead(200, { 'content-type': 'application/json' })
          res.end(JSON.stringify(tradeRecord({ trade_id: 'tr_cli-leased', external_reference: 'cli-leased', status: 'delivered' })))
        })
    })
    await new Promise<void>((resolve) => platform.listen(0, '127.0.0.1', resolve))
    try {
      const config = testConfig({ PARTNER_API_BASE_URL: `http://127.0.0.1:${(platform.address() as AddressInfo).port}`, POLL_LEASE_S: '400' })
      const result = await runCommandWith(['reconcile', '--once'], { ...context, config, clock: { now: () => at, sleep: systemClock.sleep } })
      expect([result.code, result.stderr]).toEqual([0, ''])
      expect(result.stdout).toMatch(/^run \d+: claimed 1, polled 1, changed 1, errors 0 \(applied 1\)\n$/)
      expect(seen).toHaveLength(1)
      expect(seen[0]!.pollLeaseToken).not.toBeNull()
      expect([seen[0]!.pollLeaseExpiresAt, seen[0]!.nextPollAt].map((time) => new Date(time!).getTime() - at)).toEqual([400_000, 400_000])
    } finally {
      await new Promise<void>((resolve) => platform.close(() => resolve()))
    }
  })
})

describe('reconcile --once after a cycle whose process stopped', () => {
  it("says how many due orders another poller's lease holds and until when, and exits 0", async () => {
    await insertOrders(database.db, [
      { externalReference: 'cli-held-1', nextPollAt: past(120) },
      { externalReference: 'cli-held-2', nextPollAt: past(110) },
      { externalReference: 'cli-free', nextPollAt: past(60) },
    ])
    const { leaseEnd } = await killedCycle(past(30), 2)

    const result = await cli('reconcile', '--once')
    expect([result.code, result.stderr]).toEqual([0, ''])
    expect(result.stdout).toMatch(/^run \d+: claimed 1, polled 1, changed 1, errors 0 \(applied 1\)\n/)
    expect(result.stdout.split('\n')[1]).toBe(
      `left 2 due order(s) leased by another poller's cycle, due again by ${leaseEnd.toISOString()} as its lease ends ` +
        '(a cycle under way, or one whose process stopped: `reconcile --report`)',
    )
    expect(server.requests.map((request) => request.path)).toEqual(['/api/partner/v1/trades/tr_cli-free/'])

    const json = JSON.parse((await cli('reconcile', '--once', '--json')).stdout)
    expect(json).toMatchObject({ claimed: 0, leasedElsewhereDue: 2, leasedElsewhereUntil: leaseEnd.toISOString() })
  })

  it('counts no lease that has run out: its orders are claimed again', async () => {
    await insertOrders(database.db, [{ externalReference: 'cli-expired', nextPollAt: past(400) }])
    await killedCycle(past(350), 1)

    const result = await cli('reconcile', '--once', '--json')
    expect(JSON.parse(result.stdout)).toMatchObject({ claimed: 1, polled: 1, leasedElsewhereDue: 0, leasedElsewhereUntil: null })
    const text = await cli('reconcile', '--once')
    expect(text.stdout).not.toContain('leased by another poller')
  })
})

describe('reconcile --requeue', () => {
  it('puts an order flagged trade_not_found back on the schedule', async () => {
    await insertOrders(database.db, [{ externalReference: 'cli-gone', nextPollAt: past(60) }])
    answer = () => ({ status: 404, body: { error: { code: 'not_found', message: 'no such trade' } } })
    await cli('reconcile', '--once')
    expect((await orderByReference(database.db, 'cli-gone')).attention).toBe('trade_not_found')

    const result = await cli('reconcile', '--requeue', '--json')
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toEqual({
      results: [{ externalReference: 'cli-gone', outcome: 'requeued', previousAttention: 'trade_not_found', partnerEnv: null }],
      missing: [],
    })
    answer = delivered
    await cli('reconcile', '--once')
    expect((await orderByReference(database.db, 'cli-gone')).tradeStatus).toBe('delivered')
  })

  it('puts an order flagged trade_mismatch back on the schedule, with the orders flagged trade_not_found', async () => {
    await insertOrders(database.db, [
      { externalReference: 'cli-crossed', nextPollAt: past(60) },
      { externalReference: 'cli-gone', nextPollAt: past(30) },
    ])
    answer = (request) =>
      tradeIdOf(request.path) === 'tr_cli-gone'
        ? { status: 404, body: { error: { code: 'not_found', message: 'no such trade' } } }
        : { status: 200, body: tradeRecord({ trade_id: 'tr_cli-crossed', external_reference: 'someone-else', status: 'delivered' }) }
    const once = await cli('reconcile', '--once', '--json')
    expect(JSON.parse(once.stdout)).toMatchObject({ errors: 2, results: { trade_mismatch: 1, not_found: 1, error: 0 } })
    expect((await orderByReference(database.db, 'cli-crossed')).attention).toBe('trade_mismatch')

    const result = await cli('reconcile', '--requeue')
    expect(result.code).toBe(0)
    expect(result.stdout).toBe('cli-crossed: due now (was trade_mismatch)\ncli-gone: due now (was trade_not_found)\n')
    answer = delivered
    await cli('reconcile', '--once')
    for (const reference of ['cli-crossed', 'cli-gone']) {
      expect(await orderByReference(database.db, reference), reference).toMatchObject({ tradeStatus: 'delivered', attention: null })
    }
  })

  it('says so when no order is flagged', async () => {
    await insertOrders(database.db, [{ externalReference: 'cli-a', nextPollAt: past(60) }])
    const result = await cli('reconcile', '--requeue')
    expect([result.code, result.stdout]).toEqual([0, 'no order is flagged for an operator\n'])
  })

  it('exits 1 naming the references it does not know', async () => {
    await insertOrders(database.db, [{ externalReference: 'cli-a', nextPollAt: null }])
    const result = await cli('reconcile', '--requeue', 'cli-a', 'cli-nope')
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('cli-a: due now\n')
    // in the words of every other command that finds no order
    expect(result.stderr).toBe('No order with external reference cli-nope [order_not_found]\n')
    const several = await cli('reconcile', '--requeue', 'cli-nope', 'cli-none')
    expect([several.code, several.stderr]).toEqual([1, 'No order with external references cli-nope, cli-none [order_not_found]\n'])
  })
})

// After a restore from a backup, or a failover to a standby that lagged, the transitions the database lost are on the
// platform only, and each open order waited up to STALE_AFTER_S for its poll; an operator had to name every order
// to `--requeue` (found from outside). `--requeue-open` gives every open order of PARTNER_ENV a poll within --within
// seconds, spread evenly by the database's clock
describe('reconcile --requeue-open', () => {
  const later = new Date(Date.now() + 6 * 3_600_000)
  const ISO = '\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z'

  it('makes the open orders due, leaves the flagged, the due, the leased, the closed and the other environment’s as they are, and the poller heals them', async () => {
    await insertOrders(database.db, [
      { externalReference: 'ro-waiting', nextPollAt: later },
      { externalReference: 'ro-unscheduled', nextPollAt: null },
      { externalReference: 'ro-due', nextPollAt: past(60) },
      { externalReference: 'ro-flagged', nextPollAt: null },
      { externalReference: 'ro-leased', nextPollAt: later },
      { externalReference: 'ro-live', nextPollAt: later },
      { externalReference: 'ro-released', tradeStatus: 'released', nextPollAt: null },
      { externalReference: 'ro-no-trade', tradeId: null, tradeStatus: null, nextPollAt: null },
    ])
    await database.db.updateTable('orders').set({ attention: 'trade_not_found' }).where('externalReference', '=', 'ro-flagged').execute()
    await database.db.updateTable('orders').set({ pollLeaseToken: 'elsewhere', pollLeaseExpiresAt: later }).where('externalReference', '=', 'ro-leased').execute()
    await database.db.updateTable('orders').set({ partnerEnv: 'live' }).where('externalReference', '=', 'ro-live').execute()
    const before = new Map((await database.db.selectFrom('orders').select(['externalReference', 'nextPollAt']).execute()).map((row) => [row.externalReference, row.nextPollAt]))

    const result = await cli('reconcile', '--requeue-open', '--within', '0')
    expect([result.code, result.stderr]).toEqual([0, ''])
    expect(result.stdout).toMatch(new RegExp(
      `^2 open order\\(s\\) due now, from ${ISO} by the database's clock\\n` +
        '1 flagged for an operator left as they are: `reconcile --requeue` clears them\\n$',
    ))
    const after = await database.db.selectFrom('orders').select(['externalReference', 'nextPollAt', 'attention']).orderBy('id').execute()
    for (const row of after) {
      if (row.externalReference === 'ro-waiting' || row.externalReference === 'ro-unscheduled') {
        expect(row.nextPollAt!.getTime(), row.externalReference).toBeLessThanOrEqual(Date.now())
      } else expect(row.nextPollAt, row.externalReference).toEqual(before.get(row.externalReference))
    }
    expect(after.find((row) => row.externalReference === 'ro-flagged')?.attention).toBe('trade_not_found')

    // run again before a poll: nothing waits
    const again = await cli('reconcile', '--requeue-open', '--json')
    expect(JSON.parse(again.stdout)).toMatchObject({ requeued: 0, flagged: 1, withinS: 900 })
    expect((await cli('reconcile', '--requeue-open')).stdout).toBe(
      'no open order waits for its poll past the next 900 s\n1 flagged for an operator left as they are: `reconcile --requeue` clears them\n',
    )

    // the poller's next cycle polls them, with the one due already
    const once = await cli('reconcile', '--once', '--json')
    expect(JSON.parse(once.stdout)).toMatchObject({ claimed: 3, polled: 3 })
    for (const reference of ['ro-waiting', 'ro-unscheduled', 'ro-due']) {
      expect((await orderByReference(database.db, reference)).tradeStatus, reference).toBe('delivered')
    }
  })

  // all due at one moment, a million would keep every order due after it (a webhook asking for a poll now) waiting
  // behind them all, as the claim takes the longest due first (found by a review); spread, one asked for now comes
  // after those due before it only
  it('spreads more open orders than one slice evenly over the window, in the order of their ids, by the database’s clock', async () => {
    const count = 10_050
    await insertOrders(database.db, Array.from({ length: count }, (_, i) => ({ externalReference: `ro-many-${i}`, nextPollAt: later })))
    const result = await cli('reconcile', '--requeue-open', '--within', '600', '--json')
    const answer = JSON.parse(result.stdout)
    expect(answer).toMatchObject({ requeued: count, flagged: 0, withinS: 600 })
    const from = Date.parse(answer.from)
    const due = (await database.db.selectFrom('orders').select(['id', 'nextPollAt']).orderBy('id').execute()).map((row) => row.nextPollAt!.getTime() - from)
    expect(due[0]).toBe(0)
    for (let i = 1; i < due.length; i++) expect(due[i]!, `order ${i}`).toBeGreaterThanOrEqual(due[i - 1]!)
    // evenly: the i-th at 600 s × i / count, to the millisecond a timestamp keeps
    expect(Math.abs(due[count / 2]! - 300_000)).toBeLessThanOrEqual(1)
    expect(due.at(-1)!).toBeLessThan(600_000)
    expect(due.at(-1)!).toBeGreaterThan(599_000)
    // spread within 600 s already: a second run finds none waiting past its own 600 s
    const text = await cli('reconcile', '--requeue-open', '--within', '600')
    expect(text.stdout).toBe('no open order waits for its poll past the next 600 s\n')
    // the rate it prints, as README quotes it
    await insertOrders(database.db, [{ externalReference: 'ro-rate-1', nextPollAt: later }, { externalReference: 'ro-rate-2', nextPollAt: later }])
    const two = await cli('reconcile', '--requeue-open')
    expect(two.stdout).toMatch(new RegExp(`^2 open order\\(s\\) due within the next 900 s, spread evenly \\(about 0\\.0022 a second\\), from ${ISO} by the database's clock\\n$`))
  })

  it('exits 2 for --within without --requeue-open, and for a window past a day', async () => {
    const without = await cli('reconcile', '--once', '--within', '60')
    expect([without.code, without.stderr]).toEqual([2, expect.stringContaining('--within goes with --requeue-open')])
    const long = await cli('reconcile', '--requeue-open', '--within', '86401')
    expect(long.code).toBe(2)
  })
})

// A statement takes at most 65,535 parameters: 70,001 references in one `in` list were refused as "connection
// exception … try again later" (08P01), which no try could pass, and the refusal listed every unknown reference on
// one line of megabytes. The list was also gathered by copying it for each reference: 40,000 took 15 s.
describe('reconcile --requeue with more references than a statement takes', () => {
  it('requeues the orders it knows and names the first 20 it does not, counting the rest', async () => {
    const known = Array.from({ length: 1_000 }, (_, i) => `cli-many-${i}`)
    await insertOrders(database.db, known.map((externalReference) => ({ externalReference, nextPollAt: null })))
    const unknown = Array.from({ length: 69_001 }, (_, i) => `cli-none-${i}`)
    const result = await cli('reconcile', '--requeue', ...unknown.slice(0, 30_000), ...known, ...unknown.slice(30_000))
    expect(result.code).toBe(1)
    expect(result.stdout.split('\n').filter(Boolean)).toHaveLength(1_000)
    expect(result.stdout).toContain('cli-many-999: due now\n')
    expect(result.stderr).toBe(`No order with external references ${unknown.slice(0, 20).join(', ')} and 68,981 more (--json lists them all) [order_not_found]\n`)
    const json = await cli('reconcile', '--requeue', ...known.slice(0, 2), ...unknown.slice(0, 25), '--json')
    expect(JSON.parse(json.stdout)).toMatchObject({ missing: unknown.slice(0, 25) })
  })
})

describe('reconcile arguments', () => {
  it.each([[[]], [['--once', '--report']], [['--report', '--requeue']], [['--requeue', '--requeue-open']]])(
    'exits 2 without exactly one of --once, --report, --requeue, --requeue-open: %j',
    async (args) => {
      const result = await cli('reconcile', ...args)
      expect(result.code).toBe(2)
      expect(result.stderr).toContain('exactly one of --once, --report, --requeue or --requeue-open')
    },
  )

  it.each([['--once'], ['--requeue', 'ref-1']])('exits 2 for --limit beside %j, where it was ignored without a word', async (...args) => {
    const result = await cli('reconcile', ...args, '--limit', '5')
    expect([result.code, result.stdout]).toEqual([2, ''])
    expect(result.stderr).toContain('--limit goes with --report (the runs to show); a cycle claims POLL_BATCH_SIZE orders')
  })

  it.each(['0', '-1', 'ten', '1001', '2.5', '0x10', '1e2', '+5', ' 5'])('exits 2 for --limit %s, in the words of the lists\' --limit', async (limit) => {
    const result = await cli('reconcile', '--report', '--limit', limit)
    expect([result.code, result.stdout]).toEqual([2, ''])
    expect(result.stderr).toContain(`error: option '--limit <n>' argument '${limit}' is invalid. must be a whole number from 1 to 1000 [invalid_arguments]\n`)
  })
})

/** A local URL where nothing listens: a port the system gave out, closed again. */
async function nothingListens(): Promise<string> {
  const listener = createServer()
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve))
  const { port } = listener.address() as { port: number }
  await new Promise((resolve) => listener.close(resolve))
  return `http://127.0.0.1:${port}`
}

describe('reconcile --once with the platform out of reach (the database up)', () => {
  // the cycle's warning once said "the database cannot be reached" for a refused connection to the platform
  it.each([
    ['the platform', async () => ({ PARTNER_API_BASE_URL: await nothingListens() })],
    ['the proxy', async () => ({ PARTNER_API_BASE_URL: server.url, HTTP_PROXY: await nothingListens() })],
  ])('names %s in its log line and in one line of its own, never the database', async (unreached, settings) => {
    await insertOrders(database.db, [{ externalReference: 'cli-unreached', nextPollAt: past(60) }])
    const config = testConfig({ ...(await settings()), POLL_CONCURRENCY: '1' })
    const result = await runCommandWith(['reconcile', '--once'], { config, logger: testLogger([TEST_API_SECRET]), db: database.db })

    expect(result.code).toBe(0)
    expect(result.stdout).toMatch(/^run \d+: claimed 1, polled 1, changed 0, errors 1 \(error 1\)\n$/)
    expect(result.stderr).toMatch(/^first error, order cli-unreached: could not reach the platform at http:\/\/127\.0\.0\.1:\d+\/?: .*ECONNREFUSED.*\n$/)
    if (unreached === 'the proxy') expect(result.stderr).toContain('could not connect to the proxy')
    const line = logEntries().findLast((entry) => entry.msg === 'reconcile cycle done with errors: those orders back off')
    const err = line?.err as { type: string; message: string; kind?: string }
    expect(err).toMatchObject({ type: 'PartnerNotSentError', message: expect.stringContaining('was not sent') })
    expect(err.kind).toBeUndefined()
    expect(JSON.stringify(line)).not.toMatch(/database/i)
    expect(server.requests).toEqual([])
  })

  // the line named the sandbox's URL and ECONNREFUSED alone: nothing said that, with no platform configured, the
  // platform is the sandbox, and that a command run on its own does not start it
  it('in local mode, with the sandbox not running: says the sandbox runs inside `npm start`, on a line of its own', async () => {
    await insertOrders(database.db, [{ externalReference: 'cli-local-unreached', nextPollAt: past(60) }])
    const sandboxUrl = await nothingListens()
    const config = parseConfig({ DATA_DIR: 'memory://', SANDBOX_PORT: new URL(sandboxUrl).port, ADMIN_PORT: '0', POLL_CONCURRENCY: '1' })
    expect(config.partner.mode).toBe('local')
    const result = await runCommandWith(['reconcile', '--once'], { config, logger: testLogger(), db: database.db })

    expect(result.code).toBe(0)
    expect(result.stdout).toMatch(/^run \d+: claimed 1, polled 1, changed 0, errors 1 \(error 1\)\n$/)
    const [first, hint, ...rest] = result.stderr.split('\n')
    expect(first).toMatch(/^first error, order cli-local-unreached: could not reach the platform at http:\/\/127\.0\.0\.1:\d+\/?: .*ECONNREFUSED/)
    expect(hint).toBe(
      'in local mode the platform is the sandbox, which runs inside `npm start` (from memory://): start it, then run this again ' +
        '(or set PARTNER_API_BASE_URL to poll a platform)',
    )
    expect(rest).toEqual([''])
  })
})
