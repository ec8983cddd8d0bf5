import { afterEach, describe, expect, it, vi } from 'vitest'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'

const handler = async () => {}

describe('the reaction registry', () => {
  afterEach(() => {
    vi.restoreAllMocks()
  })

  it('names, sorted, the handlers whose pattern matches a type: its own status, a list holding it, or trade.*', () => {
    const reactions = createReactionRegistry()
      .on('trade.*', 'ledger', handler)
      .on('trade.funded', 'ship-goods', handler)
      .on(['trade.funded', 'trade.released'], 'crm', handler)
    expect(reactions.handlersFor('trade.funded')).toEqual(['crm', 'ledger', 'ship-goods'])
    expect(reactions.handlersFor('trade.released')).toEqual(['crm', 'ledger'])
    expect(reactions.handlersFor('trade.disputed')).toEqual(['ledger'])
    expect(reactions.handlersFor('trade.a_status_no_table_knows')).toEqual(['ledger'])
    expect(reactions.handlersFor('seller.verified')).toEqual([])
    expect(reactions.handlersFor('trade')).toEqual([])
    // a handler registered later is in the answers from then on
    reactions.on('trade.disputed', 'support', handler)
    expect(reactions.handlersFor('trade.disputed')).toEqual(['ledger', 'support'])
    expect(reactions.handlersFor('trade.funded')).toEqual(['crm', 'ledger', 'ship-goods'])
    expect(createReactionRegistry().handlersFor('trade.funded')).toEqual([])
  })

  it('keeps nothing per type asked: 10,000 distinct statuses from outside store no entry and share one answer', () => {
    const reactions = createReactionRegistry().on('trade.*', 'ledger', handler).on('trade.funded', 'ship-goods', handler)
    const first = reactions.handlersFor('trade.status_0')
    // a Map or a Set filled per type would call one of these for each new status
    const mapSet = vi.spyOn(Map.prototype, 'set')
    const setAdd = vi.spyOn(Set.prototype, 'add')
    const trade: (readonly string[])[] = []
    const other: (readonly string[])[] = []
    for (let index = 1; index <= 10_000; index++) {
      trade.push(reactions.handlersFor(`trade.status_${index}`))
      other.push(reactions.handlersFor(`buyer.event_${index}`))
    }
    const stored = [mapSet.mock.calls.length, setAdd.mock.calls.length]
    vi.restoreAllMocks()
    expect(stored).toEqual([0, 0])
    expect(trade.every((names) => names === first)).toBe(true)
    expect(first).toEqual(['ledger'])
    expect(other.every((names) => names.length === 0)).toBe(true)
    expect(reactions.handlersFor('trade.funded')).toEqual(['ledger', 'ship-goods'])
    expect(Object.isFrozen(first)).toBe(true)
  })

  it('keeps the timeout a handler was registered with, for the dispatcher to start its calls by, and refuses one that is no time', () => {
    const handler = async () => {}
    const reactions = createReactionRegistry().on('trade.funded', 'ship-goods', handler, { timeoutMs: 30_000 }).on('trade.*', 'ledger', handler)
    expect(reactions.timeoutOf('ship-goods')).toBe(30_000)
    expect(reactions.timeoutOf('ledger')).toBeUndefined()
    expect(reactions.timeoutOf('removed')).toBeUndefined()
    for (const timeoutMs of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => createReactionRegistry().on('trade.*', 'crm', handler, { timeoutMs })).toThrow(
        'reaction handler crm: timeoutMs must be a positive number of milliseconds',
      )
    }
  })
})
