// Fetches an order's trade from the platform for an operator to compare with the local order. Read-only:
// it records nothing (the poller is what applies polled statuses).
import { findOrderByExternalReference } from '../orders/order.repository.js'
import type { TradeRecord } from '../partner-api/types.js'
import type { TradeDeps } from './trade-deps.js'
import { answerMismatch, TradeOperationError, tradeIdFor } from './trade-operation-error.js'

export async function getTradeForOrder(
  { db, client, logger, settings }: Pick<TradeDeps, 'db' | 'client' | 'logger'> & { settings?: Pick<TradeDeps['settings'], 'observation'> },
  externalReference: string,
): Promise<{ order: NonNullable<Awaited<ReturnType<typeof findOrderByExternalReference>>>; trade: TradeRecord }> {
  const order = await findOrderByExternalReference(db, externalReference)
  if (!order) throw new TradeOperationError('order_not_found', `No order with external reference ${externalReference}`)
  if (order.tradeId === null) {
    throw new TradeOperationError(
      'no_trade',
      `Order ${externalReference} has no trade yet (trade create state: ${order.tradeCreateState})`,
    )
  }
  const trade = await client.getTrade(tradeIdFor(order, settings?.observation.partnerEnv))
  // a record of another trade, or of the order's trade filed under another order's reference, is not this order's
  // trade: shown, it would pass for it. The rule every applied answer is held to (apply-observation.ts), and the
  // poller flags such an answer trade_mismatch
  if (trade.trade_id !== order.tradeId || trade.external_reference !== order.externalReference) {
    logger.warn(
      { externalReference, orderId: order.id, tradeId: order.tradeId, answeredTradeId: trade.trade_id },
      "the platform answered a GET of an order's trade with another trade's record: not shown",
    )
    throw answerMismatch(
      externalReference,
      `trade ${order.tradeId}`,
      trade,
      'Nothing of it is shown, and a GET changes nothing on the platform; the poller flags the order ' +
        'trade_mismatch if it is answered the same.',
    )
  }
  return { order, trade }
}
