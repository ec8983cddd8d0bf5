// Creates the platform trade for one of the partner's orders and links the two.
//
// The create is the one call whose failure is dangerous: the API has no idempotency key (the platform does not
// even refuse a second create with the same external_reference), so a create whose answer never came (timeout,
// reset connection) may still have made the trade, and sending it again could make a second one. So the order
// carries a trade_create_state:
//   none     no create in flight; a create may be sent
//   pending  a create is being sent (set BEFORE the call: a crash mid-call leaves this behind). Marked first as not
//            sent (a negative trade_create_wait_ms), then stamped as it leaves (markTradeCreateSending): the create's
//            whole time counts from that stamp, and the stamp comes back within SEND_WITHIN_MS of being issued or the
//            create is not sent, so a statement that waited on a lock no longer eats the time of a create still to
//            be sent (an outside review saw a --retry send a second create while the first was at the platform). A
//            mark never stamped is a create never sent: its command stopped before sending (a Ctrl-C during a mark
//            that waited on a lock, committed after the process ended); once its time is up, `trades open` sends
//            it without --retry, where it was called a create whose answer was lost
//   unknown  a create was sent and its answer never came: never sent again on its own; the webhook that
//            carries the order's external_reference links the trade, or an operator retries on purpose
//   created  the platform answered with the trade, now linked
// A pending create is another command's call in flight until its whole time is up (the marking command's own
// PARTNER_API_TIMEOUT_MS after it was marked, a create being sent once, and CREATE_MARGIN_MS, stored with the mark
// as trade_create_wait_ms, so that a command with a shorter timeout judges it by the sender's): until then nothing is sent, --retry included, since
// its answer may still come and link the trade. Past it, the command that marked it stopped without a word (a
// crash), and it is as unknown: --retry takes it over. The mark is stamped, and judged, by the database's clock,
// never a process's: a CLI whose clock ran 20 s ahead of the sender's called its create, 2.5 s old, stopped, and the
// --retry it advised made a second trade (an outside review).
// An answer that is the record of another order (another external_reference) links nothing: `unknown`. An answer
// naming another trade than the one the order was linked to meanwhile (by its webhook or another command, while a
// --retry was at the platform) means the platform may hold a second trade for the order: the order is flagged
// trade_mismatch for an operator. An answer is recorded in one transaction (the observation that links the trade and
// `created`, or the flag), whole or not at all, and only under this command's own pending mark: an order gone (deleted,
// a database restored or failed over to a copy without it) or whose mark is another's (a --retry took the create over,
// a restore brought back the row from before the mark) records nothing of it, and the command fails naming the trade
// the platform made (trade_not_recorded), for `trades link`; sending the create again would make a second one.
//
// With a CallGuard (the CLI's Ctrl-C): a stop asked for before the create is sent stops it there, nothing
// sent, the order's state as it was, and so does one that ends the call while its connection is still being set up
// (nothing written); once it is sent, an operator who stops waiting for the answer leaves the order as a timeout
// does, `unknown`. Once it is answered, a stop says what the recording writes: an answer of another order is told from
// the answer as a create whose outcome is not known, its record being decided until the recording has read the order
// (then the unknown mark, or what it found, as below); one of the order's own as being decided until
// the recording has read the order under its lock, then as what it found (a trade linked meanwhile: the trade_mismatch
// flag; the order gone, or its create no longer this command's: nothing, or the flag; the trade another order's: the
// mark), with where to look should a third signal end the process.
//
// An order this call created stays, whatever the create then does (creating it applied the webhooks parked for
// its reference): with nothing sent or the create refused, it is `none`, and the same open sends it.
import { applyObservation } from '../orders/apply-observation.js'
import { checkOrderReference, createOrder } from '../orders/create-order.js'
import { apiObservation } from '../orders/observations.js'
import { type Order, unsentCreate } from '../orders/order.js'
import {
  databaseNow,
  findOrderByExternalReference,
  flagTakenOverCreate,
  lockOrderById,
  markTradeCreated,
  markTradeCreateSending,
  setTradeCreateState,
  startTradeCreate,
} from '../orders/order.repository.js'
import { flagLinkedOrder, TRADE_MISMATCH } from '../orders/poll-schedule.repository.js'
import { PartnerStoppedBeforeSentError } from '../partner-api/partner-api-error.js'
import type { CreateTradeRequest, TradeRecord } from '../partner-api/types.js'
import { validateCreateTrade } from '../partner-api/validate-request.js'
import { printable } from '../printable.js'
import { quoteForShell } from '../quote-for-shell.js'
import { databaseFailureWords, NotRecordedLocallyError } from './local-record-failure.js'
import { failedCallOutcome, toldWhenRecorded, type TradeDeps } from './trade-deps.js'
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
  // marked by a command that has not sent it: past its time, that command stopped before sending, and nothing is at
  // the platform (a stop during the mark whose statement committed after the process ended)
  const unsent = unsentCreate(order)
  // by the database's clock, which stamped the mark: this process's may be ahead of the sender's or behind
  const judgedAt = previousState === 'pending' ? await databaseNow(db) : undefined
  // a pending create's whole time: until then its command may still get the answer that links the trade
  const settledBy = previousState === 'pending' ? createSettledBy(order, settings.createTimeoutMs) : undefined
  if (settledBy && judgedAt !== undefined && judgedAt < settledBy.getTime()) throw createInFlight(order, settledBy, judgedAt, retry)
  if ((previousState === 'unknown' || (previousState === 'pending' && !unsent)) && !retry) throw createUnknown(order)
  if (unsent) {
    deps.notice?.(
      `Order ${printable(externalReference)}'s create was marked at ${order.updatedAt.toISOString()} by a command that ` +
        'stopped before sending it: nothing was sent then, and this command sends it',
    )
  }
  // what the state goes back to when this create made nothing: a pending one taken over had lost its command, and
  // its create is as unknown as one that timed out; one never sent made nothing
  const restoredState = previousState === 'created' || unsent ? 'none' : previousState === 'pending' ? 'unknown' : previousState
  const marking = guard?.writing?.({
    change: `the mark of order ${printable(externalReference)}'s create (pending, not sent)`,
    see: `\`orders show ${quoteForShell(externalReference)}\` shows it (\`create pending (marked, not sent)\`: the next \`trades open\` sends it once its time is up)`,
  })
  // compare-and-set: of two concurrent opens only one moves the order to pending, and a pending create is taken
  // over only while it is the one judged above and its whole time is past (by the database's clock), not one marked
  // since
  const waitMs = createWaitMs(settings.createTimeoutMs)
  let markedAt = await startTradeCreate(db, order.id, previousState, {
    waitMs,
    ...(settledBy ? { takeOver: { markedBy: order.updatedAt, wholeTimeMs: waitMs, unsent } } : {}),
  }).finally(() => marking?.())
  if (!markedAt) throw await claimLost(deps, externalReference, retry)
  // this command's later writes of the create state name its mark: one whose create another command took over
  // (judged stopped) changes nothing of the other's
  let claim = { claim: markedAt }
  const putBack = async () => {
    const writing = guard?.writing?.({
      change: `the setting back of order ${printable(externalReference)}'s create`,
      see: `\`orders show ${quoteForShell(externalReference)}\` shows it; nothing was sent to the platform`,
    })
    await setTradeCreateState(db, order.id, restoredState, claim).finally(() => writing?.())
  }
  if (guard?.stopRequested()) {
    // the stop came while the order was being marked: nothing was sent, so back to where it was (a pending create
    // taken over: unknown, as above)
    await putBack()
    throw stopped()
  }
  // The stamp the create's whole time counts from, written as it leaves. The first mark's time is its statement's
  // start, and a statement that waited on a lock for most of DATABASE_STATEMENT_TIMEOUT_MS ate the create's whole
  // time: another command called it stopped while it was still to be sent, and its --retry sent a second create
  // (an outside review). The create is sent only when the stamp came back within SEND_WITHIN_MS of being issued:
  // its time counted from the stamp then covers its send, its PARTNER_API_TIMEOUT_MS and a late timer.
  for (let attempt = 1; ; attempt += 1) {
    const issued = performance.now()
    const writing = guard?.writing?.({
      change: `the sent stamp of order ${printable(externalReference)}'s create`,
      see:
        `nothing was sent to the platform: if \`orders show ${quoteForShell(externalReference)}\` shows its create pending ` +
        '(not marked "not sent"), it is read as sent, and `trades open … --retry` sends it',
    })
    const stamped = await markTradeCreateSending(db, order.id, markedAt, waitMs).finally(() => writing?.())
    if (!stamped) throw await claimLost(deps, externalReference, retry)
    markedAt = stamped
    claim = { claim: markedAt }
    const tookMs = performance.now() - issued
    if (tookMs <= SEND_WITHIN_MS) break
    if (attempt === SEND_STAMP_ATTEMPTS) {
      await putBack()
      throw new TradeOperationError(
        'database_slow',
        `The database took ${(tookMs / 1000).toFixed(1)} s to stamp order ${externalReference}'s create as leaving ` +
          `(${SEND_STAMP_ATTEMPTS} times over ${SEND_WITHIN_MS / 1000} s: a lock wait?): nothing was sent to the platform, ` +
          `and the order is set back to ${restoredState}. Run the command again once the database answers in time.`,
      )
    }
  }
  if (guard?.stopRequested()) {
    await putBack()
    throw stopped()
  }

  let trade: TradeRecord
  try {
    const body = { ...request, external_reference: externalReference }
    trade = await (guard ? client.createTrade(body, { signal: guard.sending() }) : client.createTrade(body))
  } catch (error) {
    const outcome = failedCallOutcome(error)
    // a timeout, a lost connection, the operator who stopped waiting, or a 5xx (a gateway's 502 or 504): the
    // trade may exist
    if (outcome === 'unknown') {
      const mark = {
        change: `the mark of order ${printable(externalReference)}'s create as unknown (its outcome not known)`,
        see: `\`orders show ${quoteForShell(externalReference)}\` shows it; do not send the create again before checking the platform`,
      }
      guard?.settled({ outcome, records: mark })
      const writing = guard?.writing?.(mark)
      const marked = await setTradeCreateState(db, order.id, 'unknown', claim).finally(() => writing?.()).catch((databaseError: unknown) => {
        // the create's outcome is still the news (`[outcome_unknown]`), never the database's "try again later"
        logger.error({ externalReference, orderId: order.id, err: error, databaseErr: databaseError }, 'trade create outcome unknown, and the order could not be marked unknown')
        throw new NotRecordedLocallyError(
          error,
          `The database could not mark the order's create unknown (${databaseFailureWords(databaseError)}): it stays ` +
            `pending, and \`trades open\` reads it as unanswered once its time is up (\`[trade_create_unknown]\`): ` +
            `the webhook that carries the order's reference links the trade if the create made one, and \`trades link\` ` +
            'links one found on the platform. Do not send the create again before checking the platform.',
        )
      })
      logger.warn(
        { externalReference, orderId: order.id, err: error, markedUnknown: marked },
        marked
          ? 'trade create outcome unknown: the order is not sent a second create on its own'
          : 'trade create outcome unknown; the order was linked or its create taken over by another command meanwhile, and is left as that one set it',
      )
    } else {
      // refused (by validation, or by the platform with a 4xx) or never sent (no connection could be made): this
      // create made nothing. Back to where it was, so a
      // refused --retry does not erase the evidence of an earlier create that may have worked.
      const settingBack = {
        change: `the setting back of order ${printable(externalReference)}'s create (this create made no trade)`,
        see: `\`orders show ${quoteForShell(externalReference)}\` shows it`,
      }
      guard?.settled({ outcome, records: settingBack })
      const writing = guard?.writing?.(settingBack)
      await setTradeCreateState(db, order.id, restoredState, claim).finally(() => writing?.()).catch((databaseError: unknown) => {
        logger.error({ externalReference, orderId: order.id, err: error, databaseErr: databaseError }, 'trade create made nothing, and the order could not be set back')
        throw new NotRecordedLocallyError(
          error,
          `The database could not set the order's create back to ${restoredState} (${databaseFailureWords(databaseError)}): ` +
            `it stays pending, and \`trades open\` reads it as unanswered once its time is up; this create made no ` +
            'trade (above), so `--retry` then sends it without making a second.',
        )
      })
      // the operator's second stop signal came while the connection was being set up: said as a stop before sending
      if (error instanceof PartnerStoppedBeforeSentError) {
        throw stoppedBeforeSending(externalReference, 'the trade create', { orderCreated, connecting: true })
      }
    }
    throw error
  }
  // Told before the recording, which a stop signal's line precedes: an answer that is the record of another order (its
  // external_reference another's) links nothing, and what the create did is not known, as after a timeout; the
  // recording marks the create unknown, unless it finds the order gone, linked or its create taken over meanwhile
  // (below, unchanged), so a stop says it is being decided until then too. What the recording writes of an answer of
  // the order's own is known only once it has read the order under its lock (linked meanwhile, gone, its create taken
  // over) and applied the answer (the trade another order's): until then a stop says it is being decided, and then
  // what was found (decided, below). It was said as "recording and printing its answer", which none of those is
  const otherOrder = trade.external_reference !== externalReference
  const answeredTrade = printable(trade.trade_id)
  const orderWords = `order ${printable(externalReference)}`
  const createSee = `\`orders show ${quoteForShell(externalReference)}\``
  const tradeId = quoteForShell(answeredTrade)
  const link = `\`trades link ${quoteForShell(externalReference)} ${tradeId}\``
  const requeue = `\`reconcile --requeue ${quoteForShell(externalReference)}\``
  const otherSee = `${createSee} shows what the order records of its create; do not send the create again before checking the platform`
  // of another order's answer too, what the recording writes is known only once it has read the order: the unknown
  // mark, or nothing (the order gone, its create no longer this command's), or the flag (a trade linked, the create
  // taken over meanwhile). It was said as "recording the mark", with the flag as an "instead"
  guard?.settled(
    otherOrder
      ? { outcome: 'unknown', deciding: { why: 'its answer is the record of another order', reads: orderWords, see: otherSee } }
      : { outcome: 'answered', deciding: orderWords },
  )
  // what the recording found, said by a stop signal from then on: the line, and where to look should the process end.
  // An answer of another order stays a create whose outcome is not known, with what the recording writes instead of
  // the mark (its trade is another order's: never one to link)
  const decided = (found?: { what: string; records: string; see: string }) => {
    if (!otherOrder) guard?.settled({ outcome: 'answered', found })
    else if (found) guard?.settled({ outcome: 'unknown', records: { change: `${found.records} (${found.what})`, see: otherSee } })
  }

  const now = clock.now()
  const orderId = order.id
  const recording = guard?.recording?.(
    otherOrder
      ? {
          answer: `the answer to ${orderWords}'s create (trade ${answeredTrade}, another order's)`,
          see: otherSee,
        }
      : {
          answer: `trade ${answeredTrade}, created by the platform for ${orderWords}`,
          // before the recording has decided: true too of an order linked to another trade meanwhile, which
          // `trades link` would refuse (said only "if not, `trades link` links it")
          see:
            `${createSee} says whether the order has the trade; if it has none, ${link} links it (never \`trades open ` +
            '--retry`: it would make a second trade); if it has another, the platform may hold two trades for it: cancel the one not linked',
        },
  )
  const recorded = await toldWhenRecorded(
    recording,
    db.transaction().execute(async (trx): Promise<Recorded> => {
    // the row locked before the decision, as `trades link` does: a webhook linking the order waits for this
    // transaction, or linked it before, and the answer is judged against the trade it linked
    const locked = await lockOrderById(trx, orderId)
    // a row of another reference under the order's id: the order was deleted, and a database restored or failed over
    // to a copy without it gave its id to another order since
    const current = locked?.externalReference === externalReference ? locked : undefined
    if (!current) {
      decided({
        what: `${orderWords} is gone`,
        records: 'nothing of it',
        see:
          `once an ${orderWords} exists with no trade, ${link} links the trade (its webhook too); never \`trades open\`: ` +
          'it would make a second trade',
      })
      return { outcome: 'not_recorded', flagged: false }
    }
    if (current.tradeId != null && current.tradeId !== trade.trade_id) {
      // the order's trade came meanwhile (the first create's webhook, `trades link`, or the create this --retry
      // replaced): this answer is another trade, which no order holds and nothing will poll, so an operator is told
      // on the order itself, where a log line alone would be lost
      const linked = printable(current.tradeId)
      decided({
        what: `${orderWords} was linked to trade ${linked} meanwhile`,
        records: "the order's trade_mismatch flag",
        see:
          `${createSee} shows trade ${linked} (and the trade_mismatch flag, if recorded): the platform may hold a second ` +
          `trade for the order; check its trades there, cancel the one not linked, then ${requeue} if the order is flagged`,
      })
      await flagLinkedOrder(trx, { orderId, now: new Date(now), attention: TRADE_MISMATCH })
      return { outcome: 'second_trade', linkedTradeId: current.tradeId }
    }
    // no trade linked, and the pending mark is not the one this command wrote: the order's create is no longer this
    // command's (a --retry took it over, a restore or failover brought back a row from before the mark, or it was
    // set by hand). Its answer is not recorded against the order, as none of this command's later writes would be
    // (setTradeCreateState's claim): linked, it told an operator the trade was created while the row said otherwise
    if (current.tradeId === null && !holdsMark(current, markedAt)) {
      // pending under another command's mark: a --retry took the create over, and its create may make (or have made)
      // a trade too, which it will link. Two trades for one order: flagged for an operator on the order itself, as a
      // second trade answered after a link is, where this command's failure and log line alone would be lost (its
      // create was judged stopped)
      if (current.tradeCreateState !== 'pending') {
        decided({
          what: `${orderWords}'s create is no longer this command's (now ${current.tradeCreateState})`,
          records: 'nothing of it',
          see: `${createSee} shows the order's create; check the platform before any retry, then link this trade with ${link}`,
        })
        return { outcome: 'not_recorded', flagged: false }
      }
      decided({
        what: `${orderWords}'s create was taken over by another command`,
        records: "the order's trade_mismatch flag",
        see:
          `${createSee} shows the other command's create (and the trade_mismatch flag, if recorded): check the order's trades ` +
          `on the platform, cancel the one not linked (${answeredTrade}, unless that create failed: then link it with ${link}), ` +
          `then ${requeue} if the order is flagged`,
      })
      await flagTakenOverCreate(trx, orderId)
      return { outcome: 'not_recorded', flagged: true }
    }
    if (otherOrder) {
      // decided: applyObservation finds any record of another reference a trade_mismatch, and its write may wait on a
      // lock (the mark follows it)
      guard?.settled({
        outcome: 'unknown',
        records: {
          change: `the mark of ${orderWords}'s create as unknown (its answer is the record of another order)`,
          see: `${createSee} shows it; do not send the create again before checking the platform`,
        },
      })
    }
    const observed = await applyObservation(
      trx,
      apiObservation({ orderId, externalReference, version: order.version }, trade, new Date(now)),
      settings.observation,
    )
    if (observed.outcome === 'trade_mismatch') {
      // the answer is a record of another order: nothing was linked, and whether this create made a trade
      // is not known, so it is not sent again on its own. Of the order's own reference, the trade is another order's
      if (!otherOrder) {
        decided({
          what: `trade ${answeredTrade} is another order's`,
          records: `the mark of ${orderWords}'s create as unknown`,
          see: otherSee,
        })
      }
      const marked = await setTradeCreateState(trx, orderId, 'unknown', claim)
      return { outcome: 'mismatch', markedUnknown: marked }
    }
    decided()
    await markTradeCreated(trx, orderId, { pollAfterS: settings.expectedWebhookS, now: new Date(now) })
    return { outcome: 'linked' }
  }),
  ).catch((databaseError: unknown) => {
      // the platform made the trade: its id is the news, never the database's "try again later" (a second create
      // would make a second trade)
      logger.error(
        { externalReference, orderId, tradeId: trade.trade_id, tradeReference: trade.reference, err: databaseError },
        'trade created on the platform but not recorded: the database could not record the answer',
      )
      throw databaseLostTrade(externalReference, trade, databaseError)
    })
  if (recorded.outcome === 'second_trade') {
    logger.warn(
      {
        externalReference,
        orderId,
        tradeId: recorded.linkedTradeId,
        answeredTradeId: trade.trade_id,
        answeredExternalReference: trade.external_reference,
      },
      'trade create answered with another trade than the one the order was linked to meanwhile: not applied, the ' +
        'platform may hold a second trade for the order; flagged trade_mismatch and no longer polled',
    )
    throw answerMismatch(
      externalReference,
      'a trade create',
      trade,
      `Nothing of it was applied: the order was linked to trade ${recorded.linkedTradeId} meanwhile (by its webhook or ` +
        'another command), so the platform may now hold a second trade for it. The order is flagged trade_mismatch ' +
        'and polled no more: check its trades on the platform, cancel the one not linked, then ' +
        `\`reconcile --requeue ${externalReference}\`.`,
    )
  }
  if (recorded.outcome === 'not_recorded') throw await notRecorded(deps, externalReference, orderId, trade, recorded.flagged)
  if (recorded.outcome === 'mismatch') {
    logger.warn(
      { externalReference, orderId, answeredTradeId: trade.trade_id },
      'trade create answered with a record of another order: not linked, outcome unknown',
    )
    throw answerMismatch(
      externalReference,
      'a trade create',
      trade,
      recorded.markedUnknown
        ? 'Nothing was linked, and whether the create made a trade is not known: it is marked unknown; check the ' +
            'platform, then send it again only on purpose with --retry.'
        : 'Nothing was linked, and whether the create made a trade is not known; another command took the order ' +
            'over meanwhile, and it is left as that one set it: check it with `trades get`.',
    )
  }
  logger.info(
    { externalReference, orderId: order.id, tradeId: trade.trade_id, status: trade.status },
    'trade created for order',
  )
  return trade
}

type Recorded =
  | { outcome: 'linked' }
  | { outcome: 'not_recorded'; flagged: boolean }
  | { outcome: 'mismatch'; markedUnknown: boolean }
  | { outcome: 'second_trade'; linkedTradeId: string }

/**
 * Beyond PARTNER_API_TIMEOUT_MS, what a pending create's whole time allows for: the moments between its mark and its
 * send, and a timer that fires late (the mark is stamped and judged by one clock, the database's).
 */
export const CREATE_MARGIN_MS = 5_000

/**
 * The longest a create's sent stamp (markTradeCreateSending) may take to come back for the create to be sent: the
 * create then leaves within this of its stamp, inside CREATE_MARGIN_MS, which leaves the rest for a late timer.
 */
export const SEND_WITHIN_MS = 2_000

/** How many times a sent stamp slower than SEND_WITHIN_MS is written again before the command gives up, nothing sent. */
const SEND_STAMP_ATTEMPTS = 3

/** The longest whole time stored (trade_create_wait_ms is an integer column): about 24.8 days. */
export const LONGEST_CREATE_WAIT_MS = 2_147_483_647

/**
 * A create's whole time, for a command whose own timeout is `createTimeoutMs`. PARTNER_API_TIMEOUT_MS may be as
 * large as the column holds, and the margin took it past: the create failed with "out of range for type integer".
 */
export function createWaitMs(createTimeoutMs: number): number {
  return Math.min(createTimeoutMs + CREATE_MARGIN_MS, LONGEST_CREATE_WAIT_MS)
}

/**
 * When a pending create's command has had its answer or its timeout, whichever comes: the mark and its whole time,
 * as that command stored it (this command's own for a mark written before trade_create_wait_ms).
 */
function createSettledBy(order: Order, createTimeoutMs: number): Date {
  // negative while marked and not sent (startTradeCreate)
  return new Date(order.updatedAt.getTime() + Math.abs(order.tradeCreateWaitMs ?? createWaitMs(createTimeoutMs)))
}

function createInFlight(order: Order, settledBy: Date, now: number, retry: boolean): TradeOperationError {
  const ageS = ((now - order.updatedAt.getTime()) / 1000).toFixed(1)
  const since = `pending since ${order.updatedAt.toISOString()}, ${ageS} s ago`
  const whenUnknown = `if it is not answered, it counts as unanswered (unknown) from ${settledBy.toISOString()} on`
  if (unsentCreate(order)) {
    return new TradeOperationError(
      'trade_create_in_flight',
      `A trade create for order ${order.externalReference} was marked by another command (${since}) and has not been ` +
        `sent yet: nothing was sent${retry ? ', --retry included' : ''}. If that command sends it, its answer links the trade ` +
        `(see \`trades get ${order.externalReference}\`); if it has not sent it by ${settledBy.toISOString()}, it ` +
        'stopped before sending, and `trades open` sends it then',
    )
  }
  return new TradeOperationError(
    'trade_create_in_flight',
    retry
      ? `A trade create for order ${order.externalReference} is being sent by another command right now (${since}): ` +
          `--retry sends nothing while its answer may still come and link the trade; ${whenUnknown}`
      : `A trade create for order ${order.externalReference} is being sent by another command right now (${since}): ` +
          `nothing was sent. Its answer links the trade (see \`trades get ${order.externalReference}\`); ${whenUnknown}`,
  )
}

function createUnknown(order: Order): TradeOperationError {
  const what =
    order.tradeCreateState === 'pending'
      ? `was sent at ${order.updatedAt.toISOString()} and its answer was never recorded (state pending, past its ` +
        'timeout: the command sending it stopped)'
      : // a 5xx or a 504 from a gateway is an answer too, one that does not say whether the trade was made
        `was sent and no answer said whether it made the trade (state ${order.tradeCreateState})`
  return new TradeOperationError(
    'trade_create_unknown',
    `A trade create for order ${order.externalReference} ${what}: the trade may exist and will be linked when its ` +
      'webhook arrives. Check the platform, then send it again only on purpose with --retry (a second create can ' +
      'make a second trade).',
  )
}

/**
 * The platform made the trade, and the database could not record it (gone, the statement cut short or timed out): the
 * order is left pending under this command's mark, which `trades open` reads as unanswered once its time is up. The
 * trade id is said here, for `trades link`; its webhook links it too.
 */
function databaseLostTrade(externalReference: string, trade: TradeRecord, databaseError: unknown): TradeOperationError {
  const tradeId = printable(trade.trade_id)
  const reference = quoteForShell(externalReference)
  return new TradeOperationError(
    'trade_not_recorded',
    `The platform created trade ${tradeId} (${printable(trade.status)}) for order ${externalReference}, but the ` +
      `database could not record it (${databaseFailureWords(databaseError)}): the order is left pending, with no ` +
      'trade. Its webhook links the trade when it arrives; else link it once the database is back with ' +
      `\`trades link ${reference} ${quoteForShell(tradeId)}\`. Do not send the create again: \`trades open ${reference} ` +
      '--retry` would make a second trade.',
  )
}

/** Another command marked the order between the look and the mark: say what it left. */
async function claimLost(
  { db, settings }: Pick<TradeDeps, 'db' | 'settings'>,
  externalReference: string,
  retry: boolean,
): Promise<TradeOperationError> {
  const current = await findOrderByExternalReference(db, externalReference)
  if (current?.tradeId != null) return tradeExists(current)
  if (current?.tradeCreateState === 'pending') {
    return createInFlight(current, createSettledBy(current, settings.createTimeoutMs), await databaseNow(db), retry)
  }
  return new TradeOperationError(
    'trade_create_in_flight',
    `Order ${externalReference} changed while its trade was being opened: another command sent its create ` +
      `meanwhile (state now ${current?.tradeCreateState ?? 'gone'}). Nothing was sent; run the command again to see ` +
      'where it stands',
  )
}

/** The order is pending under this command's own mark (startTradeCreate's answer): its create is still this command's. */
function holdsMark(order: Order, markedAt: Date): boolean {
  return order.tradeCreateState === 'pending' && order.updatedAt.getTime() === markedAt.getTime()
}

/**
 * The platform made the trade, and nothing records it: the order is gone, or its create is no longer this command's.
 * Said at error level, and in the command's failure, with the trade id: the one way to find the trade again without
 * the platform's dashboard, and what `trades link` takes. Sending the create again would make a second trade.
 */
async function notRecorded(
  { db, logger }: Pick<TradeDeps, 'db' | 'logger'>,
  externalReference: string,
  orderId: number,
  trade: TradeRecord,
  flagged: boolean,
): Promise<TradeOperationError> {
  const now = await findOrderByExternalReference(db, externalReference)
  // an answer that is the record of another order (its external_reference another's) is no trade of this order's: what
  // the create did is not known, and that trade is never one to link to it (it was said as created for the order, with
  // `trades link` of it as the advice, and logged as such)
  const otherOrder = trade.external_reference !== externalReference
  logger.error(
    {
      externalReference,
      orderId,
      tradeId: trade.trade_id,
      tradeReference: trade.reference,
      ...(otherOrder ? { answerExternalReference: trade.external_reference } : {}),
      orderNow: now ? { orderId: now.id, tradeId: now.tradeId, tradeCreateState: now.tradeCreateState } : null,
      flaggedTradeMismatch: flagged,
    },
    otherOrder
      ? "trade create answered with another order's record, not recorded: the order is gone or its create is no longer " +
          "this command's; what the create did is not known"
      : "trade created on the platform but not recorded: the order is gone or its create is no longer this command's; " +
          'nothing links the trade',
  )
  // the platform's text: on one line, so a line feed in it forges no line
  const tradeId = printable(trade.trade_id)
  // commands to copy: each word quoted for a shell where it needs it (a reference may hold `$(…)`)
  const reference = quoteForShell(externalReference)
  const link = `\`trades link ${reference} ${quoteForShell(tradeId)}\``
  if (otherOrder) return notRecordedOtherOrder(externalReference, orderId, tradeId, now, flagged)
  const created = `The platform created trade ${tradeId} for order ${externalReference}, but nothing records it: `
  if (!now) {
    return new TradeOperationError(
      'trade_not_recorded',
      created +
        `${goneWords(externalReference)}. Its webhook links the trade once an order ${externalReference} ` +
        `exists again; else link it then with ${link}. Check the platform before any retry: \`trades open ` +
        `${reference}\` would make a second trade.`,
    )
  }
  const changed = whatChanged(externalReference, orderId, now)
  return new TradeOperationError(
    'trade_not_recorded',
    created +
      `${changed}, so this command links nothing. ` +
      (flagged
        ? 'The create that took it over may make a second trade, and links it: the order is flagged trade_mismatch and ' +
          'polled no more. Check its trades on the platform, cancel the one not linked (this one, unless that create ' +
          `failed: then link this one with ${link}), then \`reconcile --requeue ${reference}\`.`
        : `Check the platform before any retry (\`trades open ${reference}\` would make another trade, and another ` +
          `create for the order may have made one too), then link this one with ${link}.`),
  )
}

/** The order gone while its create was at the platform (notRecorded). */
function goneWords(externalReference: string): string {
  return (
    `there is no order ${externalReference} any more (deleted, or the database restored or failed over to a copy ` +
    'without it, while the create was at the platform)'
  )
}

/** What became of the order while its create was at the platform, its row found again (notRecorded). */
function whatChanged(externalReference: string, orderId: number, now: Order): string {
  if (now.id !== orderId) return `order ${externalReference} was deleted and created again while the create was at the platform`
  return (
    `order ${externalReference}'s create is no longer this command's (its create state is now ` +
    `${now.tradeCreateState}${now.tradeCreateState === 'pending' ? `, marked at ${now.updatedAt.toISOString()}` : ''}: ` +
    'another command took it over, the database was restored or failed over to a copy from before the mark, or ' +
    'the row was changed by hand)'
  )
}

/**
 * notRecorded's failure for an answer that is the record of another order: the create's outcome not known, nothing
 * marked (the order gone, or its create no longer this command's), and no trade of the answer's to link.
 */
function notRecordedOtherOrder(externalReference: string, orderId: number, tradeId: string, now: Order | undefined, flagged: boolean): TradeOperationError {
  const reference = quoteForShell(externalReference)
  const answered =
    `The platform answered order ${externalReference}'s create with the record of another order (trade ${tradeId}): ` +
    'whether the create made a trade for this order is not known, and nothing records it: '
  if (!now) {
    return new TradeOperationError(
      'trade_not_recorded',
      answered +
        `${goneWords(externalReference)}. Look on the platform for a trade of reference ` +
        `${externalReference}: its webhook links it once an order ${externalReference} exists again. Do not send the ` +
        `create again before checking there: \`trades open ${reference}\` may make a second trade.`,
    )
  }
  return new TradeOperationError(
    'trade_not_recorded',
    answered +
      `${whatChanged(externalReference, orderId, now)}, so this command links nothing. ` +
      (flagged
        ? 'The create that took it over links the order\'s trade: the order is flagged trade_mismatch and polled no ' +
          `more. Check the order's trades on the platform, cancel any not linked, then \`reconcile --requeue ${reference}\`.`
        : `Check the platform for a trade of reference ${externalReference} before any retry (\`trades open ${reference}\` ` +
          'may make another, and another create for the order may have made one too).'),
  )
}
