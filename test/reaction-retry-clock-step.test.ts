// A reaction already running when this machine's clock steps away from the database's writes its outcome by the
// database's time (src/db/clock-guard.ts, timeToWrite): its retry is due after its backoff, not a day late (a clock a
// day ahead) nor at once (a day behind). Both write-backs are shown: a stream's first attempt handed off to its job
// row, and the job loop's retry. The clock here is the machine's wall clock stepped by a test's offset, its timers
// the machine's, as NTP or an operator stepping a clock leaves them.
import { randomBytes } from 'node:crypto'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { RunningService } from '../src/service.js'
import { runCommand } from './helpers/cli-in-process.js'
import { SteppedClock } from './helpers/fake-clock.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const DAY_MS = 86_400_000
// the first retry waits between half and all of it (equal jitter): a window far from a day either way
const BACKOFF_BASE_S = 60

const kinds = postgresUrl ? (['pglite', 'postgres'] as const) : (['pglite'] as const)

interface ListedJob {
  id: string
  state: string
  attempts: number
  runAt: string
  lastError: string | null
}

describe.each(kinds)('a reaction running when the clock steps (%s)', (kind) => {
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

  for (const [side, stepMs] of [
    ['ahead', DAY_MS],
    ['behind', -DAY_MS],
  ] as const) {
    it(`writes its retry due after its backoff by the database's time when the clock stepped a day ${side} meanwhile`, async () => {
      const clock = new SteppedClock()
      // each forward is held until the test lets it go, then answered 503 (a retry)
      const releases: (() => void)[] = []
      receiver = await startForwardReceiver(() => ({ status: 503, when: new Promise<void>((resolve) => releases.push(resolve)) }))
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
      const jobs = async () => JSON.parse((await runCommand(['reactions', 'list', '--handler', 'forwarder', '--json'], db, config)).stdout) as ListedJob[]

      await createOrder(db, { externalReference: 'stepped-1' })
      const body = JSON.stringify(tradePayload('stepped-1', 'funded'))
      const response = await fetch(`${running.url}${config.webhook.path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `dlv-stepped-${side}`, 'x-partner-signature': signBody(body) },
        body,
      })
      expect(response.status).toBe(200)

      // the first attempt runs on the stream, is handed off to a running job row, and the clock steps while it runs
      await receiver.waitFor(1)
      await eventually(async () => (await jobs()).some((job) => job.state === 'running'), 'the forward is handed off to its job row')
      clock.stepMs = stepMs
      const firstFailedAt = Date.now()
      releases.shift()!()
      await eventually(async () => (await jobs()).some((job) => job.state === 'pending' && job.attempts === 1), 'the first retry is written')
      const [first] = await jobs()
      expect(first!.lastError).toContain('503')
      // due after its backoff (30-60 s) by the database's clock: not a day late, not already due
      expect(new Date(first!.runAt).getTime()).toBeGreaterThan(firstFailedAt + (BACKOFF_BASE_S / 2) * 1000 - 5_000)
      expect(new Date(first!.runAt).getTime()).toBeLessThan(Date.now() + BACKOFF_BASE_S * 1000 + 5_000)

      // the clock is set right; an operator runs the job now; the job loop claims it, and the clock steps while it runs
      clock.stepMs = 0
      await runCommand(['reactions', 'retry', first!.id], db, config)
      running.dispatcher?.wake()
      await receiver.waitFor(2)
      clock.stepMs = stepMs
      const secondFailedAt = Date.now()
      releases.shift()!()
      await eventually(
        async () => (await jobs()).some((job) => job.state === 'pending' && job.attempts === 1 && new Date(job.runAt).getTime() !== new Date(first!.runAt).getTime()),
        'the second retry is written',
      )
      const [second] = await jobs()
      expect(second!.id).toBe(first!.id)
      expect(new Date(second!.runAt).getTime()).toBeGreaterThan(secondFailedAt + (BACKOFF_BASE_S / 2) * 1000 - 5_000)
      expect(new Date(second!.runAt).getTime()).toBeLessThan(Date.now() + BACKOFF_BASE_S * 1000 + 5_000)
      // and nothing more runs while the clock stays off (the guard): the stream's lease is given back
      await eventually(
        async () => (await db.selectFrom('reactionStreams').select('leaseToken').where('handler', '=', 'forwarder').executeTakeFirstOrThrow()).leaseToken === null,
        'the stream lease is given back',
      )
      expect(receiver.received).toHaveLength(2)
    })
  }
})
