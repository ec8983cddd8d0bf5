// A machine whose clock drifted is refused with 401 on every call: the refusal says so, from the platform's
// Date header, through the client, the poller's log line and the CLI. Against the real sandbox, offline.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { type Clock, systemClock } from '../src/clock.js'
import type { CliContext } from '../src/cli/cli-context.js'
import {
  CLOCK_OFFSET_THRESHOLD_S,
  describeClockOffset,
  isClockOffsetTooLarge,
  measureClockOffset,
} from '../src/partner-api/clock-offset.js'
import { PartnerApiError } from '../src/partner-api/partner-api-error.js'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import type { RunningService } from '../src/service.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { scriptedFetch } from './helpers/partner-api-fake-fetch.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'
import { startTestService } from './helpers/test-service.js'

const TEN_MINUTES_MS = 10 * 60_000

/**
 * Runs `call` and gives its answer with the bounds the measured offset must fall in when this machine's clock is
 * off by `offsetS`: the Date header is cut to its second, and the answer read some time after the platform
 * stamped it (seconds, on a loaded machine), which makes a clock behind look that much less behind.
 */
async function measured<T>(offsetS: number, call: () => Promise<T>): Promise<{ answer: T; low: number; high: number }> {
  const started = Date.now()
  const answer = await call()
  const waitedS = Math.ceil((Date.now() - started) / 1000)
  return { answer, low: offsetS - 1 - waitedS, high: offsetS + 1 }
}

const logger = testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])

/** This machine's clock, set wrong by `offsetMs`. */
const clockOff = (offsetMs: number): Clock => ({ now: () => Date.now() + offsetMs, sleep: systemClock.sleep })

/** The error a call rejects with (the test fails when it resolves). */
async function refusal(call: Promise<unknown>): Promise<PartnerApiError> {
  const error = await call.then(
    () => undefined,
    (reason: unknown) => reason,
  )
  expect(error).toBeInstanceOf(PartnerApiError)
  return error as PartnerApiError
}

// a signature is 64 hex digits; none may reach a message
const SIGNATURE = /[0-9a-f]{64}/

// the service's poll interval here: two advances of it span 46 s, within the clock guard's ±30 s from one behind
const POLL_INTERVAL_MS = 23_000
const intervalSleeps = (clock: FakeClock) => clock.sleeps.filter((ms) => ms === POLL_INTERVAL_MS).length

describe('measureClockOffset', () => {
  const now = Date.parse('2026-03-01T12:00:00.300Z')

  it('reads the Date header as seconds the platform is ahead (positive) or behind (negative)', () => {
    expect(measureClockOffset('Sun, 01 Mar 2026 12:06:52 GMT', now)).toBe(412)
    expect(measureClockOffset('Sun, 01 Mar 2026 11:50:00 GMT', now)).toBe(-600)
    // the same second on both sides: no offset (Date cuts to the second, so its middle is compared)
    expect(measureClockOffset('Sun, 01 Mar 2026 12:00:00 GMT', now)).toBe(0)
  })

  it('answers undefined without a readable Date', () => {
    expect(measureClockOffset(null, now)).toBeUndefined()
    expect(measureClockOffset('yesterday-ish', now)).toBeUndefined()
    // not an HTTP-date, though Date.parse reads each as a day in 2001 (a clock 25 years behind)
    for (const garbled of ['1', '0', '-5', 'soon 12', '2026-03-01T12:10:00Z']) {
      expect(measureClockOffset(garbled, now), garbled).toBeUndefined()
    }
  })

  it('reads a four-digit year as written, and nothing more than 68 years off (no clock drifts that far)', () => {
    // Date.parse alone reads year 0000 as 2000: a clock 26 years behind
    expect(measureClockOffset('Sat, 01 Jan 0000 00:00:00 GMT', now)).toBeUndefined()
    expect(measureClockOffset('Sat Jan  1 00:00:00 0000', now)).toBeUndefined()
    // a 1901 or 9999 Date overflowed the run record's integer, and its write failed
    expect(measureClockOffset('Tue, 01 Jan 1901 00:00:00 GMT', now)).toBeUndefined()
    expect(measureClockOffset('Fri, 31 Dec 9999 23:59:59 GMT', now)).toBeUndefined()
    // within the bound either way
    const early = Date.parse('1958-03-01T12:00:00Z')
    expect(measureClockOffset('Sun, 01 Mar 2026 12:00:00 GMT', early)).toBe(2_145_916_801)
    expect(measureClockOffset('Sat, 01 Mar 1958 12:00:00 GMT', now)).toBe(-2_145_916_800)
  })

  it('reads the obsolete forms of an HTTP-date too', () => {
    expect(measureClockOffset('Sunday, 01-Mar-26 12:06:52 GMT', now)).toBe(412)
    expect(measureClockOffset('Sun Mar  1 12:06:52 2026', now)).toBe(412)
  })

  it('says nothing of clocks for a 401 whose Date is garbled, and feeds the gauge nothing', async () => {
    const platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({ status: 401, headers: { date: '1' }, body: { error: { code: 'invalid_signature', message: 'no' } } }),
    })
    try {
      const offsets: number[] = []
      const client = new PartnerApiClient({
        baseUrl: platform.url,
        keyId: TEST_API_KEY_ID,
        secret: TEST_API_SECRET,
        env: 'sandbox',
        kind: 'marketplace',
        timeoutMs: 5_000,
        clock: systemClock,
        logger,
        onClockOffset: (offsetS) => offsets.push(offsetS),
      })
      const error = await refusal(client.getTrade('tr_any'))
      expect(error.status).toBe(401)
      expect(error.clockOffsetS).toBeUndefined()
      expect(error.message).not.toContain('clock')
      expect(offsets).toEqual([])
    } finally {
      await platform.close()
    }
  })

  it(`names an offset only beyond ${CLOCK_OFFSET_THRESHOLD_S} s, either way`, () => {
    expect(isClockOffsetTooLarge(undefined)).toBe(false)
    expect(isClockOffsetTooLarge(CLOCK_OFFSET_THRESHOLD_S)).toBe(false)
    expect(isClockOffsetTooLarge(-CLOCK_OFFSET_THRESHOLD_S)).toBe(false)
    expect(isClockOffsetTooLarge(CLOCK_OFFSET_THRESHOLD_S + 1)).toBe(true)
    expect(isClockOffsetTooLarge(-CLOCK_OFFSET_THRESHOLD_S - 1)).toBe(true)
  })

  it('says which clock is ahead and what to check', () => {
    expect(describeClockOffset(412)).toBe(
      "the platform's clock is 412 s ahead of this machine's (its Date header): requests are signed with " +
        "this machine's time, so check its clock (NTP)",
    )
    expect(describeClockOffset(-75)).toContain("the platform's clock is 75 s behind this machine's")
  })
})

describe('a 401 from the sandbox, through the public client', () => {
  let sandbox: Sandbox
  let baseUrl: string
  const client = (clock: Clock, secret = TEST_API_SECRET) =>
    new PartnerApiClient({
      baseUrl,
      keyId: TEST_API_KEY_ID,
      secret,
      env: 'sandbox',
      kind: 'marketplace',
      timeoutMs: 5_000,
      clock,
      logger,
    })

  beforeAll(async () => {
    sandbox = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      logger,
    })
    baseUrl = await sandbox.listen(0)
  })
  afterAll(async () => {
    await sandbox.close()
  })

  it("names the offset when this machine's clock is 10 minutes behind", async () => {
    const { answer: error, low, high } = await measured(600, () => refusal(client(clockOff(-TEN_MINUTES_MS)).getTrade('tr_any')))
    expect(error.status).toBe(401)
    expect(error.code).toBe('stale_timestamp')
    // 600 s, give or take the second the Date header is cut to and the time the answer took
    expect(error.clockOffsetS).toBeGreaterThanOrEqual(low)
    expect(error.clockOffsetS).toBeLessThanOrEqual(high)
    expect(error.message).toContain(`the platform's clock is ${error.clockOffsetS} s ahead of this machine's`)
    expect(error.message).toContain('check its clock (NTP)')
    expect(error.message).not.toContain(TEST_API_SECRET)
    expect(error.message).not.toMatch(SIGNATURE)
  })

  it("names the offset the other way when this machine's clock is 10 minutes ahead", async () => {
    const { answer: error, low, high } = await measured(-600, () => refusal(client(clockOff(TEN_MINUTES_MS)).getTrade('tr_any')))
    expect(error.code).toBe('stale_timestamp')
    expect(error.clockOffsetS).toBeGreaterThanOrEqual(low)
    expect(error.clockOffsetS).toBeLessThanOrEqual(high)
    expect(error.message).toContain(`the platform's clock is ${-error.clockOffsetS!} s behind this machine's`)
  })

  it('does not mention the clock when the clocks agree and the secret is wrong', async () => {
    const error = await refusal(client(systemClock, 'apisec_not_the_one_0123456789abcdef0123').getTrade('tr_any'))
    expect(error.status).toBe(401)
    expect(error.code).toBe('invalid_signature')
    expect(error.clockOffsetS).toBeUndefined()
    expect(error.message).not.toMatch(/clock/i)
  })

  it('sends its Date from its own clock, the one it checks timestamps on', async () => {
    const clock = new FakeClock(Date.parse('2026-01-01T00:00:00Z'))
    const onFakeTime = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      clock,
      logger,
    })
    try {
      const url = await onFakeTime.listen(0)
      const response = await fetch(`${url}/api/partner/v1/trades/tr_any/`)
      expect(response.status).toBe(401)
      expect(response.headers.get('date')).toBe('Thu, 01 Jan 2026 00:00:00 GMT')
      await response.arrayBuffer()
    } finally {
      await onFakeTime.close()
    }
  })
})

describe('a 401 with a Date header, through a scripted answer', () => {
  const now = Date.parse('2026-03-01T12:00:00.000Z')
  const clock = { now: () => now, sleep: systemClock.sleep }
  const answerWith = (status: number, date: string) =>
    new PartnerApiClient({
      baseUrl: 'http://platform.test',
      keyId: TEST_API_KEY_ID,
      secret: TEST_API_SECRET,
      env: 'sandbox',
      kind: 'marketplace',
      timeoutMs: 5_000,
      clock,
      logger,
      fetch: scriptedFetch([
        { status, body: { error: { code: 'refused', message: 'No' } }, headers: { date } },
      ]).fetch,
    })

  it('does not mention the clock when the offset is within the threshold', async () => {
    const error = await refusal(answerWith(401, 'Sun, 01 Mar 2026 12:00:45 GMT').getTrade('tr_any'))
    expect(error.clockOffsetS).toBeUndefined()
    expect(error.message).toBe('GET /api/partner/v1/trades/tr_any/ answered 401 refused: No')
  })

  it('does not mention the clock for a Date no clock drift explains (the year 9999)', async () => {
    const error = await refusal(answerWith(401, 'Fri, 31 Dec 9999 23:59:59 GMT').getTrade('tr_any'))
    expect(error.clockOffsetS).toBeUndefined()
    expect(error.message).not.toMatch(/clock/i)
  })

  it('does not mention the clock on a refusal other than 401', async () => {
    const error = await refusal(answerWith(403, 'Sun, 01 Mar 2026 12:30:00 GMT').getTrade('tr_any'))
    expect(error.clockOffsetS).toBeUndefined()
    expect(error.message).not.toMatch(/clock/i)
  })
})

describe('reconcile --once and trades against the sandbox with this machine 10 minutes behind', () => {
  let database: TestDatabase
  let sandbox: Sandbox
  let context: CliContext

  beforeAll(async () => {
    database = await createTestDatabase()
    sandbox = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      logger,
    })
    const config = testConfig({ PARTNER_API_BASE_URL: await sandbox.listen(0), POLL_CONCURRENCY: '1' })
    context = { config, logger, db: database.db }
  })
  afterAll(async () => {
    await sandbox.close()
    await database.close()
  })
  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
    await database.db.deleteFrom('reconcileRuns').execute()
  })

  // due by either clock
  const longAgo = () => new Date(Date.now() - 2 * TEN_MINUTES_MS)

  it("reconcile --once claims nothing on a machine 10 minutes behind its database, and says so", async () => {
    // the database keeps the right time: a claim's lease and the next polls would be written 10 minutes early
    await insertOrders(database.db, [{ externalReference: 'skew-a', nextPollAt: longAgo() }])
    const result = await runCommandWith(['reconcile', '--once', '--json'], { ...context, clock: clockOff(-TEN_MINUTES_MS) })
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toMatch(/This machine's clock is (599|600|601) s behind the database's, past the 30 s bound: nothing was claimed .*\[clock_offset\]/)
    expect((await orderByReference(database.db, 'skew-a')).pollLeaseToken).toBeNull()
    expect(await database.db.selectFrom('reconcileRuns').selectAll().execute()).toEqual([])
  })

  it("reconcile --once stops on the 401 and names the offset in its output and its log line, the platform's clock 10 minutes ahead", async () => {
    // this machine and its database agree; the platform's clock runs 10 minutes ahead of both
    const ahead = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      logger,
      clock: clockOff(TEN_MINUTES_MS),
    })
    try {
      const aheadContext = { ...context, config: testConfig({ PARTNER_API_BASE_URL: await ahead.listen(0), POLL_CONCURRENCY: '1' }) }
      await insertOrders(database.db, [
        { externalReference: 'skew-a', nextPollAt: longAgo() },
        { externalReference: 'skew-b', nextPollAt: longAgo() },
      ])
      const logged = logEntries().length
      const { answer: result, low, high } = await measured(600, () => runCommandWith(['reconcile', '--once', '--json'], aheadContext))
      expect(result.code).toBe(1)
      const summary = JSON.parse(result.stdout) as { stoppedReason: string; clockOffsetS: number }
      expect(summary.stoppedReason).toBe('unauthorized')
      expect(summary.clockOffsetS).toBeGreaterThanOrEqual(low)
      expect(summary.clockOffsetS).toBeLessThanOrEqual(high)
      expect(result.stderr).toContain(
        `stopped: the platform answered 401: the platform's clock is ${summary.clockOffsetS} s ahead of this machine's`,
      )
      expect(result.stderr).not.toContain('PARTNER_API_SECRET')
      const line = logEntries()
        .slice(logged)
        .find((entry) => entry.stoppedReason === 'unauthorized')
      expect(line).toMatchObject({ clockOffsetS: summary.clockOffsetS })
      expect(line?.msg).toContain(`the platform's clock is ${summary.clockOffsetS} s ahead of this machine's`)
      // the claims were given back, as on any 401
      expect((await orderByReference(database.db, 'skew-b')).pollLeaseToken).toBeNull()
    } finally {
      await ahead.close()
    }
  })

  it('reconcile --once names the credentials, not the clock, when the clocks agree', async () => {
    await insertOrders(database.db, [{ externalReference: 'skew-c', nextPollAt: longAgo() }])
    const result = await runCommandWith(['reconcile', '--once'], {
      ...context,
      config: testConfig({
        PARTNER_API_BASE_URL: context.config.partner.baseUrl!,
        PARTNER_API_SECRET: 'apisec_not_the_one_0123456789abcdef0123',
      }),
      clock: systemClock,
    })
    expect(result.code).toBe(1)
    expect(result.stderr).toContain('PARTNER_API_KEY_ID / PARTNER_API_SECRET / PARTNER_ENV')
    expect(result.stderr).not.toMatch(/clock/i)
  })

  it('a trades command names the offset', async () => {
    await insertOrders(database.db, [{ externalReference: 'skew-d' }])
    const { answer: result, low, high } = await measured(600, () =>
      runCommandWith(['trades', 'get', 'skew-d'], { ...context, clock: clockOff(-TEN_MINUTES_MS) }),
    )
    expect(result.code).toBe(1)
    expect(result.stderr).toContain('The platform refused (401 stale_timestamp)')
    const named = Number(/the platform's clock is (\d+) s ahead of this machine's/.exec(result.stderr)?.[1])
    expect(named).toBeGreaterThanOrEqual(low)
    expect(named).toBeLessThanOrEqual(high)
    expect(result.stderr).not.toMatch(SIGNATURE)
  })
})


describe('the offset kept: the run record, reconcile --report, the console and /metrics of a service', () => {
  const ADMIN_TOKEN = 'console-token-0123456789abcdef0123'
  // the service opens its own embedded database, or this one on Postgres
  let database: TestDatabase | undefined
  let platform: RecordingServer | undefined
  let service: RunningService | undefined
  beforeAll(async () => {
    if (postgresUrl) database = await createTestDatabase({ kind: 'postgres' })
  })
  afterEach(async () => {
    await service?.stop()
    await platform?.close()
    service = undefined
    platform = undefined
  })
  afterAll(async () => {
    await database?.close()
  })

  it("stores the offset of a refused run, says it in words, and gauges every answer's Date", async () => {
    // 400 ms past a whole second, as a real clock mostly is: the Date header's cut to the second then reads exactly.
    // one poll interval behind the database's clock, so the two advances of it below (23 s each) stay within the
    // 30 s the clock guard allows (src/db/clock-guard.ts): a service's clock far from its database's takes no claim
    const clock = new FakeClock(Math.floor(Date.now() / 1000) * 1000 - POLL_INTERVAL_MS + 400)
    const dateIn = (offsetS: number) => new Date(clock.now() + offsetS * 1000).toUTCString()
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: (request) =>
        request.path.includes('tr_clock-ok')
          ? // answered, with the platform's clock 3 s behind: under the threshold, still gauged
            { status: 200, body: tradeRecord({ trade_id: 'tr_clock-ok', status: 'funded', external_reference: 'clock-ok' }), headers: { date: dateIn(-3) } }
          : // refused, with the platform's clock 10 minutes ahead
            { status: 401, body: { error: { code: 'stale_timestamp', message: 'Timestamp too old' } }, headers: { date: dateIn(600) } },
    })
    const config = testConfig({
      PARTNER_API_BASE_URL: platform.url,
      PORT: '0',
      POLL_INTERVAL_S: String(POLL_INTERVAL_MS / 1000),
      ADMIN_TOKEN,
      ...(database ? { DATABASE_URL: database.url! } : { DATA_DIR: 'memory://' }),
    })
    service = await startTestService({ config, logger, clock })
    await service.ready
    const db = service.database.db
    const scrape = async () => (await fetch(`${service!.adminUrl}/metrics`)).text()
    // no answer read yet: no sample, rather than a made-up 0
    expect(await scrape()).not.toMatch(/^partner_api_clock_offset_seconds /m)
    await eventually(() => intervalSleeps(clock) === 1, 'the first cycle is over')

    await insertOrders(db, [{ externalReference: 'clock-ok', tradeId: 'tr_clock-ok', nextPollAt: new Date(clock.now() - 1_000) }])
    await clock.advance(POLL_INTERVAL_MS)
    await eventually(async () => /^partner_api_clock_offset_seconds -3$/m.test(await scrape()), 'the 200 is gauged')
    // the gauge moves mid-cycle: time moved before the poller sleeps again would never wake it
    await eventually(() => intervalSleeps(clock) === 2, 'the second cycle is over')

    await insertOrders(db, [{ externalReference: 'clock-refused', tradeId: 'tr_clock-refused', nextPollAt: new Date(clock.now() - 1_000) }])
    await clock.advance(POLL_INTERVAL_MS)
    const refused = async () =>
      db.selectFrom('reconcileRuns').selectAll().where('stoppedReason', '=', 'unauthorized').executeTakeFirst()
    await eventually(async () => (await refused())?.finishedAt != null, 'the refused run is recorded')
    expect(await scrape()).toMatch(/^partner_api_clock_offset_seconds 600$/m)
    const run = (await refused())!
    expect(run.clockOffsetS).toBe(600)
    // the run that was answered measured nothing worth keeping
    const others = await db.selectFrom('reconcileRuns').select('clockOffsetS').where('id', '!=', run.id).execute()
    expect(others.length).toBeGreaterThan(0)
    expect(others.every((other) => other.clockOffsetS === null)).toBe(true)

    const words = "the platform's clock is 600 s ahead of this machine's (its Date header)"
    const report = await runCommandWith(['reconcile', '--report'], { config, logger, db })
    expect(report.code).toBe(0)
    expect(report.stdout).toContain(`run ${run.id}: partner api refused our requests (401): ${words}`)
    expect(report.stdout.match(/clock is/g)).toHaveLength(1)
    const json = JSON.parse((await runCommandWith(['reconcile', '--report', '--json'], { config, logger, db })).stdout) as {
      id: number
      clockOffsetS: number | null
    }[]
    expect(json.find((entry) => entry.id === run.id)?.clockOffsetS).toBe(600)

    const consolePage = async (path: string) =>
      (await fetch(`${service!.adminUrl}${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).text()
    // the page escapes the apostrophes
    const escaped = words.replaceAll("'", '&#39;')
    expect(await consolePage('/console/reconcile')).toContain(escaped)
    expect(await consolePage('/console/')).toContain(`Reconcile run ${run.id} was refused by the platform (401): ${escaped}`)
  })
})

describe('reconcile --once refused with a Date no clock drift explains', () => {
  let database: TestDatabase
  let platform: RecordingServer
  beforeAll(async () => {
    database = await createTestDatabase()
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({ status: 401, body: { error: { code: 'stale_timestamp', message: 'Timestamp too old' } }, headers: { date: 'Fri, 31 Dec 9999 23:59:59 GMT' } }),
    })
  })
  afterAll(async () => {
    await platform.close()
    await database.close()
  })

  // the year 9999 overflowed the run record's integer: the cycle failed on its write, with no 401 said, the run
  // stayed `running` for good, and the serve loop skipped its 401 backoff
  it('stops on the 401, says it without a clock, and records the run', async () => {
    await insertOrders(database.db, [{ externalReference: 'year-9999', tradeId: 'tr_year-9999', nextPollAt: new Date(Date.now() - 60_000) }])
    const config = testConfig({ PARTNER_API_BASE_URL: platform.url })
    const result = await runCommandWith(['reconcile', '--once', '--json'], { config, logger, db: database.db })
    expect(result.code).toBe(1)
    expect(result.stderr).toContain('stopped: the platform answered 401')
    expect(result.stderr).not.toMatch(/clock|out of range/i)
    expect(JSON.parse(result.stdout)).toMatchObject({ stoppedReason: 'unauthorized', clockOffsetS: null })
    const runs = await database.db.selectFrom('reconcileRuns').select(['finishedAt', 'stoppedReason', 'clockOffsetS']).execute()
    expect(runs).toEqual([{ finishedAt: expect.any(Date), stoppedReason: 'unauthorized', clockOffsetS: null }])
  })
})
