// Fetches an order's trade from the platform for an operator to compare with the local order. Read-only:
// it records nothing (the poller is what applies polled statuses).
import { findOrderByExternalReference } from '../orders/order.repository.js'
import type { TradeRecord } from '../partner-api/types.js'
import type { TradeDeps } from './trade-deps.js'
import { TradeOperationError } from './trade-operation-error.js'

export async function getTradeForOrder(
  { db, client }: Pick<TradeDeps, 'db' | 'client'>,
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
  return { order, trade: await client.getTrade(order.tradeId) }
}
