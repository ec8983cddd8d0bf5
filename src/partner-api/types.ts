// The platform's wire format, as the spec gives it and as we fill its gaps (README, "Partner API").
// Field names are the platform's own (snake_case): these objects are what goes over the wire.

export type Party = 'buyer' | 'seller'
export type ProposalOutcome = 'buyer_win' | 'seller_win' | 'split'

export interface MilestoneInput {
  title: string
  amount: string
}

export interface CreateTradeRequest {
  title: string
  amount: string
  currency: string
  /** Required for Marketplace partners; Merchant partners may omit it (house seller). */
  seller_id?: string
  buyer_name?: string
  /** International format with a leading plus sign. */
  buyer_phone?: string
  external_reference: string
  milestones?: MilestoneInput[]
}

export interface MilestoneRecord {
  milestone_id: string
  title: string
  amount: string
  status: 'pending' | 'delivered' | 'released'
}

export interface ProposalRecord {
  proposal_id: string
  trade_id: string
  outcome: ProposalOutcome
  split_buyer_pct: string | null
  party: Party
  status: 'pending' | 'accepted' | 'rejected'
  created_at: string
}

export interface DisputeRecord {
  dispute_id: string
  trade_id: string
  party: Party
  reason: string
  category: string | null
  status: 'open' | 'resolved'
  proposals: ProposalRecord[]
  created_at: string
}

export interface TradeRecord {
  trade_id: string
  reference: string
  status: string
  external_reference: string
  title: string
  amount: string
  currency: string
  seller_id: string
  buyer_name: string | null
  buyer_phone: string | null
  /** null for a single deliver/release trade. */
  milestones: MilestoneRecord[] | null
  dispute: DisputeRecord | null
  /** Set once an accepted proposal split the funds: percentages as decimal strings. */
  resolution: { outcome: ProposalOutcome; buyer_pct: string; seller_pct: string } | null
  created_at: string
  updated_at: string
}

export interface OpenDisputeRequest {
  reason: string
  category?: string
  party: Party
}

export interface CreateProposalRequest {
  outcome: ProposalOutcome
  /** Required for outcome split: a decimal percentage between 0 and 100. */
  split_buyer_pct?: string
  party: Party
}

export interface RespondToProposalRequest {
  accept: boolean
  party: Party
}

export interface RespondResult {
  proposal: ProposalRecord
  trade: TradeRecord
}

/** The platform's error body: `{"error":{"code","message","fields"?}}`. */
export interface PlatformErrorBody {
  error: { code: string; message: string; fields?: { field: string; message: string }[] }
}
