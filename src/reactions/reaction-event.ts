// A reaction event: one transition of an order's status, read from the outbox (order_status_history),
// handed to every handler registered for its type. Pure: imports nothing of ours but types.
// Glossary:
// - event: one transition; its eventId is stable and is every handler's idempotency key;
// - handler: the partner's code for one kind of event, called at least once per (event, handler);
// - sequence: the order's version after the move, so one order's events count 1, 2, 3 ... in order.
import type { Logger } from '../logger.js'
import type { TradeStatus } from '../orders/trade-status.js'

/**
 * A status as an event carries it: one of the status table's (offered as you type, `event.to === 'funded'` checked
 * for spelling), or one the table does not know, which the platform may send and a poll's answer may set
 * (README, "The status model"): a handler of `trade.*` sees those too.
 */
export type EventStatus = TradeStatus | (string & {})

export interface ReactionEvent {
  /** uuid, stable: the idempotency key of every handler */
  eventId: string
  /** 'trade.' + the status the order moved to */
  type: `trade.${TradeStatus}` | (`trade.${string}` & {})
  orderId: number
  externalReference: string
  tradeId: string
  from: EventStatus | null
  to: EventStatus
  source: 'webhook' | 'poll' | 'api' | string
  /** per order, 1, 2, 3 ... in transition order */
  sequence: number
  occurredAt: Date
}

export interface HandlerContext {
  /**
   * Aborted when the call's timeoutMs has passed (its reason a HandlerTimeoutError: the attempt failed, and is retried),
   * when the job's lease is about to end, or when the process shuts down (the job runs again later): stop.
   */
  signal: AbortSignal
  /** 1 on the first call of this (event, handler), then 2, 3 ... */
  attempt: number
  logger: Logger
}

export type ReactionHandler = ((event: ReactionEvent, context: HandlerContext) => Promise<void>) & {
  /**
   * Set by a handler that ends each of its calls itself within this many ms, with an error of its own
   * (createForwarder's forward_timeout, the RabbitMQ publisher's amqp_timeout): registered without a timeoutMs it
   * has this one, and the dispatcher aborts its calls at their timeoutMs only when that is shorter.
   */
  readonly ownTimeoutMs?: number
}

/** The body the forwarder sends: the Standard Webhooks payload shape, `data` in the platform's snake_case. */
export interface ForwardedPayload {
  type: string
  timestamp: string
  data: {
    event_id: string
    order_id: number
    external_reference: string
    trade_id: string
    from: string | null
    to: string
    source: string
    sequence: number
    occurred_at: string
  }
}

export function forwardedPayload(event: ReactionEvent): ForwardedPayload {
  const occurredAt = event.occurredAt.toISOString()
  return {
    type: event.type,
    // the specification's `timestamp` is when the event happened, not when this attempt is sent
    timestamp: occurredAt,
    data: {
      event_id: event.eventId,
      order_id: event.orderId,
      external_reference: event.externalReference,
      trade_id: event.tradeId,
      from: event.from,
      to: event.to,
      source: event.source,
      sequence: event.sequence,
      occurred_at: occurredAt,
    },
  }
}
