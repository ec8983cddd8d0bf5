// The platform's wire format, as the spec gives it and as we fill its gaps (README, "Partner API").
// Field names are the platform's own (snake_case): these objects are what goes over the wire.
import type { z } from 'zod'
import type {
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

// Records the platform answers: inferred from the schemas in responses.ts, so the two cannot drift. The
// plain names are what the client returns (only the fields we rely on are sure to be there); the Full
// names are the whole records as the README documents them and the sandbox answers them.
export type MilestoneRecord = z.infer<typeof milestoneSchema>
export type ProposalRecord = z.infer<typeof proposalSchema>
export type DisputeRecord = z.infer<typeof disputeSchema>
export type TradeRecord = z.infer<typeof tradeSchema>
export type RespondResult = z.infer<typeof respondResultSchema>
export type FullMilestoneRecord = z.infer<typeof fullMilestoneSchema>
export type FullProposalRecord = z.infer<typeof fullProposalSchema>
export type FullDisputeRecord = z.infer<typeof fullDisputeSchema>
export type FullTradeRecord = z.infer<typeof fullTradeSchema>
export type FullRespondResult = z.infer<typeof fullRespondResultSchema>
export type PlatformErrorBody = z.infer<typeof platformErrorBodySchema>

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
