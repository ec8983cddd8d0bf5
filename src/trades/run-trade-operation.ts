// Runs one platform operation on the trade of an order and records what it learned: the trade status the
// platform answered (an observation with source `api`) and a poll EXPECTED_WEBHOOK_S later, in case the
// webhook that should follow never comes. Both in one transaction: an answer is recorded whole or not at all.
// A dispute or proposal record, and a milestone record (a milestone operation may answer either record),
// carry no trade status: for those only the poll is scheduled.
//
// With a CallGuard (the CLI's Ctrl-C), a stop asked for before the call is sent stops it there, nothing sent (as does
// a second one while its connection is still being set up);
// once sent, only the operator's giving up on the answer ends the wait, and that is recorded as a timeout is
// (a poll soon), since the operation may have taken effect.
import { applyObservation } from '../orders/apply-observation.js'
import { apiObservation } from '../orders/observations.js'
import { findOrderByExternalReference } from '../orders/order.repository.js'
import { schedulePollAfterApiCall } from '../orders/poll-schedule.repository.js'
import type { CallOptions } from '../partner-api/partner-api.client.js'
import { PartnerStoppedBeforeSentError } from '../partner-api/partner-api-error.js'
import { printable } from '../printable.js'
import { quoteForShell } from '../quote-for-shell.js'
import type {
  CreateProposalRequest,
  DisputeRecord,
  MilestoneAnswer,
  MilestoneRecord,
  OpenDisputeRequest,
  ProposalRecord,
  RespondResult,
  RespondToProposalRequest,
  TradeRecord,
} from '../partner-api/types.js'
import { databaseFailureWords, NotRecordedLocallyError } from './local-record-failure.js'
import { failedCallOutcome, type PartnerTradeApi, toldWhenRecorded, type TradeDeps } from './trade-deps.js'
import {
  answerMismatch,
  milestoneAnswerMismatch,
  recordAnswerMismatch,
  stoppedBeforeSending,
  TradeOperationError,
  tradeIdFor,
} from './trade-operation-error.js'

const NOTHING_APPLIED = 'Nothing of it was applied, and what the call did is not known: check with `trades get`; the order is polled soon.'

export type TradeOperation =
  | { kind: 'fund' | 'deliver' | 'release' | 'cancel' }
  | { kind: 'deliver_milestone' | 'release_milestone'; milestoneId: string }
  | { kind: 'dispute'; request: OpenDisputeRequest }
  | { kind: 'proposal'; request: CreateProposalRequest }
  | { kind: 'respond'; proposalId: string; request: RespondToProposalRequest }

/** What each operation answers. */
export interface TradeOperationResults {
  fund: TradeRecord
  deliver: TradeRecord
  release: TradeRecord
  cancel: TradeRecord
  deliver_milestone: MilestoneAnswer
  release_milestone: MilestoneAnswer
  dispute: DisputeRecord
  proposal: ProposalRecord
  respond: RespondResult
}

export async function runTradeOperation<O extends TradeOperation>(
  deps: TradeDeps,
  externalReference: string,
  operation: O,
): Promise<TradeOperationResults[O['kind']]> {
  const { db, client, clock, logger, settings, guard } = deps
  const order = await findOrderByExternalReference(db, externalReference)
  if (!order) throw new TradeOperationError('order_not_found', `No order with external reference ${externalReference}`)
  if (order.tradeId === null) {
    const hint =
      order.tradeCreateState === 'unknown' || order.tradeCreateState === 'pending'
        ? ': a create was sent but no answer said whether it made the trade; it is linked when its webhook arrives'
        : ': open one first with `trades open`'
    throw new TradeOperationError('no_trade', `Order ${externalReference} has no trade yet${hint}`)
  }
  const tradeId = tradeIdFor(order, settings.observation.partnerEnv)
  const schedulePoll = (executor: typeof db) =>
    schedulePollAfterApiCall(executor, order.id, { pollAfterS: settings.expectedWebhookS, now: new Date(clock.now()) })
  const shown = quoteForShell(externalReference)
  // the poll brought forward with one statement outside a transaction, after the call: a stop that ends the process
  // while it is in flight says it may or may not be made (CallGuard.writing)
  const pollForward = {
    change: `the poll of order ${printable(externalReference)} brought forward`,
    see: `\`orders show ${shown}\` gives its next poll, and \`trades get ${shown}\` the platform's record`,
  }
  const schedulePollAlone = async () => {
    const writing = guard?.writing?.(pollForward)
    return schedulePoll(db).finally(() => writing?.())
  }

  if (guard?.stopRequested()) {
    throw stoppedBeforeSending(externalReference, `the ${operation.kind} call on trade ${tradeId}`)
  }
  let result: TradeOperationResults[TradeOperation['kind']]
  try {
    result = await callTradeApi(client, tradeId, operation, guard && { signal: guard.sending() })
  } catch (error) {
    const outcome = failedCallOutcome(error)
    // the poll is brought forward after a call whose outcome is not known, and nothing is written after another
    guard?.settled(outcome === 'unknown' ? { outcome, records: pollForward } : { outcome })
    // it may have taken effect (a timeout, or the operator stopped waiting): let the poller find out soon
    // rather than after STALE_AFTER_S
    if (outcome === 'unknown') {
      try {
        await schedulePollAlone()
      } catch (databaseError) {
        // the call's outcome is still the news: `[outcome_unknown]`, never the database's "try again later"
        logger.error(
          { externalReference, orderId: order.id, tradeId, operation: operation.kind, err: databaseError },
          'trade operation outcome unknown, and its poll could not be scheduled',
        )
        throw new NotRecordedLocallyError(
          error,
          `The database could not schedule the order's poll soon (${databaseFailureWords(databaseError)}): the poller ` +
            `looks at it at its next regular poll (\`reconcile --requeue-open\` brings every open order's forward once ` +
            `the database is back); \`trades get ${externalReference}\` shows the platform's record now. Do not send the ` +
            `call again before checking: it may have been done.`,
        )
      }
    }
    // the operator's second stop signal came while the connection was being set up: nothing was written, and the
    // order is as it was (no poll soon: nothing happened on the platform)
    if (error instanceof PartnerStoppedBeforeSentError) {
      throw stoppedBeforeSending(externalReference, `the ${operation.kind} call on trade ${tradeId}`, { connecting: true })
    }
    throw error
  }
  // checked before anything of the answer is recorded: an answer not of what the call was sent for leaves what the
  // call did unknown, and only the poll is brought forward, so a stop signal says so, never that an answer is being
  // recorded and printed (neither is). A fund or milestone call's was found only by the recording (a trade record's
  // trade_mismatch, a milestone record's id after it), once the signal had said "recording and printing its answer"
  const mismatch = mismatchOf(operation, result, { tradeId, externalReference: order.externalReference })
  guard?.settled(mismatch ? { outcome: 'unknown', records: pollForward } : { outcome: 'answered' })
  if (mismatch) {
    // the call was sent for our trade (and milestone or proposal), but the record that came back is not of it: nothing
    // is applied from it, a respond's trade status included (another proposal's acceptance moved the order to
    // resolved). The answer is the news: a poll that could not be scheduled is logged, and the poller's regular one
    // stands
    await schedulePollAlone().catch((databaseError: unknown) =>
      logger.error({ externalReference, orderId: order.id, err: databaseError }, "the order's poll could not be scheduled"),
    )
    logger.warn({ externalReference, orderId: order.id, tradeId, operation: operation.kind, ...mismatch.logged }, mismatch.log)
    throw mismatch.error
  }
  const trade = tradeOf(operation, result)
  const recording = guard?.recording?.({
    answer: `the platform's answer to the ${operation.kind} call on trade ${printable(tradeId)} for order ${printable(externalReference)}`,
    see:
      `\`orders show ${shown}\` shows what the order records, and \`trades get ${shown}\` the platform's record ` +
      '(the poller brings the order to it); do not send the call again: the platform did it',
  })
  const applied = await toldWhenRecorded(
    recording,
    db.transaction().execute(async (trx) => {
    const observed = trade
      ? await applyObservation(
          trx,
          apiObservation({ orderId: order.id, externalReference, version: order.version }, trade, new Date(clock.now())),
          settings.observation,
        )
      : undefined
    await schedulePoll(trx)
    return observed
  }),
  ).catch((databaseError: unknown) => {
      // the platform did it: what it answered is said, with what the order could not record, never "try again"
      logger.error(
        { externalReference, orderId: order.id, tradeId, operation: operation.kind, err: databaseError },
        'trade operation answered, and its answer could not be recorded: the order shows what it showed before',
      )
      throw answerNotRecorded(externalReference, tradeId, operation, result, trade, databaseError, order.tradeStatus)
    })
  if (trade && applied?.outcome === 'trade_mismatch') {
    // the operation was sent on our trade, but what came back is not its record: what it did is not known. Its ids
    // were checked before (mismatchOf): the database's judgement stands should the two ever differ
    logger.warn(
      { externalReference, orderId: order.id, tradeId, operation: operation.kind, answeredTradeId: trade.trade_id },
      'the platform answered a record of another trade or order: order not changed',
    )
    throw answerMismatch(
      externalReference,
      `trade ${tradeId}`,
      trade,
      NOTHING_APPLIED,
    )
  }
  if (trade && applied?.outcome === 'stale' && applied.toStatus !== null && applied.toStatus !== trade.status) {
    // the order had moved past what the answer holds (a webhook or a poll during the call, or before it): the answer
    // is printed as it came, and the order keeps the later status
    deps.notice?.(
      `The order is at ${printable(applied.toStatus)}, past the ${printable(trade.status)} this answer holds: ` +
        'a later event of the trade came first, and the order keeps it',
    )
  }
  const milestone = milestoneRecordOf(operation, result)
  logger.info(
    {
      externalReference,
      orderId: order.id,
      tradeId,
      operation: operation.kind,
      status: trade?.status,
      // which record a milestone operation answered: a milestone record has no trade status to apply
      ...(isMilestoneOperation(operation) && { record: (result as MilestoneAnswer).record }),
      ...(milestone && { milestoneId: milestone.answered.milestone_id, milestoneStatus: milestone.answered.status }),
    },
    'trade operation done',
  )
  return result as TradeOperationResults[O['kind']]
}

/**
 * The platform answered `operation`, and the database could not record the answer: what the platform answered (the
 * trade's id and status, the proposal's or dispute's id), what the order still shows, and what sets it right.
 */
function answerNotRecorded(
  externalReference: string,
  tradeId: string,
  operation: TradeOperation,
  result: unknown,
  trade: TradeRecord | undefined,
  databaseError: unknown,
  orderStatus: string | null,
): TradeOperationError {
  const answered = answeredWords(operation, result, trade)
  const still = trade
    ? `order ${externalReference} still shows ${printable(orderStatus ?? 'no status')}, and its poll soon was not scheduled`
    : `order ${externalReference}'s poll soon was not scheduled`
  return new TradeOperationError(
    'answer_not_recorded',
    `The platform did the ${operation.kind} call on trade ${tradeId}: ${answered}. The database could not record it ` +
      `(${databaseFailureWords(databaseError)}): ${still}. Do not send it again. The trade's webhook moves the order ` +
      `when it arrives, and the poller at its next regular poll (\`reconcile --requeue-open\` brings every open ` +
      `order's forward once the database is back); \`trades get ${externalReference}\` shows the platform's record now.`,
  )
}

/** What an answer says, for a line: the platform's ids and statuses, each on one line (printable). */
function answeredWords(operation: TradeOperation, result: unknown, trade: TradeRecord | undefined): string {
  switch (operation.kind) {
    case 'dispute': {
      const dispute = result as DisputeRecord
      return `dispute ${printable(dispute.dispute_id)} is ${printable(String(dispute.status))}`
    }
    case 'proposal': {
      const proposal = result as ProposalRecord
      return `proposal ${printable(proposal.proposal_id)} is ${printable(String(proposal.status))}`
    }
    case 'respond': {
      const { proposal } = result as RespondResult
      return `proposal ${printable(proposal.proposal_id)} is ${printable(String(proposal.status))}, trade ` +
        `${printable(trade?.trade_id ?? '?')} is ${printable(trade?.status ?? '?')}`
    }
    default: {
      const milestone = milestoneRecordOf(operation, result)
      if (milestone) return `milestone ${printable(milestone.answered.milestone_id)} is ${printable(String(milestone.answered.status ?? '?'))}`
      return `trade ${printable(trade?.trade_id ?? '?')} is ${printable(trade?.status ?? '?')}`
    }
  }
}

/** The platform call behind an operation, and nothing else (no order, no observation). */
export function callTradeApi(
  client: PartnerTradeApi,
  tradeId: string,
  operation: TradeOperation,
  options?: CallOptions,
): Promise<TradeOperationResults[TradeOperation['kind']]> {
  // passed on only when given (a fake client records the arguments it is called with)
  const extra = (options ? [options] : []) as [CallOptions?]
  switch (operation.kind) {
    case 'fund':
      return client.fundTrade(tradeId, ...extra)
    case 'deliver':
      return client.deliverTrade(tradeId, ...extra)
    case 'release':
      return client.releaseTrade(tradeId, ...extra)
    case 'cancel':
      return client.cancelTrade(tradeId, ...extra)
    case 'deliver_milestone':
      return client.deliverMilestone(tradeId, operation.milestoneId, ...extra)
    case 'release_milestone':
      return client.releaseMilestone(tradeId, operation.milestoneId, ...extra)
    case 'dispute':
      return client.openDispute(tradeId, operation.request, ...extra)
    case 'proposal':
      return client.createProposal(tradeId, operation.request, ...extra)
    case 'respond':
      return client.respondToProposal(tradeId, operation.proposalId, operation.request, ...extra)
  }
}

/**
 * The trade record an operation answered, if any: dispute, proposal and milestone records carry no trade status.
 */
function tradeOf(operation: TradeOperation, result: unknown): TradeRecord | undefined {
  switch (operation.kind) {
    case 'dispute':
    case 'proposal':
      return undefined
    case 'respond':
      return (result as RespondResult).trade
    case 'deliver_milestone':
    case 'release_milestone': {
      const answer = result as MilestoneAnswer
      return answer.record === 'trade' ? answer.trade : undefined
    }
    default:
      return result as TradeRecord
  }
}

/**
 * What the call answered when it is not the record of what it was sent for, as the command's failure
 * (`[answer_mismatch]`) and the warning logged: a dispute or proposal record naming another trade, another proposal
 * than the one responded to, a trade record of another trade or another order (apply-observation.ts would find it a
 * trade_mismatch), or the record of another milestone. Undefined when it is.
 */
function mismatchOf(
  operation: TradeOperation,
  result: unknown,
  own: { tradeId: string; externalReference: string },
): { error: TradeOperationError; log: string; logged: Record<string, unknown> } | undefined {
  const other = otherRecordOf(operation, result, own.tradeId)
  if (other) {
    return {
      error: recordAnswerMismatch(own.externalReference, other.asked, printable(other.answered), NOTHING_APPLIED),
      log: 'the platform answered a record of something else than the call was for: order not changed',
      logged: { answered: other.answered },
    }
  }
  const trade = tradeOf(operation, result)
  if (trade && (trade.trade_id !== own.tradeId || trade.external_reference !== own.externalReference)) {
    return {
      error: answerMismatch(own.externalReference, `trade ${own.tradeId}`, trade, NOTHING_APPLIED),
      log: 'the platform answered a record of another trade or order: order not changed',
      logged: { answeredTradeId: trade.trade_id, answeredExternalReference: trade.external_reference },
    }
  }
  const milestone = milestoneRecordOf(operation, result)
  if (milestone && milestone.answered.milestone_id !== milestone.asked) {
    // a milestone record carries no trade status: nothing would be applied from it anyway
    return {
      error: milestoneAnswerMismatch(own.externalReference, `milestone ${milestone.asked} of trade ${own.tradeId}`, milestone.answered, NOTHING_APPLIED),
      log: 'the platform answered the record of another milestone: order not changed',
      logged: { milestoneId: milestone.asked, answeredMilestoneId: milestone.answered.milestone_id },
    }
  }
  return undefined
}

/**
 * What a dispute, proposal or respond call answered when it is not of what the call was sent for: a record naming
 * another trade, or another proposal than the one responded to. Undefined when it is (or names no trade).
 */
function otherRecordOf(operation: TradeOperation, result: unknown, tradeId: string): { asked: string; answered: string } | undefined {
  const ofAnotherTrade = (kind: string, id: string, record: { trade_id?: string | undefined }) =>
    record.trade_id !== undefined && record.trade_id !== tradeId ? `the record of ${kind} ${id} of trade ${record.trade_id}: another trade` : undefined
  switch (operation.kind) {
    case 'dispute': {
      const dispute = result as DisputeRecord
      const answered = ofAnotherTrade('dispute', dispute.dispute_id, dispute)
      return answered === undefined ? undefined : { asked: `a dispute on trade ${tradeId}`, answered }
    }
    case 'proposal': {
      const proposal = result as ProposalRecord
      const answered = ofAnotherTrade('proposal', proposal.proposal_id, proposal)
      return answered === undefined ? undefined : { asked: `a proposal on trade ${tradeId}`, answered }
    }
    case 'respond': {
      const { proposal } = result as RespondResult
      const asked = `proposal ${operation.proposalId} of trade ${tradeId}`
      if (proposal.proposal_id !== operation.proposalId) return { asked, answered: `the record of proposal ${proposal.proposal_id}: another proposal` }
      const answered = ofAnotherTrade('proposal', proposal.proposal_id, proposal)
      return answered === undefined ? undefined : { asked, answered }
    }
    default:
      return undefined
  }
}

/** The milestone record a milestone operation answered, if that is the record that came, beside the id it was sent for. */
function milestoneRecordOf(
  operation: TradeOperation,
  result: unknown,
): { asked: string; answered: MilestoneRecord } | undefined {
  if (!isMilestoneOperation(operation)) return undefined
  const answer = result as MilestoneAnswer
  return answer.record === 'milestone' ? { asked: operation.milestoneId, answered: answer.milestone } : undefined
}

function isMilestoneOperation(operation: TradeOperation): operation is Extract<TradeOperation, { milestoneId: string }> {
  return operation.kind === 'deliver_milestone' || operation.kind === 'release_milestone'
}
