// Why an order-level trade operation was refused locally, before or instead of calling the platform, or
// why what the platform answered was not applied.
import type { TradeRecord } from '../partner-api/types.js'

export type TradeOperationErrorCode =
  /** No order with this external reference. */
  | 'order_not_found'
  /** The order already has a trade. */
  | 'trade_exists'
  /** A create was sent and its answer never came: the trade may exist. Retry only on purpose. */
  | 'trade_create_unknown'
  /** The order has no trade yet to run the operation on. */
  | 'no_trade'
  /** The platform answered with a record of another trade or another order: nothing of it was applied. */
  | 'answer_mismatch'
  /** A stop (the operator's Ctrl-C) came before the call was sent: nothing was sent. */
  | 'stopped'

export class TradeOperationError extends Error {
  override name = 'TradeOperationError'
  constructor(
    readonly code: TradeOperationErrorCode,
    message: string,
  ) {
    super(message)
  }
}

/** The platform answered a record that is not the order's trade: not applied, and the call's effect unknown. */
export function answerMismatch(externalReference: string, tradeId: string, trade: TradeRecord, next: string): TradeOperationError {
  return new TradeOperationError(
    'answer_mismatch',
    `The platform answered for order ${externalReference} (${tradeId}) with the record of trade ${trade.trade_id} ` +
      `for external reference ${trade.external_reference}: another trade or order, so nothing was applied, and ` +
      `what the call did is not known. ${next}`,
  )
}

/**
 * A stop came before the call was sent (CallGuard): nothing sent, the order as it was, or, when the same call
 * created it (`trades open` of a new order), created with no trade.
 */
export function stoppedBeforeSending(
  externalReference: string,
  call: string,
  { orderCreated = false }: { orderCreated?: boolean } = {},
): TradeOperationError {
  return new TradeOperationError(
    'stopped',
    `Stopped by a signal before ${call} for order ${externalReference} was sent: nothing sent to the platform, ` +
      (orderCreated ? 'the order created locally, with no trade' : 'the order as it was'),
  )
}
