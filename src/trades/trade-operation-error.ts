// Why an order-level trade operation was refused locally, before or instead of calling the platform, or
// why what the platform answered was not applied.
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

export class TradeOperationError extends Error {
  override name = 'TradeOperationError'
  constructor(
    readonly code: TradeOperationErrorCode,
    message: string,
  ) {
    super(message)
  }
}
