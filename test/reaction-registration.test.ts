// What a fork's registration of a reaction handler may name, and how a wrong one is refused: a pattern is typed
// `trade.<status of the table>` | `trade.*` (a misspelt status does not compile) and checked again when registered, as
// FORWARD_EVENTS is; the built-in handlers' names are reserved; and every refusal carries a code, at the end of the one
// line `serve` and the commands exit 1 with. Found from outside: `reactions.on('trade.fundd', …)` passed tsc and
// the start, and the handler never ran; `forwarder` was taken while FORWARD_URL was unset; the start ended with a
// bare message and no code.
import { describe, expect, it } from 'vitest'
import { AMQP_HANDLER, configuredReactions, FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import type { ReactionEvent, ReactionHandler } from '../src/reactions/reaction-event.js'
import { createReactionRegistry, type ReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ReactionSetupError } from '../src/reactions/reaction-setup-error.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { startTestService } from './helpers/test-service.js'

const handler: ReactionHandler = async () => {}
const KNOWN = 'trade.created, trade.funded, trade.delivered, trade.disputed, trade.cancelled, trade.refunded, trade.released, trade.resolved, or trade.*'

describe("a reaction handler's registration", () => {
  it('refuses a pattern naming a status the status table does not know, and names the ones it knows', () => {
    const reactions = createReactionRegistry()
    // @ts-expect-error: a misspelt status is no pattern: tsc says so where it is written
    expect(() => reactions.on('trade.fundd', 'ship-goods', handler)).toThrow(
      `reaction pattern "trade.fundd" of handler ship-goods matches no event type; the types are ${KNOWN} ` +
        '(add a status the platform sends to the table in src/orders/trade-status.ts first) [reaction_status_unknown]',
    )
    // @ts-expect-error: one of a list, likewise
    expect(() => reactions.on(['trade.funded', 'trade.on_hold'], 'crm', handler)).toThrow(expect.objectContaining({ code: 'reaction_status_unknown' }))
    expect(reactions.names).toEqual([])
    // the statuses of the table, and every transition, are taken
    reactions.on('trade.funded', 'ship-goods', handler).on(['trade.released', 'trade.resolved'], 'crm', handler).on('trade.*', 'ledger', handler)
    expect(reactions.names).toEqual(['crm', 'ledger', 'ship-goods'])
  })

  it('still gives a handler of trade.* the statuses the table does not know, its event typed to take them', async () => {
    const seen: string[] = []
    const reactions = createReactionRegistry().on('trade.*', 'ledger', async (event) => {
      // `to` offers the table's statuses and takes any other the platform sends
      if (event.to === 'funded' || event.to === 'on_hold') seen.push(event.to)
    })
    expect(reactions.handlersFor('trade.on_hold')).toEqual(['ledger'])
    const onHold: ReactionEvent = {
      eventId: '0190c3a2-0000-7000-8000-000000000001',
      type: 'trade.on_hold',
      orderId: 1,
      externalReference: 'order-1',
      tradeId: 'trd_1',
      from: 'funded',
      to: 'on_hold',
      source: 'poll',
      sequence: 3,
      occurredAt: new Date(0),
    }
    await reactions.handler('ledger')!(onHold, { signal: new AbortController().signal, attempt: 1, logger: testLogger() })
    expect(seen).toEqual(['on_hold'])
  })

  it('gives every refusal a code, at the end of its message', () => {
    const reactions = createReactionRegistry().on('trade.funded', 'taken', handler)
    const refusals: [string, () => unknown][] = [
      // @ts-expect-error: not a pattern
      ['reaction_pattern_invalid', () => reactions.on('funded', 'a', handler)],
      ['reaction_pattern_invalid', () => reactions.on([], 'b', handler)],
      ['reaction_name_invalid', () => reactions.on('trade.funded', 'Ship Goods', handler)],
      ['reaction_name_taken', () => reactions.on('trade.funded', 'taken', handler)],
      // @ts-expect-error: not a function
      ['reaction_handler_invalid', () => reactions.on('trade.funded', 'c', 'ship')],
      ['reaction_timeout_invalid', () => reactions.on('trade.funded', 'd', handler, { timeoutMs: 0 })],
    ]
    for (const [code, refused] of refusals) {
      expect(refused).toThrow(ReactionSetupError)
      expect(refused).toThrow(expect.objectContaining({ code, message: expect.stringMatching(new RegExp(` \\[${code}\\]$`)) }))
    }
    expect(reactions.names).toEqual(['taken'])
  })

  it("refuses the built-in handlers' names to the fork's code, whether or not FORWARD_URL and AMQP_URL are set", () => {
    for (const name of [FORWARDER_HANDLER, AMQP_HANDLER]) {
      const register = (reactions: ReactionRegistry) => void reactions.on('trade.funded', name, handler)
      expect(() => configuredReactions(testConfig(), { logger: testLogger(), register, partnerHandlers: false })).toThrow(
        `reaction handler name "${name}" is reserved: it is a built-in handler's (FORWARD_URL, AMQP_URL), whose stream and jobs it would take, set or not; choose another [reaction_name_reserved]`,
      )
    }
    const forwarding = testConfig({ FORWARD_URL: 'http://127.0.0.1:9/hook', FORWARD_SECRET: `whsec_${Buffer.alloc(32, 7).toString('base64')}` })
    const register = (reactions: ReactionRegistry) => void reactions.on('trade.*', FORWARDER_HANDLER, handler)
    expect(() => configuredReactions(forwarding, { logger: testLogger(), register, partnerHandlers: false })).toThrow(
      expect.objectContaining({ code: 'reaction_name_reserved' }),
    )
    // the service's own are registered under them
    expect(configuredReactions(forwarding, { logger: testLogger(), partnerHandlers: false }).names).toEqual([FORWARDER_HANDLER])
  })

  it('ends the start of the service with the coded refusal', async () => {
    const config = testConfig({ PORT: '0', POLL_ENABLED: 'false' })
    const registerReactions = (reactions: ReactionRegistry) =>
      // @ts-expect-error: misspelt, as a fork might
      void reactions.on('trade.fundd', 'ship-goods', handler)
    const logger = testLogger()
    const started = startTestService({ config, logger, registerReactions })
    await expect(started).rejects.toThrow(expect.objectContaining({ code: 'reaction_status_unknown', message: expect.stringMatching(/\[reaction_status_unknown\]$/) }))
  })
})
