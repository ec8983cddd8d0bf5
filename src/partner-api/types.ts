// The platform's wire format, as the spec gives it and as we fill its gaps (README, "Partner API").
// Field names are the platform's own (snake_case): these objects are what goes over the wire.
import type {
  RecordOf,
  disputeSchema,
  fullDisputeSchema,
  fullMilestoneSchema,
  fullProposalSchema,
  fullRespondResultSchema,
  fullTradeSchema,
  milestoneSchema,
  platformErrorBodySchema,
  proposalSchema,
  respondResultSchema,
  tradeSchema,
} from './responses.js'

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

// Records the platform answers: inferred from the schemas in responses.ts, so the two cannot drift, and
// holding only the fields they declare (a misspelt field does not compile: RecordOf). The plain names are
// what the client returns (only the fields we rely on are sure to be there); the Full names are the whole
// records as the README documents them and the sandbox answers them.
export type MilestoneRecord = RecordOf<typeof milestoneSchema>
export type ProposalRecord = RecordOf<typeof proposalSchema>
export type DisputeRecord = RecordOf<typeof disputeSchema>
export type TradeRecord = RecordOf<typeof tradeSchema>
export type RespondResult = RecordOf<typeof respondResultSchema>
export type FullMilestoneRecord = RecordOf<typeof fullMilestoneSchema>
export type FullProposalRecord = RecordOf<typeof fullProposalSchema>
export type FullDisputeRecord = RecordOf<typeof fullDisputeSchema>
export type FullTradeRecord = RecordOf<typeof fullTradeSchema>
export type FullRespondResult = RecordOf<typeof fullRespondResultSchema>
export type PlatformErrorBody = RecordOf<typeof platformErrorBodySchema>

/** What a milestone deliver or release answered (told apart by a top-level milestone_id: responses.ts). */
export type { MilestoneAnswer } from './responses.js'

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
