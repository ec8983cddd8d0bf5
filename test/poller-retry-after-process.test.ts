// A platform that asks for an absurd wait (Postgres): the compiled `reconcile --once` against a local platform
// whose every GET is answered 429 with a Retry-After of centuries, or of more seconds than a date can hold. The
// poller waits out a Retry-After, but no longer than its error backoff's cap (1 h): a platform that misstates
// it must not put an order off the schedule for good, where no flag, gauge or alert would show it, and a
// Retry-After no date can hold must not fail the cycle.
import { rmSync } from 'node:fs'
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest'
import { DEFAULT_BACKOFF } from '../src/reconcile/backoff-delay.js'
import { runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

describePostgres('a Retry-After the poller cannot honour as given (Postgres)', () => {
  let database: TestDatabase
  let platform: RecordingServer
  let retryAfter = ''
  const dataDir = migratedDataDir('retry-after-')

  beforeAll(async () => {
    database = await createTestDatabase()
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({
        status: 429,
        headers: { 'retry-after': retryAfter },
        body: { error: { code: 'rate_limited', message: 'slow down' } },
      }),
    })
  })
  afterAll(async () => {
    await platform.close()
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })
  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
    await database.db.deleteFrom('reconcileRuns').execute()
  })

  const reconcileOnce = () =>
    runCli(
      ['reconcile', '--once', '--json'],
      {
        DATABASE_URL: database.url!,
        DATA_DIR: dataDir,
        PARTNER_API_BASE_URL: platform.url,
        PARTNER_API_KEY_ID: TEST_API_KEY_ID,
        PARTNER_API_SECRET: TEST_API_SECRET,
        WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
        POLL_CONCURRENCY: '1',
      },
    )

  it.each([
    ['3,000 years in seconds', '99999999999'],
    ['a date in the year 9999', 'Fri, 31 Dec 9999 23:59:59 GMT'],
    ['more seconds than a date holds', '9'.repeat(30)],
  ])('puts the orders off no longer than the backoff cap for a Retry-After of %s', async (_, value) => {
    retryAfter = value
    const dueAt = new Date(Date.now() - 60_000)
    await insertOrders(database.db, [
      { externalReference: 'ra-polled', nextPollAt: dueAt },
      { externalReference: 'ra-untried', nextPollAt: new Date(dueAt.getTime() + 1) },
    ])
    const startedAt = Date.now()
    const result = await reconcileOnce()
    const finishedAt = Date.now()
    expect(result.stderr).not.toMatch(/\n\s+at /)
    expect(result.code, result.stderr).toBe(1)
    const summary = JSON.parse(result.stdout)
    expect(summary).toMatchObject({ claimed: 2, polled: 1, errors: 1, stoppedReason: 'throttled', released: 1 })
    const capMs = DEFAULT_BACKOFF.capS * 1000
    expect(Date.parse(summary.throttledUntil)).toBeLessThanOrEqual(finishedAt + capMs)

    const orders = await database.db
      .selectFrom('orders')
      .select(['externalReference', 'nextPollAt', 'pollLeaseToken'])
      .orderBy('externalReference')
      .execute()
    expect(orders.map((order) => order.externalReference)).toEqual(['ra-polled', 'ra-untried'])
    for (const order of orders) {
      expect(order.pollLeaseToken).toBeNull()
      const nextPollAt = new Date(order.nextPollAt!).getTime()
      // not before the cap (the platform did ask for longer), and not after it
      expect(nextPollAt).toBeGreaterThanOrEqual(startedAt + capMs - 1_000)
      expect(nextPollAt).toBeLessThanOrEqual(finishedAt + capMs)
    }
    const runs = await database.db.selectFrom('reconcileRuns').select(['finishedAt', 'stoppedReason']).execute()
    expect(runs).toHaveLength(1)
    expect(runs[0]!.finishedAt).not.toBeNull()
    expect(runs[0]!.stoppedReason).toBe('throttled')
  })
})
