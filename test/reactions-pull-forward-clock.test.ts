// The retries an outage left are pulled forward to the database's time when the replica's clock is ahead of it
// (src/reactions/reaction-job.repository.ts, pullForwardJobs). Pulled forward to the replica's own "now", they were
// due that much later for every replica on the database's clock, and those whose backoff ended sooner than that were
// not moved at all: a replica whose clock stepped an hour ahead while its handler's call was at the receiver pulled
// forward nothing when that call succeeded (every backoff here ends within the hour), and the outage's retries waited
// out their backoff. The service runs on the machine's clock stepped by the test, its timers the machine's.
import { randomBytes } from 'node:crypto'
import { type Kysely, sql } from 'kysely'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import type { RunningService } from '../src/service.js'
import { SteppedClock } from './helpers/fake-clock.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { logEntries, rememberSecret, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const HOUR_MS = 3_600_000
// the first retry waits 300-600 s: well within the hour the clock steps
const BACKOFF_BASE_S = 600

const kinds = postgresUrl ? (['pglite', 'postgres'] as const) : (['pglite'] as const)

describe.each(kinds)('pulling an outage’s retries forward on a replica whose clock is ahead (%s)', (kind) => {
  let database: TestDatabase | undefined
  let service: RunningService | undefined
  let receiver: ForwardReceiver | undefined
  beforeEach(async () => {
    if (kind === 'postgres') database = await createTestDatabase({ kind: 'postgres' })
  })
  afterEach(async () => {
    await service?.stop()
    await receiver?.close()
    service = undefined
    receiver = undefined
    await database?.close()
    database = undefined
  })

  const databaseNow = async (db: Kysely<Database>) => {
    const { rows } = await sql<{ now: Date }>`select statement_timestamp() as now`.execute(db)
    return new Date(rows[0]!.now).getTime()
  }

  it("makes them due at the database's time when its clock stepped an hour ahead while the call that succeeds was at the receiver", async () => {
    const clock = new SteppedClock()
    // the two orders' forwards fail as the receiver's backend is away (503); the third's is held, then answered 204
    let releaseBack!: () => void
    const back = new Promise<void>((resolve) => (releaseBack = resolve))
    receiver = await startForwardReceiver((request) => {
      const reference = (JSON.parse(request.rawBody) as { data: { external_reference: string } }).data.external_reference
      return reference === 'back-c' ? { status: 204, when: back } : 503
    })
    const secret = `whsec_${randomBytes(32).toString('base64')}`
    rememberSecret(secret.slice('whsec_'.length))
    const config = testConfig({
      PORT: '0',
      FORWARD_URL: receiver.url,
      FORWARD_SECRET: secret,
      REACTION_BACKOFF_BASE_S: String(BACKOFF_BASE_S),
      ...(database ? { DATABASE_URL: database.url! } : {}),
    })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]), clock })
    await service.ready
    const running = service
    const { db } = running.database
    const send = async (reference: string) => {
      const body = JSON.stringify(tradePayload(reference, 'funded'))
      const response = await fetch(`${running.url}${config.webhook.path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `dlv-${reference}`, 'x-partner-signature': signBody(body) },
        body,
      })
      expect(response.status).toBe(200)
    }
    const jobsOf = (references: readonly string[]) =>
      db
        .selectFrom('reactionJobs as job')
        .innerJoin('orderStatusHistory as event', 'event.eventId', 'job.eventId')
        .select(['event.externalReference', 'job.state', 'job.attempts', 'job.runAt'])
        .where('job.handler', '=', 'forwarder')
        .where('event.externalReference', 'in', [...references])
        .execute()

    for (const reference of ['away-a', 'away-b', 'back-c']) await createOrder(db, { externalReference: reference })
    await send('away-a')
    await send('away-b')
    await eventually(async () => {
      const jobs = await jobsOf(['away-a', 'away-b'])
      return jobs.length === 2 && jobs.every((job) => job.state === 'pending' && job.attempts === 1)
    }, 'both forwards failed once and back off')
    const backedOff = await jobsOf(['away-a', 'away-b'])
    const failedAt = await databaseNow(db)
    for (const job of backedOff) expect(new Date(job.runAt).getTime()).toBeGreaterThan(failedAt + (BACKOFF_BASE_S / 2) * 1000 - 5_000)

    // the receiver's backend is back: the third order's forward is at the receiver when the clock steps an hour ahead
    await send('back-c')
    await receiver.waitFor(3)
    clock.stepMs = HOUR_MS
    const before = await databaseNow(db)
    releaseBack()

    await eventually(async () => {
      const jobs = await jobsOf(['away-a', 'away-b'])
      return jobs.every((job) => new Date(job.runAt).getTime() <= before + 60_000)
    }, "the outage's retries are due at the database's time")
    const after = await databaseNow(db)
    for (const job of await jobsOf(['away-a', 'away-b'])) {
      expect(job.state).toBe('pending')
      expect(new Date(job.runAt).getTime()).toBeGreaterThanOrEqual(before)
      expect(new Date(job.runAt).getTime()).toBeLessThanOrEqual(after)
    }
    expect(logEntries().filter((entry) => entry.msg === 'reaction handler succeeds again after failing: its waiting retries are due now' && entry.jobs === 2)).not.toHaveLength(0)
  })
})
