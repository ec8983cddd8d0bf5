// Why an order-level trade operation was refused locally, before or instead of calling the platform, or
// why what the platform answered was not applied.
import type { PartnerEnv } from '../config.js'
import { linkedElsewhere, type Order } from '../orders/order.js'
import type { MilestoneRecord, TradeRecord } from '../partner-api/types.js'
import { isPathId } from '../partner-api/field-rules.js'
import { printable } from '../printable.js'

export type TradeOperationErrorCode =
  /** No order with this external reference. */
  | 'order_not_found'
  /** The order already has a trade. */
  | 'trade_exists'
  /** The trade is already linked to another order: it cannot be linked to this one too. */
  | 'trade_linked_elsewhere'
  /** A create was sent and its answer never came: the trade may exist. Retry only on purpose. */
  | 'trade_create_unknown'
  /** Another command is sending the order's create now: its answer may still come, so nothing is sent, even on --retry. */
  | 'trade_create_in_flight'
  /**
   * The platform created the trade, but the order it was sent for is gone or its create is no longer this command's
   * (its pending mark was changed meanwhile): nothing links the trade, and the message names it for `trades link`.
   */
  | 'trade_not_recorded'
  /**
   * The platform answered an operation, and the database could not record the answer (gone, the statement cut short or
   * timed out): the message names what the platform answered and what sets the order right. Never to be sent again.
   */
  | 'answer_not_recorded'
  /** The database took too long to stamp a create as leaving (a lock wait): nothing was sent, the order set back. */
  | 'database_slow'
  /** The order has no trade yet to run the operation on. */
  | 'no_trade'
  /** The platform answered with a record of another trade, order or milestone: nothing of it was applied. */
  | 'answer_mismatch'
  /** A stop (the operator's Ctrl-C) came before the call was sent: nothing was sent. */
  | 'stopped'
  /** The order's stored trade id cannot be put in a request's path ("..", blank): stored before such ids were refused. */
  | 'unusable_trade_id'
  /** The order's trade is on the other PARTNER_ENV's platform (orders.partner_env): nothing was sent. */
  | 'other_environment'

export class TradeOperationError extends Error {
  override name = 'TradeOperationError'
  constructor(
    readonly code: TradeOperationErrorCode,
    message: string,
  ) {
    super(message)
  }
}

/** The order has a trade already: it is not given another (`trades open`, `trades link`). */
export function tradeExists(order: Pick<Order, 'externalReference' | 'tradeId' | 'tradeStatus'>): TradeOperationError {
  return new TradeOperationError(
    'trade_exists',
    `Order ${order.externalReference} already has trade ${order.tradeId} (${order.tradeStatus ?? 'status unknown'})`,
  )
}

/**
 * The order's trade id, where a request's path can carry it. One the client refuses there ("..", ".", blank) was
 * stored by a version that took it from an answer or a webhook: every call on the order failed as a bad argument
 * (exit 2, "Invalid request: trade_id"), as if the operator had mistyped. It is the stored value that is wrong.
 */
/**
 * The order's trade id, for a call to the platform of `partnerEnv` (PARTNER_ENV, sandbox when absent): refused when
 * the order was linked under the other one. Sent, the call went to a platform that has no such trade (a 404 at best)
 * and could not move the order anyway (apply-observation.ts: trade_mismatch).
 */
export function tradeIdFor(order: Pick<Order, 'externalReference' | 'tradeId' | 'partnerEnv'>, partnerEnv: PartnerEnv = 'sandbox'): string {
  const elsewhere = linkedElsewhere(order, partnerEnv)
  if (elsewhere) {
    throw new TradeOperationError(
      'other_environment',
      `Order ${order.externalReference}'s trade is on the ${elsewhere} platform (linked under PARTNER_ENV=${elsewhere}), ` +
        `and this runs with PARTNER_ENV=${partnerEnv}: nothing was sent. Run it with PARTNER_ENV=${elsewhere}`,
    )
  }
  return usableTradeId(order.externalReference, order.tradeId!)
}

export function usableTradeId(externalReference: string, tradeId: string): string {
  if (isPathId(tradeId)) return tradeId
  throw new TradeOperationError(
    'unusable_trade_id',
    `Order ${externalReference} is linked to the trade id ${printable(JSON.stringify(tradeId))}, which ` +
      'no request can carry in its path (stored by a version that did not refuse it): nothing was sent, and this ' +
      "service cannot reach the order's trade. Act on the trade in the platform's dashboard or through its support",
  )
}

/**
 * The platform answered a record that is not the order's trade: nothing of it is applied or shown. `next` says
 * what the call may have done (a POST: not known; a GET: nothing) and what to do.
 */
export function answerMismatch(externalReference: string, asked: string, trade: TradeRecord, next: string): TradeOperationError {
  // the answered id and reference are the platform's text: on one line, so a line feed in them forges no line
  return new TradeOperationError(
    'answer_mismatch',
    `The platform answered for order ${externalReference} (${asked}) with the record of trade ` +
      `${printable(trade.trade_id)} for external reference ${printable(trade.external_reference)}: another trade ` +
      `or order. ${next}`,
  )
}

/**
 * A milestone operation answered the record of another milestone than the one it was sent for: nothing of it is
 * applied (a milestone record carries no trade status anyway) or shown, and what the call did is not known.
 */
export function milestoneAnswerMismatch(
  externalReference: string,
  asked: string,
  milestone: MilestoneRecord,
  next: string,
): TradeOperationError {
  // the answered id is the platform's text: on one line, so a line feed in it forges no line
  return new TradeOperationError(
    'answer_mismatch',
    `The platform answered for order ${externalReference} (${asked}) with the record of milestone ` +
      `${printable(milestone.milestone_id)}: another milestone. ${next}`,
  )
}

/**
 * A dispute, proposal or respond call answered a record that is not of what it was sent for (another proposal, a
 * record of another trade): nothing of it is applied or shown, and what the call did is not known.
 */
export function recordAnswerMismatch(externalReference: string, asked: string, answered: string, next: string): TradeOperationError {
  return new TradeOperationError('answer_mismatch', `The platform answered for order ${externalReference} (${asked}) with ${answered}. ${next}`)
}

/**
 * A stop came before the call was sent (CallGuard): nothing sent, the order as it was, or, when the same call
 * created it (`trades open` of a new order), created with no trade. `connecting`: the call had been handed to the
 * client, and the second stop signal came while its connection to the platform was still being set up
 * (PartnerStoppedBeforeSentError), so not one byte of it had been written.
 */
export function stoppedBeforeSending(
  externalReference: string,
  call: string,
  { orderCreated = false, connecting = false }: { orderCreated?: boolean; connecting?: boolean } = {},
): TradeOperationError {
  return new TradeOperationError(
    'stopped',
    `Stopped by a signal before ${call} for order ${externalReference} was sent` +
      (connecting ? ' (its connection to the platform was not up yet)' : '') +
      ': nothing sent to the platform, ' +
      (orderCreated ? 'the order created locally, with no trade' : 'the order as it was'),
  )
}
