import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { NO_REACTION_HANDLERS } from '../src/orders/apply-observation.js'
import {
  decideTransition,
  isTerminalStatus,
  type OrderStatusState,
  statusRank,
  TRADE_STATUSES,
  type TransitionSource,
} from '../src/orders/trade-status.js'

const at = (status: string | null, visited: string[] = status === null ? [] : [status]): OrderStatusState => ({
  status,
  rank: status === null ? 0 : (statusRank(status) ?? 20),
  terminal: status !== null && isTerminalStatus(status),
  visited,
})

/** The order after an observation, as the model says (what the SQL must also do). */
function observe(state: OrderStatusState, status: string, source: TransitionSource): OrderStatusState {
  if (decideTransition(state, status, source) !== 'applied') return state
  return {
    status,
    rank: statusRank(status) ?? state.rank,
    terminal: isTerminalStatus(status),
    visited: [...state.visited, status],
  }
}

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
    [at(null), 'funded', 'webhook', 'applied'],
    [at('funded'), 'delivered', 'webhook', 'applied'],
    [at('delivered'), 'funded', 'poll', 'stale'],
    [at('funded'), 'funded', 'webhook', 'duplicate_effect'],
    [at('released'), 'released', 'webhook', 'duplicate_effect'],
    [at('released'), 'disputed', 'poll', 'stale'],
    [at('cancelled'), 'refunded', 'webhook', 'applied'],
    // an unknown status: a webhook's is held back (and polled), the platform's own answer applies
    [at('funded'), 'on_hold', 'webhook', 'unknown_status'],
    [at(null), 'on_hold', 'webhook', 'unknown_status'],
    [at('funded'), 'on_hold', 'poll', 'applied'],
    [at('funded'), 'on_hold', 'api', 'applied'],
    [at('resolved'), 'on_hold', 'poll', 'stale'],
    // after an unknown status (rank kept from funded): a higher known status follows, a lower one is stale
    [at('on_hold', ['funded', 'on_hold']), 'delivered', 'webhook', 'applied'],
    [at('on_hold', ['funded', 'on_hold']), 'funded', 'webhook', 'stale'],
    [at('on_hold', ['funded', 'on_hold']), 'on_hold', 'webhook', 'duplicate_effect'],
    // back from an unknown status to a known one it had (a hold lifted): a poll's answer only, at or above the rank
    [at('on_hold', ['funded', 'on_hold']), 'funded', 'poll', 'applied'],
    [at('on_hold', ['funded', 'on_hold']), 'funded', 'api', 'stale'],
    [at('on_hold', ['created', 'funded', 'on_hold']), 'created', 'poll', 'stale'],
    [at('paused', ['funded', 'on_hold', 'funded', 'paused']), 'funded', 'poll', 'applied'],
    // never back to a status the order has left otherwise, and never to an unknown one, even from the platform
    [at('funded', ['funded', 'on_hold', 'funded']), 'on_hold', 'poll', 'stale'],
    [at('delivered', ['funded', 'delivered']), 'funded', 'poll', 'stale'],
    [at('paused', ['funded', 'on_hold', 'paused']), 'on_hold', 'poll', 'stale'],
    [at('delivered', ['funded', 'on_hold', 'delivered']), 'on_hold', 'poll', 'stale'],
  ] as const)('from %o, observing %s from a %s is %s', (current, observed, source, outcome) => {
    expect(decideTransition(current, observed, source)).toBe(outcome)
  })
})

const STATUSES = ['created', 'funded', 'delivered', 'disputed', 'cancelled', 'refunded', 'released', 'on_hold', 'milestone_funded']
const SOURCES: TransitionSource[] = ['webhook', 'poll', 'api']

describe('the SQL decision of applyObservation', () => {
  it('decides every sequence of observations as decideTransition does, and revisits a status only on a poll back from an unknown one', async () => {
    const { createTestDatabase } = await import('./helpers/test-database.js')
    const { applyObservation } = await import('../src/orders/apply-observation.js')
    const { findOrderByExternalReference, orderHistory } = await import('../src/orders/order.repository.js')
    const { createOrder } = await import('./helpers/orders.js')
    const database = await createTestDatabase()
    let run = 0
    try {
      await fc.assert(
        fc.asyncProperty(
          fc.array(fc.record({ status: fc.constantFrom(...STATUSES), source: fc.constantFrom(...SOURCES) }), {
            minLength: 1,
            maxLength: 14,
          }),
          async (observations) => {
            const { order } = await createOrder(database.db, { externalReference: `decide-${++run}` })
            let model = at(null)
            for (const { status, source } of observations) {
              const expected = decideTransition(model, status, source)
              const result = await applyObservation(
                database.db,
                { target: { orderId: order.id }, tradeId: `t-${run}`, status, source, observedAt: new Date() },
                { staleAfterS: 60, handlersFor: NO_REACTION_HANDLERS },
              )
              expect(result.outcome, `${model.status} -> ${status} (${source})`).toBe(expected)
              model = observe(model, status, source)
            }
            const stored = await findOrderByExternalReference(database.db, `decide-${run}`)
            expect(stored?.tradeStatus ?? null).toBe(model.status)
            const history = await orderHistory(database.db, order.id)
            history.forEach((change, index) => {
              if (!history.slice(0, index).some((earlier) => earlier.toStatus === change.toStatus)) return
              // entered before: only a poll's answer, of a known status, taking the order from an unknown one
              expect(change.source).toBe('poll')
              expect(statusRank(change.toStatus)).toBeDefined()
              expect(statusRank(change.fromStatus ?? 'created')).toBeUndefined()
            })
          },
        ),
        { numRuns: 60 },
      )
    } finally {
      await database.close()
    }
  })
})
