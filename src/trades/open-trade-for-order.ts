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
// An answer is recorded in one transaction (the observation that links the trade and `created`), whole or not
// at all.
//
// With a CallGuard (the CLI's Ctrl-C): a stop asked for before the create is sent stops it there, nothing
// sent, the order's state as it was; once it is sent, an operator who stops waiting for the answer leaves the
// order as a timeout does, `unknown`.
//
// An order this call created stays, whatever the create then does (creating it applied the webhooks parked for
// its reference): with nothing sent or the create refused, it is `none`, and the same open sends it.
import { applyObservation } from '../orders/apply-observation.js'
import { checkOrderReference, createOrder } from '../orders/create-order.js'
import { apiObservation } from '../orders/observations.js'
import {
  findOrderByExternalReference,
  markTradeCreated,
  setTradeCreateState,
  startTradeCreate,
} from '../orders/order.repository.js'
import { isOutcomeUnknown } from '../partner-api/partner-api-error.js'
import type { CreateTradeRequest, TradeRecord } from '../partner-api/types.js'
import { validateCreateTrade } from '../partner-api/validate-request.js'
import type { TradeDeps } from './trade-deps.js'
import { answerMismatch, stoppedBeforeSending, TradeOperationError, tradeExists } from './trade-operation-error.js'

export type OpenTradeRequest = Omit<CreateTradeRequest, 'external_reference'>

export interface OpenTradeOptions {
  /** Send the create although an earlier one may have made the trade (state unknown or pending). */
  retry?: boolean
  /** Called when this call created the order, before the create is sent: the order stays if the create fails. */
  onOrderCreated?: () => void
}

export async function openTradeForOrder(
  deps: TradeDeps,
  externalReference: string,
  request: OpenTradeRequest,
  { retry = false, onOrderCreated }: OpenTradeOptions = {},
): Promise<TradeRecord> {
  const { db, client, clock, logger, settings, guard } = deps
  let orderCreated = false
  const stopped = () => stoppedBeforeSending(externalReference, 'the trade create', { orderCreated })
  if (guard?.stopRequested()) throw stopped()
  // a request that fails validation is refused before anything is written: the client would refuse it only
  // after the order was created, and an order would be left behind by a mistyped --amount
  checkOrderReference(externalReference, settings.observation)
  validateCreateTrade({ ...request, external_reference: externalReference }, settings.partnerKind)
  let order = await findOrderByExternalReference(db, externalReference)
  if (!order) {
    await createOrder(db, { externalReference, now: () => new Date(clock.now()) }, settings.observation)
    order = await findOrderByExternalReference(db, externalReference)
    if (!order) throw new Error(`Order ${externalReference} vanished right after it was created`)
    orderCreated = true
    onOrderCreated?.()
  }
  if (order.tradeId !== null) throw tradeExists(order)
  const previousState = order.tradeCreateState
  if ((previousState === 'unknown' || previousState === 'pending') && !retry) {
    throw new TradeOperationError(
      'trade_create_unknown',
      `A trade create for order ${externalReference} was sent and its answer never came (state ${previousState}): ` +
        'the trade may exist and will be linked when its webhook arrives. Check the platform, then send it again ' +
        'only on purpose with --retry (a second create can make a second trade).',
    )
  }
  // what the state goes back to when this create made nothing
  const restoredState = previousState === 'created' ? 'none' : previousState
  // compare-and-set: of two concurrent opens only one moves the order to pending
  const claimed = await startTradeCreate(db, order.id, previousState, new Date(clock.now()))
  if (!claimed) {
    throw new TradeOperationError(
      'trade_create_unknown',
      `Order ${externalReference} changed while its trade was being opened (another create is in flight?)`,
    )
  }
  if (guard?.stopRequested()) {
    // the stop came while the order was being marked: nothing was sent, so back to where it was
    await setTradeCreateState(db, order.id, restoredState, new Date(clock.now()))
    throw stopped()
  }

  let trade: TradeRecord
  try {
    const body = { ...request, external_reference: externalReference }
    trade = await (guard ? client.createTrade(body, { signal: guard.sending() }) : client.createTrade(body))
  } catch (error) {
    guard?.settled()
    // a timeout, a lost connection, or the operator who stopped waiting: the trade may exist
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
      await setTradeCreateState(db, order.id, restoredState, new Date(clock.now()))
    }
    throw error
  }
  guard?.settled()

  const now = clock.now()
  const orderId = order.id
  const applied = await db.transaction().execute(async (trx) => {
    const observed = await applyObservation(
      trx,
      apiObservation({ orderId, externalReference }, trade, new Date(now)),
      settings.observation,
    )
    if (observed.outcome === 'trade_mismatch') {
      // the answer is a record of another order: nothing was linked, and whether this create made a trade
      // is not known, so it is not sent again on its own
      await setTradeCreateState(trx, orderId, 'unknown', new Date(now))
    } else {
      await markTradeCreated(trx, orderId, {
        nextPollAt: new Date(now + settings.expectedWebhookS * 1000),
        now: new Date(now),
      })
    }
    return observed
  })
  if (applied.outcome === 'trade_mismatch') {
    logger.warn(
      { externalReference, orderId: order.id, answeredTradeId: trade.trade_id },
      'trade create answered with a record of another order: not linked, outcome unknown',
    )
    throw answerMismatch(
      externalReference,
      'a trade create',
      trade,
      'Nothing was linked, and whether the create made a trade is not known: it is marked unknown; check the ' +
        'platform, then send it again only on purpose with --retry.',
    )
  }
  logger.info(
    { externalReference, orderId: order.id, tradeId: trade.trade_id, status: trade.status },
    'trade created for order',
  )
  return trade
}
