// The sandbox's injected faults repeat for a seed whatever order the events reach its webhook dispatcher in:
// the demo runs fifty trades at once, and the order their events come in differs from run to run.
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type Faults, WebhookDispatcher } from '../src/sandbox/webhook-dispatcher.js'
import { testLogger } from './helpers/log-sink.js'

const FAULTS: Faults = { dropRate: 0.3, duplicateRate: 0.3, reorderRate: 0, delayRate: 0, delayMs: 0, seed: 7 }
const SELLERS = Array.from({ length: 60 }, (_, i) => `s-${i}`)

/** Each seller's event's attempts, as `result` words in attempt order, for the events sent in `order`. */
async function faultsBySeller(order: readonly string[], faults: Faults = FAULTS): Promise<Map<string, string[]>> {
  const dispatcher = new WebhookDispatcher({
    clock: systemClock,
    logger: testLogger(),
    // every attempt the dispatcher makes is answered 204: the faults are the dispatcher's own
    fetch: async () => new Response(null, { status: 204 }),
    webhookUrl: () => 'http://receiver.invalid/webhooks/partner',
    webhookSecret: () => 'whsec-not-used-here',
    retryBaseDelayMs: 1,
    retryMaxDelayMs: 1,
    attemptTimeoutMs: 1_000,
    faults,
  })
  const sellerOf = new Map<string, string>()
  for (const seller of order) {
    const event = dispatcher.prepare('seller.verified', { event: 'seller.verified', seller_id: seller, status: 'verified' }, null, 'verified')
    sellerOf.set(event.eventId, seller)
    dispatcher.dispatch(event)
  }
  await dispatcher.idle()
  const bySeller = new Map<string, string[]>()
  for (const attempt of dispatcher.log) {
    const seller = sellerOf.get(attempt.eventId)!
    bySeller.set(seller, [...(bySeller.get(seller) ?? []), attempt.result])
  }
  return bySeller
}

describe('the sandbox webhook dispatcher’s faults', () => {
  it('gives each event the same faults for a seed, in whatever order the events come', async () => {
    const inOrder = await faultsBySeller(SELLERS)
    const dropped = [...inOrder.values()].filter((results) => results.includes('dropped')).length
    const duplicated = [...inOrder.values()].filter((results) => results.includes('duplicate')).length
    // both faults happened, and not to every event: the comparison below compares something
    expect(dropped).toBeGreaterThan(5)
    expect(dropped).toBeLessThan(SELLERS.length - 5)
    expect(duplicated).toBeGreaterThan(5)
    expect(await faultsBySeller([...SELLERS].reverse())).toEqual(inOrder)
    const shuffled = [...SELLERS].sort((a, b) => (a.length - b.length) * 7 + a.localeCompare(b) * -1)
    expect(await faultsBySeller(shuffled)).toEqual(inOrder)
  })

  it('gives other faults for another seed', async () => {
    const seven = await faultsBySeller(SELLERS)
    const eight = await faultsBySeller(SELLERS, { ...FAULTS, seed: 8 })
    expect(eight).not.toEqual(seven)
  })
})
