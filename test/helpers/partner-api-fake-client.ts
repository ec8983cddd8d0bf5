// A stand-in for PartnerApiClient at the method level, for tests of the code that uses it (the trades
// service): every call is recorded, and any method can be replaced to answer, fail or hang.
import type { PartnerTradeApi } from '../../src/trades/trade-deps.js'
import { disputeRecord, proposalRecord, respondResult, tradeRecord } from './partner-api-fixtures.js'

export interface FakeCall {
  method: keyof PartnerTradeApi
  args: unknown[]
}

export type FakeTradeApi = PartnerTradeApi & { calls: FakeCall[] }

export function fakeTradeApi(overrides: Partial<PartnerTradeApi> = {}): FakeTradeApi {
  const calls: FakeCall[] = []
  // a trade's own record: its external reference is the order's (trades are created as tr_<reference>)
  const own = (tradeId: string, status: string) => tradeRecord({ trade_id: tradeId, status, external_reference: tradeId.replace(/^tr_/, '') })
  const defaults: PartnerTradeApi = {
    createTrade: async (request) =>
      tradeRecord({ trade_id: `tr_${request.external_reference}`, external_reference: request.external_reference }),
    getTrade: async (tradeId) => own(tradeId, 'created'),
    fundTrade: async (tradeId) => own(tradeId, 'funded'),
    deliverTrade: async (tradeId) => own(tradeId, 'delivered'),
    releaseTrade: async (tradeId) => own(tradeId, 'released'),
    cancelTrade: async (tradeId) => own(tradeId, 'cancelled'),
    // the trade record, as the sandbox answers by default (a test overrides these for the milestone record)
    deliverMilestone: async (tradeId) => ({ record: 'trade', trade: own(tradeId, 'funded') }),
    releaseMilestone: async (tradeId) => ({ record: 'trade', trade: own(tradeId, 'funded') }),
    openDispute: async (tradeId, request) => disputeRecord({ trade_id: tradeId, party: request.party }),
    createProposal: async (tradeId, request) => proposalRecord({ trade_id: tradeId, outcome: request.outcome }),
    respondToProposal: async (tradeId, proposalId, request) => {
      const result = respondResult(request.accept)
      return { proposal: { ...result.proposal, proposal_id: proposalId, trade_id: tradeId }, trade: { ...result.trade, ...own(tradeId, result.trade.status) } }
    },
  }
  const fake = { calls } as unknown as FakeTradeApi
  for (const method of Object.keys(defaults) as (keyof PartnerTradeApi)[]) {
    const implementation = (overrides[method] ?? defaults[method]) as (...args: unknown[]) => Promise<unknown>
    ;(fake as unknown as Record<string, unknown>)[method] = (...args: unknown[]) => {
      calls.push({ method, args })
      return implementation(...args)
    }
  }
  return fake
}
