// The sandbox's trades and their lifecycle, as README's "Sandbox" section states the assumptions:
// created → funded → delivered → released; cancel before release → cancelled (→ refunded if funded);
// milestone trades stay funded while milestones are delivered and released one by one; a dispute
// (from funded or delivered) → disputed; a proposal by one party accepted by the other → resolved.
// A milestone trade's milestones add up to its amount (each release pays out its part of the trade), and a
// resolution splits what is still held: what a released milestone paid the seller is not taken back.
// Every status change is reported to `onStatusChange` (the webhook dispatcher).
import { randomBytes } from 'node:crypto'
import type { Clock } from '../clock.js'
import { addsUpTo, amountLeft, splitAmount } from './decimal-amount.js'
import {
  isLongEnoughReason,
  isPercentage,
  isPositiveDecimal,
  isTradeFact,
  MIN_DISPUTE_REASON_LENGTH,
  PHONE,
  percentageComplement,
  TRADE_FACT_MAX_LENGTH,
} from '../partner-api/field-rules.js'
// the sandbox answers the full records; the client insists only on the fields it relies on
import type {
  FullDisputeRecord as DisputeRecord,
  FullMilestoneRecord as MilestoneRecord,
  Party,
  ProposalOutcome,
  FullProposalRecord as ProposalRecord,
  FullRespondResult as RespondResult,
  FullTradeRecord as TradeRecord,
} from '../partner-api/types.js'

export const HOUSE_SELLER_ID = 'house_seller'

export class SandboxError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly fields?: { field: string; message: string }[],
  ) {
    super(message)
  }
}

const invalidState = (trade: TradeRecord, operation: string) =>
  new SandboxError(409, 'invalid_state', `Cannot ${operation} a trade that is ${trade.status}`)

function validationFailed(fields: { field: string; message: string }[]): SandboxError {
  return new SandboxError(422, 'validation_failed', `Invalid fields: ${fields.map((f) => f.field).join(', ')}`, fields)
}

const PARTIES = ['buyer', 'seller']
const OUTCOMES = ['buyer_win', 'seller_win', 'split']

type Body = Record<string, unknown>

/**
 * A request's fields that are none of `known`: refused, as the client refuses them before sending (its schemas are
 * strict, validate-request.ts). A sandbox that took them taught a client of its own a looser contract than ours.
 */
function unknownFields(body: Body, known: readonly string[], prefix = ''): { field: string; message: string }[] {
  return Object.keys(body)
    .filter((name) => !known.includes(name))
    .map((name) => ({ field: `${prefix}${name}`, message: 'is not a field of this request' }))
}

const TRADE_FIELDS = ['title', 'amount', 'currency', 'seller_id', 'buyer_name', 'buyer_phone', 'external_reference', 'milestones']

function nonEmptyString(value: unknown): value is string {
  return typeof value === 'string' && value.trim().length > 0
}

function positiveDecimal(value: unknown): boolean {
  return typeof value === 'string' && isPositiveDecimal(value)
}

/** What a restart needs to carry on where it stopped (sandbox-state.ts keeps it in a file). */
export interface PlatformState {
  /** The number in the last reference given (TRD-000042 → 42). */
  sequence: number
  trades: TradeRecord[]
  /** Trades that were ever funded: a cancel refunds them. */
  funded: string[]
}

/** What changed since the last takeChanges(): the trades (whole), which of them are funded, the counter. */
export interface PlatformChanges {
  sequence: number
  trades: TradeRecord[]
  funded: string[]
}

export class SandboxPlatform {
  private readonly trades = new Map<string, TradeRecord>()
  private readonly funded = new Set<string>()
  private sequence = 0
  // the trades changed since the last takeChanges(): what the next save writes, whatever the number of trades
  private readonly changed = new Set<string>()
  // while a call runs (beginChange): each trade it may change as it was before (undefined: one it created), so an
  // undone call puts back just those
  private undo: { sequence: number; originals: Map<string, TradeRecord | undefined>; funded: Set<string> } | undefined

  constructor(
    private readonly options: {
      clock: Clock
      partnerKind: () => 'marketplace' | 'merchant'
      onStatusChange: (trade: TradeRecord) => void
      scheduleRefund: (tradeId: string) => void
    },
  ) {}

  private now(): string {
    return new Date(this.options.clock.now()).toISOString()
  }

  private newId(prefix: string): string {
    return `${prefix}_${randomBytes(8).toString('hex')}`
  }

  get(tradeId: string): TradeRecord {
    const trade = this.trades.get(tradeId)
    if (!trade) throw new SandboxError(404, 'trade_not_found', `No trade ${tradeId}`)
    return structuredClone(trade)
  }

  list(): TradeRecord[] {
    return [...this.trades.values()].map((trade) => structuredClone(trade))
  }

  snapshot(): PlatformState {
    return { sequence: this.sequence, trades: this.list(), funded: [...this.funded] }
  }

  /** Takes over a saved state (at start); a cancelled trade still owed its refund gets it again. */
  restore(state: PlatformState): void {
    this.sequence = state.sequence
    this.trades.clear()
    for (const trade of state.trades) this.trades.set(trade.trade_id, structuredClone(trade))
    this.funded.clear()
    for (const tradeId of state.funded) this.funded.add(tradeId)
    this.changed.clear()
    for (const trade of this.trades.values()) {
      if (trade.status === 'cancelled' && this.funded.has(trade.trade_id)) this.options.scheduleRefund(trade.trade_id)
    }
  }

  /** The changes since the last forgetChanges(): what a save writes. */
  changes(): PlatformChanges {
    const trades = [...this.changed].flatMap((tradeId) => {
      const trade = this.trades.get(tradeId)
      // (a trade an undone call created is gone)
      return trade ? [structuredClone(trade)] : []
    })
    return { sequence: this.sequence, trades, funded: trades.map((trade) => trade.trade_id).filter((tradeId) => this.funded.has(tradeId)) }
  }

  /** The changes were saved: the next save starts from here. */
  forgetChanges(): void {
    this.changed.clear()
  }

  /** A call starts: what it changes can be undone (undoChange) until endChange. */
  beginChange(): void {
    this.undo = { sequence: this.sequence, originals: new Map(), funded: new Set() }
  }

  endChange(): void {
    this.undo = undefined
  }

  /**
   * Puts back what the call begun with beginChange changed: the refunds it owed were never scheduled (they wait
   * for its save), and the trades it touched stay among the changes, so the next save writes them as they are.
   */
  undoChange(): void {
    const undo = this.undo
    this.undo = undefined
    if (!undo) return
    this.sequence = undo.sequence
    for (const [tradeId, original] of undo.originals) {
      if (original) this.trades.set(tradeId, original)
      else this.trades.delete(tradeId)
    }
    for (const tradeId of undo.funded) this.funded.delete(tradeId)
  }

  private touch(trade: TradeRecord): void {
    trade.updated_at = this.now()
    this.changed.add(trade.trade_id)
  }

  private setStatus(trade: TradeRecord, status: string): void {
    trade.status = status
    this.touch(trade)
    if (status === 'funded' && !this.funded.has(trade.trade_id)) {
      this.funded.add(trade.trade_id)
      this.undo?.funded.add(trade.trade_id)
    }
    this.options.onStatusChange(structuredClone(trade))
  }

  create(body: Body): TradeRecord {
    const problems: { field: string; message: string }[] = unknownFields(body, TRADE_FIELDS)
    if (!nonEmptyString(body.title)) problems.push({ field: 'title', message: 'is required' })
    if (!positiveDecimal(body.amount)) problems.push({ field: 'amount', message: 'must be a positive decimal string' })
    if (!nonEmptyString(body.currency)) problems.push({ field: 'currency', message: 'is required' })
    // echoed in every webhook and answer: one the client and the receiver cannot hold would never reach its order
    if (!(nonEmptyString(body.external_reference) && isTradeFact(body.external_reference))) {
      problems.push({
        field: 'external_reference',
        message: `is required: 1 to ${TRADE_FACT_MAX_LENGTH} characters without a NUL or a lone surrogate`,
      })
    }
    if (body.seller_id !== undefined && !nonEmptyString(body.seller_id)) {
      problems.push({ field: 'seller_id', message: 'must be a non-empty string' })
    } else if (body.seller_id === undefined && this.options.partnerKind() === 'marketplace') {
      problems.push({ field: 'seller_id', message: 'is required for Marketplace partners' })
    }
    if (body.buyer_phone !== undefined && !(typeof body.buyer_phone === 'string' && PHONE.test(body.buyer_phone))) {
      problems.push({ field: 'buyer_phone', message: 'must be in international format: a leading +, then 7 to 15 digits' })
    }
    if (body.buyer_name !== undefined && typeof body.buyer_name !== 'string') {
      problems.push({ field: 'buyer_name', message: 'must be a string' })
    }
    const milestones = body.milestones
    if (milestones !== undefined) problems.push(...milestoneProblems(milestones, body.amount))
    if (problems.length > 0) throw validationFailed(problems)

    const id = this.newId('trd')
    const now = this.now()
    const trade: TradeRecord = {
      trade_id: id,
      reference: `TRD-${String(++this.sequence).padStart(6, '0')}`,
      status: 'created',
      external_reference: body.external_reference as string,
      title: body.title as string,
      amount: body.amount as string,
      currency: body.currency as string,
      seller_id: (body.seller_id as string | undefined) ?? HOUSE_SELLER_ID,
      buyer_name: (body.buyer_name as string | undefined) ?? null,
      buyer_phone: (body.buyer_phone as string | undefined) ?? null,
      milestones: Array.isArray(milestones)
        ? milestones.map((milestone: Body) => ({
            milestone_id: this.newId('ms'),
            title: milestone.title as string,
            amount: milestone.amount as string,
            status: 'pending' as const,
          }))
        : null,
      dispute: null,
      resolution: null,
      created_at: now,
      updated_at: now,
    }
    this.trades.set(id, trade)
    this.changed.add(id)
    this.undo?.originals.set(id, undefined)
    this.options.onStatusChange(structuredClone(trade))
    return structuredClone(trade)
  }

  /** The trade a call changes, kept as it was for an undo. */
  private live(tradeId: string): TradeRecord {
    const trade = this.trades.get(tradeId)
    if (!trade) throw new SandboxError(404, 'trade_not_found', `No trade ${tradeId}`)
    if (this.undo && !this.undo.originals.has(tradeId)) this.undo.originals.set(tradeId, structuredClone(trade))
    return trade
  }

  fund(tradeId: string): TradeRecord {
    const trade = this.live(tradeId)
    if (trade.status !== 'created') throw invalidState(trade, 'fund')
    this.setStatus(trade, 'funded')
    return structuredClone(trade)
  }

  deliver(tradeId: string): TradeRecord {
    const trade = this.live(tradeId)
    if (trade.milestones) {
      throw new SandboxError(409, 'invalid_state', 'A milestone trade is delivered milestone by milestone')
    }
    if (trade.status !== 'funded') throw invalidState(trade, 'deliver')
    this.setStatus(trade, 'delivered')
    return structuredClone(trade)
  }

  release(tradeId: string): TradeRecord {
    const trade = this.live(tradeId)
    if (trade.milestones) {
      throw new SandboxError(409, 'invalid_state', 'A milestone trade is released milestone by milestone')
    }
    if (trade.status !== 'delivered') throw invalidState(trade, 'release')
    this.setStatus(trade, 'released')
    return structuredClone(trade)
  }

  cancel(tradeId: string): TradeRecord {
    const trade = this.live(tradeId)
    if (!['created', 'funded', 'delivered'].includes(trade.status)) throw invalidState(trade, 'cancel')
    if (trade.milestones?.some((milestone) => milestone.status === 'released')) {
      throw new SandboxError(409, 'invalid_state', 'Cannot cancel a trade with a released milestone')
    }
    this.setStatus(trade, 'cancelled')
    if (this.funded.has(tradeId)) this.options.scheduleRefund(tradeId)
    return structuredClone(trade)
  }

  /** Called by the refund timer: cancelled and funded → refunded. */
  refund(tradeId: string): void {
    const trade = this.trades.get(tradeId)
    if (trade?.status === 'cancelled') this.setStatus(trade, 'refunded')
  }

  private milestone(trade: TradeRecord, milestoneId: string): MilestoneRecord {
    const milestone = trade.milestones?.find((item) => item.milestone_id === milestoneId)
    if (!milestone) throw new SandboxError(404, 'milestone_not_found', `No milestone ${milestoneId} on trade ${trade.trade_id}`)
    return milestone
  }

  deliverMilestone(tradeId: string, milestoneId: string): TradeRecord {
    const trade = this.live(tradeId)
    const milestone = this.milestone(trade, milestoneId)
    if (trade.status !== 'funded') throw invalidState(trade, 'deliver a milestone of')
    if (milestone.status !== 'pending') {
      throw new SandboxError(409, 'invalid_state', `Milestone ${milestoneId} is already ${milestone.status}`)
    }
    milestone.status = 'delivered'
    this.touch(trade)
    return structuredClone(trade)
  }

  releaseMilestone(tradeId: string, milestoneId: string): TradeRecord {
    const trade = this.live(tradeId)
    const milestone = this.milestone(trade, milestoneId)
    if (trade.status !== 'funded') throw invalidState(trade, 'release a milestone of')
    if (milestone.status !== 'delivered') {
      throw new SandboxError(409, 'invalid_state', `Milestone ${milestoneId} is ${milestone.status}, not delivered`)
    }
    milestone.status = 'released'
    this.touch(trade)
    if (trade.milestones!.every((item) => item.status === 'released')) this.setStatus(trade, 'released')
    return structuredClone(trade)
  }

  openDispute(tradeId: string, body: Body): DisputeRecord {
    const trade = this.live(tradeId)
    const problems: { field: string; message: string }[] = unknownFields(body, ['reason', 'category', 'party'])
    if (!(typeof body.reason === 'string' && isLongEnoughReason(body.reason))) {
      problems.push({ field: 'reason', message: `is required and must be at least ${MIN_DISPUTE_REASON_LENGTH} characters` })
    }
    if (!PARTIES.includes(body.party as string)) problems.push({ field: 'party', message: 'is required: buyer or seller' })
    if (body.category !== undefined && typeof body.category !== 'string') {
      problems.push({ field: 'category', message: 'must be a string' })
    }
    if (problems.length > 0) throw validationFailed(problems)
    if (!['funded', 'delivered'].includes(trade.status)) throw invalidState(trade, 'dispute')
    trade.dispute = {
      dispute_id: this.newId('dsp'),
      trade_id: tradeId,
      party: body.party as Party,
      reason: body.reason as string,
      category: (body.category as string | undefined) ?? null,
      status: 'open',
      proposals: [],
      created_at: this.now(),
    }
    this.setStatus(trade, 'disputed')
    return structuredClone(trade.dispute)
  }

  createProposal(tradeId: string, body: Body): ProposalRecord {
    const trade = this.live(tradeId)
    const problems: { field: string; message: string }[] = unknownFields(body, ['outcome', 'split_buyer_pct', 'party'])
    if (!OUTCOMES.includes(body.outcome as string)) {
      problems.push({ field: 'outcome', message: 'must be one of buyer_win, seller_win, split' })
    }
    if (!PARTIES.includes(body.party as string)) problems.push({ field: 'party', message: 'is required: buyer or seller' })
    if (body.outcome === 'split') {
      const pct = body.split_buyer_pct
      if (!(typeof pct === 'string' && isPercentage(pct))) {
        problems.push({ field: 'split_buyer_pct', message: 'is required for a split: a decimal between 0 and 100' })
      }
    } else if (body.split_buyer_pct !== undefined) {
      // as the client refuses it: a share means something for a split only (it was dropped, and the proposal made)
      problems.push({ field: 'split_buyer_pct', message: 'is only allowed for outcome split' })
    }
    if (problems.length > 0) throw validationFailed(problems)
    if (trade.status !== 'disputed' || trade.dispute?.status !== 'open') throw invalidState(trade, 'propose on')
    if (trade.dispute.proposals.some((proposal) => proposal.status === 'pending')) {
      throw new SandboxError(409, 'invalid_state', 'A proposal is already waiting for an answer')
    }
    const proposal: ProposalRecord = {
      proposal_id: this.newId('prp'),
      trade_id: tradeId,
      outcome: body.outcome as ProposalOutcome,
      split_buyer_pct: body.outcome === 'split' ? (body.split_buyer_pct as string) : null,
      party: body.party as Party,
      status: 'pending',
      created_at: this.now(),
    }
    trade.dispute.proposals.push(proposal)
    this.touch(trade)
    return structuredClone(proposal)
  }

  respond(tradeId: string, proposalId: string, body: Body): RespondResult {
    const trade = this.live(tradeId)
    const problems: { field: string; message: string }[] = unknownFields(body, ['accept', 'party'])
    if (typeof body.accept !== 'boolean') problems.push({ field: 'accept', message: 'is required: true or false' })
    if (!PARTIES.includes(body.party as string)) problems.push({ field: 'party', message: 'is required: buyer or seller' })
    if (problems.length > 0) throw validationFailed(problems)
    const proposal = trade.dispute?.proposals.find((item) => item.proposal_id === proposalId)
    if (!proposal) throw new SandboxError(404, 'proposal_not_found', `No proposal ${proposalId} on trade ${tradeId}`)
    if (proposal.status !== 'pending') {
      throw new SandboxError(409, 'proposal_not_pending', `Proposal ${proposalId} was already ${proposal.status}`)
    }
    if (proposal.party === body.party) {
      throw new SandboxError(409, 'same_party', 'A proposal is answered by the other party, not the one that made it')
    }
    if (body.accept) {
      proposal.status = 'accepted'
      trade.dispute!.status = 'resolved'
      trade.resolution = resolutionOf(trade, proposal)
      // accepting splits the funds at once: there is no separate release step
      this.setStatus(trade, 'resolved')
    } else {
      proposal.status = 'rejected'
      this.touch(trade)
    }
    return { proposal: structuredClone(proposal), trade: structuredClone(trade) }
  }
}

/** The problems of a milestones array: each item's, or else a sum other than the trade's amount. */
function milestoneProblems(milestones: unknown, amount: unknown): { field: string; message: string }[] {
  if (!Array.isArray(milestones) || milestones.length === 0) {
    return [{ field: 'milestones', message: 'must be a non-empty array' }]
  }
  const problems: { field: string; message: string }[] = []
  milestones.forEach((milestone: unknown, index) => {
    const item = (milestone ?? {}) as Body
    if (typeof item === 'object') problems.push(...unknownFields(item, ['title', 'amount'], `milestones[${index}].`))
    if (!nonEmptyString(item.title)) problems.push({ field: `milestones[${index}].title`, message: 'is required' })
    if (!positiveDecimal(item.amount)) {
      problems.push({ field: `milestones[${index}].amount`, message: 'must be a positive decimal string' })
    }
  })
  if (problems.length > 0 || !positiveDecimal(amount)) return problems
  // the releases together pay out the trade: amounts that fell short would leave funds held for ever, and
  // amounts beyond it would pay out more than was funded
  const amounts = milestones.map((milestone: Body) => milestone.amount as string)
  if (!addsUpTo(amounts, amount as string)) {
    return [{ field: 'milestones', message: `amounts must add up to the trade amount ${String(amount)}` }]
  }
  return problems
}

/**
 * What an accepted proposal does with the funds: the percentages apply to what the trade still holds, the
 * amount less the milestones already released (which stay the seller's).
 */
function resolutionOf(trade: TradeRecord, proposal: ProposalRecord): NonNullable<TradeRecord['resolution']> {
  const buyerPct =
    proposal.outcome === 'buyer_win' ? '100' : proposal.outcome === 'seller_win' ? '0' : proposal.split_buyer_pct!
  const released = (trade.milestones ?? []).filter((milestone) => milestone.status === 'released')
  const heldAmount = amountLeft(trade.amount, released.map((milestone) => milestone.amount))
  const [buyerAmount, sellerAmount] = splitAmount(heldAmount, buyerPct)
  return {
    outcome: proposal.outcome,
    buyer_pct: buyerPct,
    // decimal arithmetic: 100 - 99.99 is exactly 0.01, never a binary float's 0.010000000000005116
    seller_pct: percentageComplement(buyerPct),
    held_amount: heldAmount,
    buyer_amount: buyerAmount,
    seller_amount: sellerAmount,
  }
}
