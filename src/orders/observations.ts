// What the service learned about a trade, in the one shape the observation statement takes: one
// constructor per source, so the four ways a status arrives cannot drift apart. The time is the
// caller's clock's (an injected clock in tests and the demo), never read here.
import type { PartnerEnv } from '../config.js'
import type { Observation, ObservationSettings } from './apply-observation.js'
import { NO_REACTION_HANDLERS } from './apply-observation.js'

/** What the platform says of a trade, in its own field names (a webhook's body, an API answer). */
export interface TradeFacts {
  trade_id: string
  reference?: string | null | undefined
  external_reference?: string | null | undefined
  status: string
}

/**
 * The settings every observation is applied with, bound once where the service is put together:
 * STALE_AFTER_S (a non-terminal order is polled again this long after any observation) and EXPECTED_WEBHOOK_S (sooner
 * after a status the platform follows on its own: trade-status.ts pollAfterS), ORDER_REFERENCE_PATTERN,
 * the reaction handlers that take an applied status's event, what wakes the dispatchers after a commit
 * that wrote some (absent: a NOTIFY), and PARTNER_ENV (the environment an order's first link records).
 */
export function observationSettings(
  config: {
    poll: { staleAfterS: number; expectedWebhookS?: number }
    orders?: { referencePattern: RegExp | undefined }
    partner?: { env: PartnerEnv }
  },
  handlersFor: ObservationSettings['handlersFor'] = NO_REACTION_HANDLERS,
  onJobsEnqueued?: () => void,
): ObservationSettings {
  const referencePattern = config.orders?.referencePattern
  return {
    staleAfterS: config.poll.staleAfterS,
    ...(config.poll.expectedWebhookS === undefined ? {} : { expectedWebhookS: config.poll.expectedWebhookS }),
    handlersFor,
    ...(referencePattern ? { referencePattern } : {}),
    ...(onJobsEnqueued ? { onJobsEnqueued } : {}),
    ...(config.partner ? { partnerEnv: config.partner.env } : {}),
  }
}

/** A webhook's trade event, matched to its order by external reference in the ingest statement. */
export function webhookObservation(
  event: { externalReference: string; tradeId: string; tradeReference: string | null; status: string },
  deliveryId: string,
  receivedAt: Date,
): Observation & { target: { externalReference: string } } {
  return {
    target: { externalReference: event.externalReference },
    tradeId: event.tradeId,
    tradeReference: event.tradeReference,
    externalReference: event.externalReference,
    status: event.status,
    source: 'webhook',
    deliveryId,
    observedAt: receivedAt,
  }
}

/** A stored trade delivery applied after its own statement (parked, or re-applied by an operator). */
export function storedDeliveryObservation(
  delivery: {
    deliveryId: string
    externalReference: string
    tradeId: string | null
    tradeReference: string | null
    observedStatus: string | null
  },
  orderId: number,
  at: Date,
): Observation {
  return {
    target: { orderId },
    tradeId: delivery.tradeId ?? '',
    tradeReference: delivery.tradeReference,
    externalReference: delivery.externalReference,
    status: delivery.observedStatus ?? '',
    source: 'webhook',
    deliveryId: delivery.deliveryId,
    observedAt: at,
  }
}

/** A poll's answer, written back only under the claim's lease. */
export function pollObservation(
  claim: { orderId: number; leaseToken: string; version: number },
  trade: TradeFacts,
  at: Date,
): Observation {
  return {
    target: { orderId: claim.orderId, leaseToken: claim.leaseToken },
    askedAtVersion: claim.version,
    tradeId: trade.trade_id,
    tradeReference: trade.reference ?? null,
    externalReference: trade.external_reference ?? null,
    status: trade.status,
    source: 'poll',
    observedAt: at,
  }
}

/**
 * The trade record a partner API call answered (create, fund, release, ...) for one of our orders. The
 * record's own external reference is kept, so a record of another order is a trade_mismatch, not applied.
 * `version`: the order's when the call was sent (absent: an answer judged as if the order had not moved since).
 */
export function apiObservation(
  order: { orderId: number; externalReference: string; version?: number },
  trade: TradeFacts,
  at: Date,
): Observation {
  return {
    target: { orderId: order.orderId },
    ...(order.version === undefined ? {} : { askedAtVersion: order.version }),
    tradeId: trade.trade_id,
    tradeReference: trade.reference ?? null,
    externalReference: trade.external_reference ?? order.externalReference,
    status: trade.status,
    source: 'api',
    observedAt: at,
  }
}
