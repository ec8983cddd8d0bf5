// YOUR reaction handlers' tests: where a fork tests what it registers in src/reactions/partner-handlers.ts (README,
// "Reactions", "Testing your handlers"). The project's own tests start the service without these handlers
// (startTestService's `partnerHandlers: false`); a test here turns them on, so point your handlers' settings at test
// doubles in its config (testConfig), never at a real system.
import { afterEach, describe, expect, it } from 'vitest'
import { configuredReactions } from '../src/reactions/configured-reactions.js'
import type { ReactionEvent, ReactionHandler } from '../src/reactions/reaction-event.js'
import type { RunningService } from '../src/service.js'
import { testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

describe('the partner handlers', () => {
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    service = undefined
  })

  it('register as written: patterns of known statuses, free names, timeouts within the lease', () => {
    // a misspelt status, a taken or reserved name, a timeout past REACTION_LEASE_S is refused here with its code
    const reactions = configuredReactions(testConfig(), { logger: testLogger(), partnerHandlers: true })
    for (const name of reactions.names) expect(reactions.typesOf(name)).toMatch(/^trade\./)
  })

  // An example to copy for a handler of your own: a handler made by a factory that takes its system (here a fake
  // shipping client that refuses nothing and counts), run by the service on a signed webhook's transition. Register
  // yours in partner-handlers.ts and start the service with `partnerHandlers: true`; `registerReactions` stands in
  // for it here, since the file you fork registers nothing.
  const shipGoods =
    (shipping: { create(order: string, idempotencyKey: string, signal: AbortSignal): Promise<void> }): ReactionHandler =>
    async (event, { signal }) => {
      await shipping.create(event.externalReference, event.eventId, signal)
    }

  it('example: ship-goods runs once for a funded order, keyed on the event id', async () => {
    const shipments = new Map<string, string>()
    const calls: ReactionEvent[] = []
    const shipping = {
      async create(order: string, idempotencyKey: string) {
        // the other system's side of at-least-once: a second request with the same key does nothing
        if (!shipments.has(idempotencyKey)) shipments.set(idempotencyKey, order)
      },
    }
    const config = testConfig({ PORT: '0', POLL_ENABLED: 'false' })
    service = await startTestService({
      config,
      logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
      partnerHandlers: true,
      registerReactions: (reactions) =>
        void reactions.on(
          'trade.funded',
          'example-ship-goods',
          async (event, context) => {
            calls.push(event)
            await shipGoods(shipping)(event, context)
          },
          { timeoutMs: 10_000 },
        ),
    })
    await service.ready
    await createOrder(service.database.db, { externalReference: 'example-order' })
    const body = JSON.stringify(tradePayload('example-order', 'funded'))
    const answer = await fetch(`${service.url}${config.webhook.path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': 'dlv-example-order', 'x-partner-signature': signBody(body) },
      body,
    })
    expect(answer.status).toBe(200)
    await eventually(() => calls.length === 1, 'the handler ran')
    expect(calls[0]).toMatchObject({ type: 'trade.funded', externalReference: 'example-order', from: null, to: 'funded' })
    expect([...shipments]).toEqual([[calls[0]!.eventId, 'example-order']])
  })
})
