import { sign as octokitSign } from '@octokit/webhooks-methods'
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { createEventHandlers, type EventHandler, type EventName } from '../src/webhooks/event-handlers.js'
import { signWebhookBody, verifySignature } from '../src/webhooks/verify-signature.js'
import { testLogger } from './helpers/log-sink.js'
import { TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'
import { sendWebhook } from './helpers/webhook-delivery.js'

const config = testConfig()

describe('an event handler registry', () => {
  const calls: string[] = []
  const recording =
    (name: string): EventHandler =>
    async ({ eventType }) => {
      calls.push(`${name}:${eventType}`)
      return 'ignored'
    }

  it('runs a family handler for every event of the family and a named one for its type only, in order', async () => {
    const events = createEventHandlers()
    events.on('seller', recording('family'))
    events.on('seller.approved', recording('approved'))
    events.on('buyer', recording('buyer'))
    calls.length = 0
    for (const eventType of ['seller.approved', 'seller.verified', 'buyer.verified', 'trade.funded']) {
      for (const handler of events.handlersFor(eventType)) await handler({ eventType } as Parameters<EventHandler>[0])
    }
    expect(calls).toEqual(['family:seller.approved', 'approved:seller.approved', 'family:seller.verified', 'buyer:buyer.verified'])
  })

  it('refuses a kind that is not a seller or buyer event (trade events go through the status model)', () => {
    const events = createEventHandlers()
    expect(() => events.on('trade.funded' as EventName, recording('trade'))).toThrow(TypeError)
    expect(events.handlersFor('trade.funded')).toEqual([])
  })
})

describe('event handlers given to the app', () => {
  const database = useTestDatabase()
  const sellerEvent = (id: string) => `{"event":"seller.verified","seller_id":"${id}","status":"verified"}`
  const storedOutcome = async (deliveryId: string) =>
    (
      await database.db
        .selectFrom('webhookDeliveries')
        .select('outcome')
        .where('deliveryId', '=', deliveryId)
        .executeTakeFirstOrThrow()
    ).outcome
  const appWith = (register?: (events: ReturnType<typeof createEventHandlers>) => void): App => {
    const eventHandlers = createEventHandlers()
    register?.(eventHandlers)
    return createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock, eventHandlers })
  }

  it('stores the handler’s answer as the outcome, and an app without handlers is not affected by another’s', async () => {
    const seen: string[] = []
    const handled = appWith((events) =>
      events.on('seller.verified', async ({ deliveryId, body }) => {
        seen.push(`${deliveryId}:${String(body.seller_id)}`)
        return 'applied'
      }),
    )
    const plain = appWith()
    expect((await sendWebhook(handled, { body: sellerEvent('s-1'), deliveryId: 'dlv-handled' })).status).toBe(200)
    expect((await sendWebhook(plain, { body: sellerEvent('s-2'), deliveryId: 'dlv-plain' })).status).toBe(200)
    expect(seen).toEqual(['dlv-handled:s-1'])
    expect(await storedOutcome('dlv-handled')).toBe('applied')
    expect(await storedOutcome('dlv-plain')).toBe('ignored')
  })

  it('answers a handler’s failure 500 event_handler_failed, keeps the delivery as ignored and does not run it again on a retry', async () => {
    let runs = 0
    const app = appWith((events) =>
      events.on('seller', async () => {
        runs += 1
        // a database error inside a handler is still the handler's failure, not an outage (no 503)
        throw Object.assign(new Error('connection terminated'), { code: '08006' })
      }),
    )
    const body = sellerEvent('s-3')
    const first = await sendWebhook(app, { body, deliveryId: 'dlv-failing' })
    expect(first.status).toBe(500)
    expect(first.body).toEqual({ error: { code: 'event_handler_failed', message: 'The handler for seller.verified failed' } })
    expect(await storedOutcome('dlv-failing')).toBe('ignored')
    const retry = await sendWebhook(app, { body, deliveryId: 'dlv-failing' })
    expect(retry.status).toBe(200)
    expect(retry.body).toEqual({ received: true, duplicate: true })
    expect(runs).toBe(1)
    // the platform's retry under a fresh id (its ids are per attempt): the same body, stored and run again, where a
    // body no handler takes would be a replay, not stored (migrations/0017)
    expect((await sendWebhook(app, { body, deliveryId: 'dlv-failing-2' })).status).toBe(500)
    expect(runs).toBe(2)
    expect(await storedOutcome('dlv-failing-2')).toBe('ignored')
  })
})

describe('signWebhookBody', () => {
  it('makes the header verifySignature accepts, the same as an independent signer', async () => {
    const body = Buffer.from('{"trade_id":"trd_1","status":"funded"}')
    const header = signWebhookBody(TEST_WEBHOOK_SECRET, body)
    expect(header).toBe(await octokitSign(TEST_WEBHOOK_SECRET, body.toString()))
    expect(verifySignature([TEST_WEBHOOK_SECRET], body, header)).toBe(true)
    expect(verifySignature(['another secret'], body, header)).toBe(false)
  })
})
