// The typed client for the platform's eleven partner endpoints (spec section 4).
//
// Every request is validated before it is sent (PartnerValidationError, validate-request.ts); the
// transport (partner-api-transport.ts) signs it, bounds it by a timeout, retries only a GET, and answers
// the record checked against its schema (responses.ts) or a typed error (partner-api-error.ts).
import type { PartnerEnv, PartnerKind } from '../config.js'
import type { Logger } from '../logger.js'
import { type CallOptions, PartnerApiTransport, type TransportOptions } from './partner-api-transport.js'
import { checkMilestoneAnswer, disputeSchema, proposalSchema, respondResultSchema, tradeSchema } from './responses.js'
import type {
  CreateProposalRequest,
  CreateTradeRequest,
  DisputeRecord,
  MilestoneAnswer,
  OpenDisputeRequest,
  ProposalRecord,
  RespondResult,
  RespondToProposalRequest,
  TradeRecord,
} from './types.js'
import {
  validateCreateProposal,
  validateCreateTrade,
  validateOpenDispute,
  validatePathId,
  validateRespondToProposal,
} from './validate-request.js'

export type { CallOptions, RetryOptions } from './partner-api-transport.js'

// The targets each logger has announced at info: the service builds a client per forwarded command
// with its own logger, and one "ready" line per target and process is what an operator wants to read.
const announced = new WeakMap<Logger, Set<string>>()

function firstAnnouncement(logger: Logger, target: string): boolean {
  const targets = announced.get(logger) ?? new Set<string>()
  announced.set(logger, targets)
  if (targets.has(target)) return false
  targets.add(target)
  return true
}

export interface PartnerApiClientOptions extends TransportOptions {
  env: PartnerEnv
  kind: PartnerKind
  /**
   * Set when a proxy is configured (HTTP_PROXY, HTTPS_PROXY): the proxy this client's calls go through, as
   * scheme://host:port (undefined: none, the base URL bypasses it), and NO_PROXY as set, for the ready line.
   */
  proxyRoute?: { proxy: string | undefined; noProxy: string | undefined }
}

export class PartnerApiClient {
  readonly env: PartnerEnv
  readonly kind: PartnerKind
  readonly baseUrl: string
  private readonly transport: PartnerApiTransport

  constructor(options: PartnerApiClientOptions) {
    this.transport = new PartnerApiTransport({ ...options, proxy: options.proxyRoute?.proxy })
    this.env = options.env
    this.kind = options.kind
    this.baseUrl = this.transport.baseUrl
    const level = firstAnnouncement(options.logger, `${this.env} ${this.baseUrl}`) ? 'info' : 'debug'
    const route = options.proxyRoute
    options.logger[level](
      {
        env: this.env,
        kind: this.kind,
        baseUrl: this.baseUrl,
        timeoutMs: this.transport.timeoutMs,
        ...(route ? { proxy: route.proxy ?? 'none', noProxy: route.noProxy ?? '' } : {}),
      },
      'partner api client ready',
    )
  }

  async createTrade(request: CreateTradeRequest, options?: CallOptions): Promise<TradeRecord> {
    const body = validateCreateTrade(request, this.kind)
    return this.transport.call('POST', '/trades/', body, tradeSchema, options)
  }

  /** The polling operation: retried on network errors, timeouts, 429 and 5xx. */
  async getTrade(tradeId: string, options?: CallOptions): Promise<TradeRecord> {
    return this.transport.call('GET', tradePath(tradeId), undefined, tradeSchema, options)
  }

  async fundTrade(tradeId: string, options?: CallOptions): Promise<TradeRecord> {
    return this.transport.call('POST', `${tradePath(tradeId)}fund/`, {}, tradeSchema, options)
  }

  async deliverTrade(tradeId: string, options?: CallOptions): Promise<TradeRecord> {
    return this.transport.call('POST', `${tradePath(tradeId)}deliver/`, {}, tradeSchema, options)
  }

  async releaseTrade(tradeId: string, options?: CallOptions): Promise<TradeRecord> {
    return this.transport.call('POST', `${tradePath(tradeId)}release/`, {}, tradeSchema, options)
  }

  async cancelTrade(tradeId: string, options?: CallOptions): Promise<TradeRecord> {
    return this.transport.call('POST', `${tradePath(tradeId)}cancel/`, {}, tradeSchema, options)
  }

  /**
   * Answers the milestone record or the trade record, as the spec allows either, saying which came: a top-level
   * milestone_id makes it the milestone's (checkMilestoneAnswer). Whether it is the record of the milestone and
   * trade asked for is the caller's to check (runTradeOperation), as for every other operation.
   */
  async deliverMilestone(tradeId: string, milestoneId: string, options?: CallOptions): Promise<MilestoneAnswer> {
    const path = `${milestonePath(tradeId, milestoneId)}deliver/`
    return this.transport.call('POST', path, {}, checkMilestoneAnswer, options)
  }

  async releaseMilestone(tradeId: string, milestoneId: string, options?: CallOptions): Promise<MilestoneAnswer> {
    const path = `${milestonePath(tradeId, milestoneId)}release/`
    return this.transport.call('POST', path, {}, checkMilestoneAnswer, options)
  }

  async openDispute(
    tradeId: string,
    request: OpenDisputeRequest,
    options?: CallOptions,
  ): Promise<DisputeRecord> {
    const path = `${tradePath(tradeId)}dispute/`
    return this.transport.call('POST', path, validateOpenDispute(request), disputeSchema, options)
  }

  async createProposal(
    tradeId: string,
    request: CreateProposalRequest,
    options?: CallOptions,
  ): Promise<ProposalRecord> {
    const path = `${tradePath(tradeId)}proposals/`
    return this.transport.call('POST', path, validateCreateProposal(request), proposalSchema, options)
  }

  async respondToProposal(
    tradeId: string,
    proposalId: string,
    request: RespondToProposalRequest,
    options?: CallOptions,
  ): Promise<RespondResult> {
    const path = `${tradePath(tradeId)}proposals/${segment('proposal_id', proposalId)}/respond/`
    return this.transport.call('POST', path, validateRespondToProposal(request), respondResultSchema, options)
  }
}

function segment(field: string, id: string): string {
  return encodeURIComponent(validatePathId(field, id))
}

function tradePath(tradeId: string): string {
  return `/trades/${segment('trade_id', tradeId)}/`
}

function milestonePath(tradeId: string, milestoneId: string): string {
  return `${tradePath(tradeId)}milestones/${segment('milestone_id', milestoneId)}/`
}
