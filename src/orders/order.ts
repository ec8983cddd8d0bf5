// The partner's order as the rest of the service sees it (the repository maps rows to these).
import type { PartnerEnv } from '../config.js'

export type ObservationSource = 'webhook' | 'poll' | 'api'

/**
 * Where the order stands with its trade creation: none (no create sent), pending (a create is in
 * flight), unknown (a create got no answer: it may exist; never re-sent on its own), created (linked).
 */
export type TradeCreateState = 'none' | 'pending' | 'unknown' | 'created'

/** A pending create whose command marked it and has not sent it (or stopped before sending it). */
export function unsentCreate(order: Pick<Order, 'tradeCreateState' | 'tradeCreateWaitMs'>): boolean {
  return order.tradeCreateState === 'pending' && order.tradeCreateWaitMs !== null && order.tradeCreateWaitMs < 0
}

export interface Order {
  id: number
  externalReference: string
  tradeId: string | null
  tradeReference: string | null
  tradeStatus: string | null
  /** How many transitions it has made: the sequence of its last history row (0: none yet). */
  version: number
  statusSource: ObservationSource | null
  statusChangedAt: Date | null
  tradeCreateState: TradeCreateState
  /**
   * While pending: how long the command that marked it waits for the answer (its PARTNER_API_TIMEOUT_MS and a margin),
   * in ms from updatedAt. Read only while pending, and cleared when this version moves the create to a state that
   * can lead back to it; null for a mark written by a version before the column. Negative while the create is marked
   * and not yet sent (startTradeCreate): made the whole time by the stamp written as it leaves (markTradeCreateSending),
   * so a mark whose command stopped before sending reads as never sent. Every mark an older version writes is positive.
   */
  tradeCreateWaitMs: number | null
  /**
   * The platform environment (PARTNER_ENV) its trade lives in: the one the service or command that first linked it ran
   * under. Null when no trade is linked, or when it was linked before the column (migrations/0018): such an order is
   * taken as belonging to whatever environment the service runs in.
   */
  partnerEnv: PartnerEnv | null
  nextPollAt: Date | null
  pollAttempts: number
  attention: string | null
  createdAt: Date
  updatedAt: Date
}

/**
 * The environment an order was linked under when it is not `current`: its trade is on the other platform, and this
 * one neither polls, moves nor calls it (README, "Going live"). Undefined for one of `current`, or not recorded.
 */
export function linkedElsewhere(order: { partnerEnv: PartnerEnv | string | null }, current: PartnerEnv): string | undefined {
  return order.partnerEnv !== null && order.partnerEnv !== current ? order.partnerEnv : undefined
}

export interface StatusChange {
  /** The event's id: each reaction handler's idempotency key, and the key of its reaction jobs. */
  eventId: string
  fromStatus: string | null
  toStatus: string
  source: ObservationSource
  deliveryId: string | null
  recordedAt: Date
}
