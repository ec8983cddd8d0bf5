// The project's own tests start the service without the fork's reaction handlers: found from outside, a handler added
// to partner-handlers.ts (README's own example) failed two of them (one expected the built-ins alone for
// trade.funded), and every test that started the service ran the fork's real handlers, with no way out, so a handler
// pointing at a real system got the tests' events. Here partner-handlers.ts registers a handler, as a fork's does.
import { afterEach, describe, expect, it, vi } from 'vitest'
import type { ReactionRegistry } from '../src/reactions/reaction-registry.js'
import type { RunningService } from '../src/service.js'
import { configuredReactions } from '../src/reactions/configured-reactions.js'
import { testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const forkCalls = vi.hoisted(() => [] as string[])
vi.mock('../src/reactions/partner-handlers.js', () => ({
  registerPartnerHandlers: (reactions: ReactionRegistry) =>
    void reactions.on('trade.*', 'fork-ledger', async (event) => {
      forkCalls.push(event.eventId)
    }),
}))

describe("the fork's reaction handlers in the project's tests", () => {
  let service: RunningService | undefined
  afterEach(async () => {
    await service?.stop()
    service = undefined
    forkCalls.length = 0
  })

  it('are registered by the service as `serve` runs it, and left out when asked', () => {
    const config = testConfig()
    expect(configuredReactions(config, { logger: testLogger() }).names).toEqual(['fork-ledger'])
    expect(configuredReactions(config, { logger: testLogger(), partnerHandlers: false }).names).toEqual([])
  })

  const funded = async (running: RunningService, reference: string) => {
    await createOrder(running.database.db, { externalReference: reference })
    const body = JSON.stringify(tradePayload(reference, 'funded'))
    const answer = await fetch(`${running.url}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `dlv-${reference}`, 'x-partner-signature': signBody(body) },
      body,
    })
    expect(answer.status).toBe(200)
  }
  const streams = async (running: RunningService) =>
    (await running.database.db.selectFrom('reactionStreams').select('handler').execute()).map(({ handler }) => handler)

  it('are left out of a service the test helper starts: no stream, no call', async () => {
    service = await startTestService({ config: testConfig({ PORT: '0', POLL_ENABLED: 'false' }), logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]) })
    await service.ready
    await funded(service, 'left-out')
    expect(await streams(service)).not.toContain('fork-ledger')
    await service.stop()
    service = undefined
    expect(forkCalls).toEqual([])
  })

  it('run in a service a test starts with partnerHandlers: true', async () => {
    service = await startTestService({
      config: testConfig({ PORT: '0', POLL_ENABLED: 'false' }),
      logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
      partnerHandlers: true,
    })
    await service.ready
    await funded(service, 'turned-on')
    await eventually(() => forkCalls.length === 1, "the fork's handler ran")
    expect(await streams(service)).toContain('fork-ledger')
  })
})
