// Creates the platform trade for one of the partner's orders and links the two.
//
// The create is the one call whose failure is dangerous: the API has no idempotency key, so a create whose
// answer never came (timeout, reset connection) may still have made the trade, and sending it again could
// make a second one. So the order carries a trade_create_state:
//   none     no create in flight; a create may be sent
//   pending  a create is being sent (set BEFORE the call: a crash mid-call leaves this behind)
//   unknown  a create was sent and its answer never came: never sent again on its own; the webhook that
//            carries the order's external_reference links the trade, or an operator retries on purpose
//   created  the platform answered with the trade, now linked
// An answer that is the record of another order (another external_reference) links nothing: `unknown`.
import { applyObservation } from '../orders/apply-observation.js'
import { createOrder } from '../orders/create-order.js'
import { apiObservation } from '../orders/observations.js'
import {
  findOrderByExternalReference,
  markTradeCreated,
  setTradeCreateState,
  startTradeCreate,
} from '../orders/order.repository.js'
import { isOutcomeUnknown } from '../partner-api/partner-api-error.js'
import type { CreateTradeRequest, TradeRecord } from '../partner-api/types.js'
import type { TradeDeps } from './trade-deps.js'
import { answerMismatch, TradeOperationError } from './trade-operation-error.js'

export type OpenTradeRequest = Omit<CreateTradeRequest, 'external_reference'>

export async function openTradeForOrder(
  deps: TradeDeps,
  externalReference: string,
  request: OpenTradeRequest,
  { retry = false }: { retry?: boolean } = {},
): Promise<TradeRecord> {
  const { db, client, clock, logger, settings } = deps
  let order = await findOrderByExternalReference(db, externalReference)
  if (!order) {
    await createOrder(db, { externalReference, now: () => new Date(clock.now()) }, settings.observation)
    order = await findOrderByExternalReference(db, externalReference)
    if (!order) throw new Error(`Order ${externalReference} vanished right after it was created`)
  }
  if (order.tradeId !== null) {
    throw new TradeOperationError(
      'trade_exists',
      `Order ${externalReference} already has trade ${order.tradeId} (${order.tradeStatus ?? 'status unknown'})`,
    )
  }
  const previousState = order.tradeCreateState
  if ((previousState === 'unknown' || previousState === 'pending') && !retry) {
    throw new TradeOperationError(
      'trade_create_unknown',
      `A trade create for order ${externalReference} was sent and its answer never came (state ${previousState}): ` +
        'the trade may exist and will be linked when its webhook arrives. Check the platform, then send it again ' +
        'only on purpose with --retry (a second create can make a second trade).',
    )
  }
  // compare-and-set: of two concurrent opens only one moves the order to pending
  const claimed = await startTradeCreate(db, order.id, previousState, new Date(clock.now()))
  if (!claimed) {
    throw new TradeOperationError(
      'trade_create_unknown',
      `Order ${externalReference} changed while its trade was being opened (another create is in flight?)`,
    )
  }

  let trade: TradeRecord
  try {
    trade = await client.createTrade({ ...request, external_reference: externalReference })
  } catch (error) {
    if (isOutcomeUnknown(error)) {
      await setTradeCreateState(db, order.id, 'unknown', new Date(clock.now()))
      logger.warn(
        { externalReference, orderId: order.id, err: error },
        'trade create outcome unknown: the order is not sent a second create on its own',
      )
    } else {
      // refused (by validation or by the platform) or never sent (no connection could be made): this
      // create made nothing. Back to where it was, so a
      // refused --retry does not erase the evidence of an earlier create that may have worked.
      await setTradeCreateState(db, order.id, previousState === 'created' ? 'none' : previousState, new Date(clock.now()))
    }
    throw error
  }

  const now = clock.now()
  const applied = await applyObservation(
    db,
    apiObservation({ orderId: order.id, externalReference }, trade, new Date(now)),
    settings.observation,
  )
  if (applied.outcome === 'trade_mismatch') {
    // the answer is a record of another order: nothing was linked, and whether this create made a trade
    // is not known, so it is not sent again on its own
    await setTradeCreateState(db, order.id, 'unknown', new Date(now))
    logger.warn(
      { externalReference, orderId: order.id, answeredTradeId: trade.trade_id },
      'trade create answered with a record of another order: not linked, outcome unknown',
    )
    throw answerMismatch(
      externalReference,
      'a trade create',
      trade,
      'The create is marked unknown: check the platform, then send it again only on purpose with --retry.',
    )
  }
  await markTradeCreated(db, order.id, { nextPollAt: new Date(now + settings.expectedWebhookS * 1000), now: new Date(now) })
  logger.info(
    { externalReference, orderId: order.id, tradeId: trade.trade_id, status: trade.status },
    'trade created for order',
  )
  return trade
}
