// The reactions inside `serve`: the composition root registers the forwarder when FORWARD_URL is set, and
// the dispatcher starts once the database is ready and stops with the service.
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import { afterEach, describe, expect, it } from 'vitest'
import { createOrder } from './helpers/orders.js'
import type { RunningService } from '../src/service.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { reactionRecords } from './helpers/reaction-jobs.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

describe('reactions in the service', () => {
  let service: RunningService | undefined
  let receiver: ForwardReceiver | undefined
  afterEach(async () => {
    await service?.stop()
    await receiver?.close()
    service = undefined
    receiver = undefined
  })

  it('forwards a webhook transition to FORWARD_URL with the event id as webhook-id, and stops cleanly', async () => {
    receiver = await startForwardReceiver()
    const secret = `whsec_${randomBytes(32).toString('base64')}`
    rememberSecret(secret.slice('whsec_'.length))
    const config = testConfig({ PORT: '0', POLL_ENABLED: 'false', FORWARD_URL: receiver.url, FORWARD_SECRET: secret })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]) })
    await service.ready
    const { db } = service.database
    // the stream of a handler a later deploy removed: it stays where it stopped, and nothing reads on
    await sql`insert into reaction_streams (handler, position, history_id) values ('retired', '0'::xid8, 0)`.execute(db)
    await createOrder(db, { externalReference: 'svc-forward' })
    const body = JSON.stringify(tradePayload('svc-forward', 'funded'))
    const response = await fetch(`${service.url}${config.webhook.path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': 'dlv-svc-forward', 'x-partner-signature': signBody(body) },
      body,
    })
    expect(response.status).toBe(200)
    await receiver.waitFor(1)
    const event = await db.selectFrom('orderStatusHistory').select(['eventId', 'sequence']).executeTakeFirstOrThrow()
    const [forwarded] = receiver.received
    expect(forwarded!.headers['webhook-id']).toBe(event.eventId)
    expect(JSON.parse(forwarded!.rawBody)).toMatchObject({
      type: 'trade.funded',
      data: { event_id: event.eventId, external_reference: 'svc-forward', from: null, to: 'funded', source: 'webhook', sequence: 1 },
    })
    // the stream records the event as done once its first attempt returned (with its batch: no job row)
    const job = async () => (await reactionRecords(db)).map(({ handler, state }) => ({ handler, state })).find(({ handler }) => handler === 'forwarder')
    for (let i = 0; i < 500 && (await job())?.state !== 'done'; i++) await new Promise((resolve) => setTimeout(resolve, 10))
    expect(await job()).toEqual({ handler: 'forwarder', state: 'done' })
    expect(service.dispatcher?.running).toBe(0)
    const scrape = await (await fetch(`${service.adminUrl}${config.metrics.path}`)).text()
    expect(scrape).toMatch(/^reaction_attempts_total\{handler="forwarder",result="done"\} 1$/m)
    expect(scrape).toMatch(/^reaction_attempts_total\{handler="forwarder",result="failed"\} 0$/m)
    expect(scrape).toMatch(/^reaction_latency_seconds_count\{handler="forwarder"\} 1$/m)
    // the removed handler's unread event is no one's work: it counts neither as pending nor in the age
    expect(scrape).toMatch(/^reaction_jobs_pending 0$/m)
    expect(scrape).toMatch(/^reaction_jobs_failed 0$/m)
    expect(scrape).toMatch(/^reaction_oldest_pending_age_seconds 0$/m)
    await service.stop()
    service = undefined
  })
})
