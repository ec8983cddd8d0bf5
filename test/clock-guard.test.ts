// A replica whose clock is far from the database's takes no lease and writes no due time by it (src/db/clock-guard.ts):
// the poller claims nothing, the reaction dispatcher claims no job and takes no stream lease, one error line says so
// and clock_offset_refused_total counts it, webhooks are still received; once the clock is right they take work again.
import { randomBytes } from 'node:crypto'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Config } from '../src/config.js'
import type { RunningService } from '../src/service.js'
import { FakeClock } from './helpers/fake-clock.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { logEntries, rememberSecret, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { eventually, pollerSleeps, SERVICE_POLL_INTERVAL_MS } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const DAY_MS = 86_400_000
const OFF_LINE = /^this machine's clock is (\d+) s (ahead of|behind) the database's, past the 30 s bound/
const BACK_LINE = /clock is back within the bound of the database's/

const kinds = postgresUrl ? (['pglite', 'postgres'] as const) : (['pglite'] as const)

describe.each(kinds)('the clock guard (%s)', (kind) => {
  let database: TestDatabase | undefined
  let service: RunningService | undefined
  let platform: RecordingServer | undefined
  let receiver: ForwardReceiver | undefined
  beforeEach(async () => {
    if (kind === 'postgres') database = await createTestDatabase({ kind: 'postgres' })
  })
  afterEach(async () => {
    await service?.stop()
    await platform?.close()
    await receiver?.close()
    service = undefined
    platform = undefined
    receiver = undefined
    await database?.close()
    database = undefined
  })

  const start = async (clock: FakeClock) => {
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({ status: 200, body: tradeRecord({ trade_id: 'tr_guard-1', status: 'delivered', external_reference: 'guard-1' }) }),
    })
    receiver = await startForwardReceiver()
    const secret = `whsec_${randomBytes(32).toString('base64')}`
    rememberSecret(secret.slice('whsec_'.length))
    const config = testConfig({
      PORT: '0',
      PARTNER_API_BASE_URL: platform.url,
      POLL_INTERVAL_S: String(SERVICE_POLL_INTERVAL_MS / 1000),
      FORWARD_URL: receiver.url,
      FORWARD_SECRET: secret,
      ...(database ? { DATABASE_URL: database.url! } : {}),
    })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]), clock })
    await service.ready
    return { config, running: service }
  }
  const scrape = async (running: RunningService) => (await fetch(`${running.adminUrl}/metrics`)).text()
  const refused = (metrics: string, loop: string) => Number(new RegExp(`^clock_offset_refused_total\\{loop="${loop}"\\} (\\d+)$`, 'm').exec(metrics)?.[1])
  const offLines = () => logEntries().filter((entry) => OFF_LINE.test(String(entry.msg)))

  /** An order due 90 s ago by `clock`, and a webhook for another order: the delivery's status is returned. */
  async function seedAndDeliver(running: RunningService, config: Config, clock: FakeClock, deliveryId: string): Promise<number> {
    const { db } = running.database
    await insertOrders(db, [{ externalReference: 'guard-1', tradeId: 'tr_guard-1', nextPollAt: new Date(clock.now() - 90_000) }])
    await createOrder(db, { externalReference: 'guard-hook' })
    const body = JSON.stringify(tradePayload('guard-hook', 'funded'))
    const response = await fetch(`${running.url}${config.webhook.path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': deliveryId, 'x-partner-signature': signBody(body) },
      body,
    })
    return response.status
  }

  for (const [side, offsetMs] of [
    ['ahead of', DAY_MS],
    ['behind', -DAY_MS],
  ] as const) {
    it(`takes no lease while this clock is a day ${side} the database's, and still receives webhooks`, async () => {
      const before = offLines().length
      const clock = new FakeClock(Date.now() + offsetMs)
      const { config, running } = await start(clock)
      const { db } = running.database
      const deliveryId = `dlv-guard-${offsetMs > 0 ? 'ahead' : 'behind'}`
      expect(await seedAndDeliver(running, config, clock, deliveryId)).toBe(200)
      if (offsetMs > 0) {
        // the webhook's move is dated by the database's clock, not a day ahead: the order's next poll comes when it
        // should (it was a day late, and nothing polled the order until then)
        const moved = await orderByReference(db, 'guard-hook')
        expect(moved.tradeStatus).toBe('funded')
        expect(moved.statusChangedAt!.getTime()).toBeLessThanOrEqual(Date.now())
        expect(moved.nextPollAt!.getTime()).toBeLessThan(Date.now() + DAY_MS / 2)
        const delivery = await db.selectFrom('webhookDeliveries').select('receivedAt').where('deliveryId', '=', deliveryId).executeTakeFirstOrThrow()
        expect(delivery.receivedAt.getTime()).toBeLessThanOrEqual(Date.now())
      }
      // the first cycle was refused, and the poller sleeps its interval; a second one is refused too
      await eventually(() => pollerSleeps(clock) >= 1, 'the poller sleeps')
      await clock.advance(SERVICE_POLL_INTERVAL_MS)
      await eventually(() => pollerSleeps(clock) >= 2, 'the poller sleeps again')
      running.dispatcher?.wake()
      await eventually(async () => refused(await scrape(running), 'reaction_streams') >= 1, 'a stream read is refused')
      const metrics = await scrape(running)
      expect(refused(metrics, 'poller')).toBeGreaterThanOrEqual(2)
      expect(refused(metrics, 'reaction_jobs')).toBeGreaterThanOrEqual(1)

      expect(platform!.requests).toHaveLength(0)
      const order = await orderByReference(db, 'guard-1')
      expect(order.pollLeaseExpiresAt).toBeNull()
      expect(order.nextPollAt?.getTime()).toBe(clock.now() - SERVICE_POLL_INTERVAL_MS - 90_000)
      const streams = await db.selectFrom('reactionStreams').select(['handler', 'leaseToken', 'leaseExpiresAt']).execute()
      expect(streams).toEqual([{ handler: 'forwarder', leaseToken: null, leaseExpiresAt: null }])
      expect(await db.selectFrom('reactionJobs').select('id').execute()).toEqual([])
      expect(await db.selectFrom('reconcileRuns').select('id').execute()).toEqual([])
      expect(receiver!.received).toHaveLength(0)
      // said once, with the offset and the remedy
      const lines = offLines().slice(before)
      expect(lines).toHaveLength(1)
      expect(lines[0]!.level).toBe(50)
      expect(String(lines[0]!.msg)).toContain(side)
      expect(String(lines[0]!.msg)).toContain("fix this machine's clock")
      expect(Math.abs(Number(lines[0]!.offsetS) + offsetMs / 1000)).toBeLessThan(120)
    })
  }

  it('takes work again by itself once the clock is set right', async () => {
    const clock = new FakeClock(Date.now() - DAY_MS)
    const { config, running } = await start(clock)
    const { db } = running.database
    expect(await seedAndDeliver(running, config, clock, 'dlv-guard-right')).toBe(200)
    await eventually(() => pollerSleeps(clock) >= 1, 'the poller sleeps')
    expect(platform!.requests).toHaveLength(0)
    expect(receiver!.received).toHaveLength(0)

    // NTP steps the clock to the database's: the poller's sleep ends, the guard measures again at once (a step)
    // and it goes on with the real time from there, as a clock set right does: a fake clock that stood still would fall
    // past the bound again after 30 s of a loaded machine
    const followRealTime = () => clock.advance(Math.max(0, Date.now() - clock.now()))
    await followRealTime()
    running.dispatcher?.wake()
    await eventually(
      async () => {
        await followRealTime()
        return (await orderByReference(db, 'guard-1')).tradeStatus === 'delivered'
      },
      'the order is polled',
      120_000,
    )
    await receiver!.waitFor(1)
    expect(platform!.requests.map((request) => request.path)).toContain('/api/partner/v1/trades/tr_guard-1/')
    expect(logEntries().some((entry) => BACK_LINE.test(String(entry.msg)))).toBe(true)
  })
})
