import { describe, expect, it } from 'vitest'
import { decideTransition, isTerminalStatus, statusRank, TRADE_STATUSES } from '../src/orders/trade-status.js'

const at = (status: string | null) => ({
  status,
  rank: status === null ? 0 : (statusRank(status) ?? 20),
  terminal: status !== null && isTerminalStatus(status),
})

describe('the trade-status model', () => {
  it('ranks the lifecycle in order and marks the end states terminal', () => {
    const lifecycle = ['created', 'funded', 'delivered', 'disputed', 'cancelled']
    const ranks = lifecycle.map((status) => statusRank(status)!)
    expect([...ranks].sort((a, b) => a - b)).toEqual(ranks)
    expect(Object.entries(TRADE_STATUSES).filter(([, info]) => info.terminal).map(([status]) => status)).toEqual([
      'refunded',
      'released',
      'resolved',
    ])
    expect(statusRank('on_hold')).toBeUndefined()
    expect(statusRank('toString')).toBeUndefined()
  })

  it.each([
    [null, 'funded', 'applied'],
    ['funded', 'delivered', 'applied'],
    ['delivered', 'funded', 'stale'],
    ['funded', 'funded', 'duplicate_effect'],
    ['released', 'released', 'duplicate_effect'],
    ['released', 'disputed', 'stale'],
    ['cancelled', 'refunded', 'applied'],
    ['funded', 'on_hold', 'applied'],
    ['on_hold', 'funded', 'stale'],
    ['on_hold', 'delivered', 'applied'],
    ['resolved', 'on_hold', 'stale'],
  ] as const)('from %s, observing %s is %s', (current, observed, outcome) => {
    expect(decideTransition(at(current), observed)).toBe(outcome)
  })
})

describe('the SQL decision of applyObservation', () => {
  const cases: [string | null, string][] = [
    [null, 'funded'],
    ['funded', 'delivered'],
    ['delivered', 'funded'],
    ['funded', 'funded'],
    ['released', 'released'],
    ['released', 'disputed'],
    ['cancelled', 'refunded'],
    ['funded', 'on_hold'],
    ['on_hold', 'funded'],
    ['on_hold', 'delivered'],
  ]

  it('decides every case as decideTransition does', async () => {
    const { createTestDatabase } = await import('./helpers/test-database.js')
    const { applyObservation } = await import('../src/orders/apply-observation.js')
    const { createOrder } = await import('../src/orders/order.repository.js')
    const database = await createTestDatabase()
    try {
      for (const [index, [current, observed]] of cases.entries()) {
        const ref = `decide-${index}`
        const { order } = await createOrder(database.db, { externalReference: ref })
        const observe = (status: string) =>
          applyObservation(
            database.db,
            { target: { orderId: order.id }, tradeId: `t-${index}`, status, source: 'poll', observedAt: new Date() },
            { staleAfterS: 60 },
          )
        // reach `current` through its predecessors, as a real order would
        const path = current === 'on_hold' ? ['funded', 'on_hold'] : current === null ? [] : [current]
        for (const status of path) expect((await observe(status)).outcome).toBe('applied')
        const expected = decideTransition(
          { status: current, rank: statusRank(current === 'on_hold' ? 'funded' : (current ?? '')) ?? 0, terminal: current !== null && isTerminalStatus(current) },
          observed,
        )
        expect((await observe(observed)).outcome, `${current} -> ${observed}`).toBe(expected)
      }
    } finally {
      await database.close()
    }
  })
})
