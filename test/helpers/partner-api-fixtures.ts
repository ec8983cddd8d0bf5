// Platform records as the partner API answers them (src/partner-api/types.ts), for fake platforms in tests.
// the full records, as the sandbox answers them; the client needs only the fields it relies on
import type {
  FullDisputeRecord as DisputeRecord,
  FullMilestoneRecord as MilestoneRecord,
  FullProposalRecord as ProposalRecord,
  FullRespondResult as RespondResult,
  FullTradeRecord as TradeRecord,
} from '../../src/partner-api/types.js'

export function tradeRecord(overrides: Partial<TradeRecord> = {}): TradeRecord {
  return {
    trade_id: 'tr_1',
    reference: 'TRD-0001',
    status: 'created',
    external_reference: 'order-1',
    title: 'Used bicycle',
    amount: '120.00',
    currency: 'EUR',
    seller_id: 'seller_1',
    buyer_name: null,
    buyer_phone: null,
    milestones: null,
    dispute: null,
    resolution: null,
    created_at: '2026-01-01T00:00:00Z',
    updated_at: '2026-01-01T00:00:00Z',
    ...overrides,
  }
}

/** A milestone's own record, as a milestone deliver or release may answer it instead of the trade's. */
export function milestoneRecord(overrides: Partial<MilestoneRecord> = {}): MilestoneRecord {
  return { milestone_id: 'ms_1', title: 'Frame', amount: '70.00', status: 'delivered', ...overrides }
}

export function proposalRecord(overrides: Partial<ProposalRecord> = {}): ProposalRecord {
  return {
    proposal_id: 'pr_1',
    trade_id: 'tr_1',
    outcome: 'split',
    split_buyer_pct: '40',
    party: 'buyer',
    status: 'pending',
    created_at: '2026-01-01T00:00:00Z',
    ...overrides,
  }
}

export function disputeRecord(overrides: Partial<DisputeRecord> = {}): DisputeRecord {
  return {
    dispute_id: 'dp_1',
    trade_id: 'tr_1',
    party: 'buyer',
    reason: 'The bicycle arrived with a broken frame',
    category: null,
    status: 'open',
    proposals: [],
    created_at: '2026-01-01T00:00:00Z',
    ...overrides,
  }
}

export function respondResult(accept = true): RespondResult {
  return {
    proposal: proposalRecord({ status: accept ? 'accepted' : 'rejected' }),
    trade: tradeRecord({ status: accept ? 'resolved' : 'disputed' }),
  }
}

/** The record an endpoint answers, chosen by the request path. */
export function recordForPath(path: string): unknown {
  if (path.endsWith('/respond/')) return respondResult()
  if (path.endsWith('/proposals/')) return proposalRecord()
  if (path.endsWith('/dispute/')) return disputeRecord()
  return tradeRecord()
}
