// Links an order that has no trade to a trade an operator found on the platform (its dashboard, its support): the
// way out of `trade_create_unknown` when the create's answer and its `trade.created` webhook were both lost, and
// the platform has no search to find the trade by reference. Sending the create again (`trades open --retry`)
// would make a second trade.
//
// The trade is taken only on the platform's word: a signed GET of it, whose record must be that trade and name the
// order's external reference. The record is then applied as a create's answer is: one observation (source `api`,
// apply-observation.ts), which links the trade, sets the create state `created`, clears `trade_create_unknown`,
// writes the status and its history row, and puts the order on the poll schedule STALE_AFTER_S later (as a poll's
// answer does: the GET is the platform's truth, and no webhook follows it).
//
// A webhook may link the order while the GET is under way: the order's row is locked before the decision, so the
// link is either this command's or the webhook's, never both. The same trade linked already is what the operator
// asked for (nothing changed); another trade is refused.
import type { Logger } from '../logger.js'
import { applyObservation } from '../orders/apply-observation.js'
import { apiObservation } from '../orders/observations.js'
import type { Order } from '../orders/order.js'
import { findOrderByExternalReference, findOrderById, lockOrderById, searchOrders } from '../orders/order.repository.js'
import type { TradeRecord } from '../partner-api/types.js'
import { validatePathId } from '../partner-api/validate-request.js'
import type { TradeDeps } from './trade-deps.js'
import { answerMismatch, TradeOperationError, tradeExists } from './trade-operation-error.js'

/**
 * linked: this call linked the trade (`previousAttention` is the flag the order had, now cleared when it was
 * trade_create_unknown). already_linked: the order had this trade already, by an earlier link or its webhook;
 * nothing was changed (no `trade` when that was known before the GET).
 */
export type LinkTradeResult =
  | { outcome: 'linked'; order: Order; trade: TradeRecord; previousAttention: string | null }
  | { outcome: 'already_linked'; order: Order; trade?: TradeRecord }

export async function linkTradeToOrder(
  { db, client, clock, logger, settings }: Pick<TradeDeps, 'db' | 'client' | 'clock' | 'logger' | 'settings'>,
  externalReference: string,
  tradeId: string,
): Promise<LinkTradeResult> {
  // the rule the client holds every id in a path to: refused here, before the order is even looked up
  validatePathId('trade_id', tradeId)
  const order = await findOrderByExternalReference(db, externalReference)
  if (!order) throw new TradeOperationError('order_not_found', `No order with external reference ${externalReference}`)
  if (order.tradeId === tradeId) return { outcome: 'already_linked', order }
  if (order.tradeId !== null) throw tradeExists(order)

  const trade = await client.getTrade(tradeId)
  const nothingLinked = 'Nothing was linked, and a GET changes nothing on the platform: check the trade id.'
  // the statement below checks the record's external reference, but only the caller knows which trade was asked for
  if (trade.trade_id !== tradeId) throw mismatch(logger, order, tradeId, trade, nothingLinked)

  const now = new Date(clock.now())
  const result = await db.transaction().execute(async (trx): Promise<LinkTradeResult> => {
    const current = await lockOrderById(trx, order.id)
    if (!current) throw new TradeOperationError('order_not_found', `Order ${externalReference} was deleted while its trade was fetched`)
    if (current.tradeId === tradeId) return { outcome: 'already_linked', order: current, trade }
    if (current.tradeId !== null) throw tradeExists(current)
    const observed = await applyObservation(trx, apiObservation({ orderId: order.id, externalReference, version: order.version }, trade, now), settings.observation)
    if (observed.outcome === 'trade_mismatch') {
      // the statement refused the link, the order being locked and unlinked: either the record names another
      // order, or it names this one and the trade is linked to another order already
      if (trade.external_reference !== externalReference) throw mismatch(logger, order, tradeId, trade, nothingLinked)
      const { orders: [holder] } = await searchOrders(trx, { tradeId }, { limit: 1 })
      throw new TradeOperationError(
        'trade_linked_elsewhere',
        `Trade ${tradeId} is linked to order ${holder?.externalReference ?? '?'} already, not to ${externalReference}: nothing was linked`,
      )
    }
    const linked = await findOrderById(trx, order.id)
    // an order with no trade has no status to be stale against; should one (seeded by hand) refuse the record, say so
    if (linked?.tradeId !== tradeId) {
      throw new Error(`Order ${externalReference} was not linked to trade ${tradeId}: the record was ${observed.outcome}`)
    }
    return { outcome: 'linked', order: linked, trade, previousAttention: current.attention }
  })
  if (result.outcome === 'linked') {
    logger.info(
      { externalReference, orderId: order.id, tradeId, status: trade.status, previousAttention: result.previousAttention },
      'trade linked to order by an operator',
    )
  }
  return result
}

function mismatch(logger: Logger, order: Order, tradeId: string, trade: TradeRecord, next: string): TradeOperationError {
  logger.warn(
    { externalReference: order.externalReference, orderId: order.id, tradeId, answeredTradeId: trade.trade_id },
    'the platform answered the GET of a trade to link with a record of another trade or order: nothing linked',
  )
  return answerMismatch(order.externalReference, `trade ${tradeId}`, trade, next)
}
