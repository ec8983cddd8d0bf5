// Polls one claimed order: a signed GET of its trade (the client retries network errors, 429 and 5xx on
// its own), then the answer is applied as an observation with source `poll` through the same code as a
// webhook (src/orders: same rank rules, same history), addressed by the claim's lease token.
//
// An order whose stored trade id the client refuses in a path ("..", ".", blank: stored by a version that did not
// refuse it) is not sent at all: attention=unusable_trade_id, next_poll_at=null. Every GET of it would fail the same
// way before leaving this process, so backing off would retry it for good and nobody would hear of it.
//
// What each answer does to the order:
//   200       applied as an observation; applyObservation clears the lease, resets poll_attempts and
//             reschedules (STALE_AFTER_S later, never for a terminal status), whether or not it changed;
//             a record of another trade or of another order (its external_reference) is not applied:
//             attention=trade_mismatch, next_poll_at=null, as for a 404 (the platform or our link is
//             wrong, and polling again would answer the same)
//   404       attention=trade_not_found, next_poll_at=null: polling again would answer the same; an
//             operator looks and requeues (`reconcile --requeue`)
//   401       nothing written: the cycle stops and gives every claim back (reconcile-cycle.ts); a 401 that came
//             as the cycle was stopping for another reason counts too
//   otherwise next_poll_at = now + exponential backoff with jitter (backoff-delay.ts), and no sooner than
//             the answer's Retry-After (up to the backoff's cap); a 429 or a Retry-After also stops the cycle
//             (throttledFor)
// A write-back whose lease token no longer matches (the lease ran out and another replica claimed the
// order since) writes nothing: `lease_lost`.
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import { isSchemaMissing } from '../db/database-errors.js'
import type { Logger } from '../logger.js'
import { applyObservation, type ObservationOutcome, type ObservationSettings } from '../orders/apply-observation.js'
import { pollObservation } from '../orders/observations.js'
import { isPathId } from '../partner-api/field-rules.js'
import { PartnerApiError } from '../partner-api/partner-api-error.js'
import type { TradeRecord } from '../partner-api/types.js'
import { type BackoffSettings, backoffDelayS } from './backoff-delay.js'
import {
  type ClaimedOrder,
  flagForOperator,
  rescheduleAfterError,
  TRADE_MISMATCH,
  TRADE_NOT_FOUND,
  UNUSABLE_TRADE_ID,
} from '../orders/poll-schedule.repository.js'

/** The one platform call the poller makes: PartnerApiClient in production, a fake in tests. */
export interface TradeFetcher {
  getTrade(tradeId: string, options?: { signal?: AbortSignal }): Promise<TradeRecord>
}

export const POLL_RESULTS = [
  'applied',
  'unchanged',
  'stale',
  'not_found',
  'trade_mismatch',
  'unusable_trade_id',
  'error',
  'write_failed',
  'throttled',
  'unauthorized',
  'lease_lost',
] as const

/**
 * applied: the order moved; unchanged: the platform confirmed what we had; stale: the platform answered a
 * status ranked below ours (kept, see src/orders); not_found: 404, flagged; trade_mismatch: a record of
 * another trade or order, flagged; unusable_trade_id: the stored trade id cannot be put in a request's path, flagged
 * and nothing sent; error: no usable answer, backed off; write_failed: the platform answered (or nothing was to be
 * sent) but the database failed as the outcome was written, so nothing was, and the order comes due again when its
 * lease runs out; throttled: the platform asked us to slow down (a 429, or a
 * Retry-After on any answer), backed off at least as long as it asked and the cycle stops; unauthorized: 401, the cycle stops; lease_lost: another
 * replica owns the order now.
 */
export type PollResultKind = (typeof POLL_RESULTS)[number]

export interface PollResult {
  result: PollResultKind
  orderId: number
  externalReference: string
  tradeId: string
  /** The order's status before, and the status it has after (null when nothing was written). */
  fromStatus: string | null
  toStatus: string | null
  /** For `error` and `throttled`: when the order is tried again. */
  nextPollAt?: Date
  error?: unknown
}

const POLL_RESULT_OF: Record<ObservationOutcome, PollResultKind> = {
  applied: 'applied',
  duplicate_effect: 'unchanged',
  stale: 'stale',
  // a webhook's word only: a poll's unknown status is applied (the platform's own answer), never held back
  unknown_status: 'unchanged',
  // the claim's lease ran out and another replica claimed the order since
  lease_lost: 'lease_lost',
  // the order row is gone (deleted while it was polled): nothing of ours was written
  unmatched: 'lease_lost',
  // the answer is for another trade or another order: nothing applied, the order is flagged (below)
  trade_mismatch: 'trade_mismatch',
}

export interface PollOrderDeps {
  db: Kysely<Database>
  fetcher: TradeFetcher
  clock: Clock
  logger: Logger
  /** STALE_AFTER_S and the reaction handlers, as the observation statement applies a poll's answer. */
  observation: ObservationSettings
  backoff: BackoffSettings
  random: () => number
}

/**
 * Polls one claimed order and writes the outcome back under the claim's lease. Never throws: a failure
 * of the database itself counts as `write_failed` (`error` when the platform failed too) and the order comes due
 * again when its lease runs out.
 * Answers null when `signal` aborted the call (the cycle stopped): the caller gives that claim back. A 401 is
 * answered `unauthorized` even then: it came from the platform.
 */
export async function pollOrder(
  deps: PollOrderDeps,
  order: ClaimedOrder,
  leaseToken: string,
  signal: AbortSignal,
): Promise<PollResult | null> {
  const { db, fetcher, clock, logger } = deps
  const base = {
    orderId: order.orderId,
    externalReference: order.externalReference,
    tradeId: order.tradeId,
    fromStatus: order.tradeStatus,
  }
  if (!isPathId(order.tradeId)) {
    try {
      return await flagUnusableTradeId(deps, order, leaseToken, base)
    } catch (writeError) {
      if (!isSchemaMissing(writeError)) logger.warn({ err: writeError, orderId: order.orderId }, 'poll write-back failed')
      return { ...base, result: 'write_failed', toStatus: null, error: writeError }
    }
  }
  let trade: TradeRecord
  try {
    trade = await fetcher.getTrade(order.tradeId, { signal })
  } catch (error) {
    // a 401 is the platform's answer on our credentials (or our clock), whatever stopped the cycle while it came:
    // counted and reported as one, never as a call the cycle aborted
    if (error instanceof PartnerApiError && error.status === 401) {
      return { ...base, result: 'unauthorized', toStatus: null, error }
    }
    if (signal.aborted) return null
    try {
      return await writeBackFailure(deps, order, leaseToken, error)
    } catch (writeError) {
      // (the schema not whole stops the cycle, which says so once: reconcile-cycle.ts)
      if (!isSchemaMissing(writeError)) logger.warn({ err: writeError, orderId: order.orderId }, 'poll write-back failed')
      return { ...base, result: 'error', toStatus: null, error: writeError }
    }
  }

  try {
    const applied = await applyObservation(
      db,
      pollObservation({ orderId: order.orderId, leaseToken, version: order.version }, trade, new Date(clock.now())),
      deps.observation,
    )
    let result = POLL_RESULT_OF[applied.outcome]
    if (applied.outcome === 'trade_mismatch') {
      // GET /trades/{id} answered another trade, or a record of another order's: the platform or our link
      // is wrong; nothing was applied, and polling again would answer the same
      const flagged = await flagForOperator(db, {
        orderId: order.orderId,
        leaseToken,
        now: new Date(clock.now()),
        attention: TRADE_MISMATCH,
      })
      if (!flagged) result = 'lease_lost'
      else {
        logger.warn(
          {
            orderId: order.orderId,
            externalReference: order.externalReference,
            tradeId: order.tradeId,
            answeredTradeId: trade.trade_id,
            answeredExternalReference: trade.external_reference,
          },
          'the platform answered a different trade or another order\'s record than the one polled: order not changed, flagged trade_mismatch and no longer polled',
        )
      }
    }
    logger.debug(
      {
        orderId: order.orderId,
        tradeId: order.tradeId,
        result,
        from: applied.fromStatus,
        to: applied.toStatus,
      },
      'order polled',
    )
    return {
      ...base,
      result,
      fromStatus: applied.fromStatus ?? order.tradeStatus,
      toStatus: applied.toStatus,
    }
  } catch (error) {
    if (!isSchemaMissing(error)) logger.warn({ err: error, orderId: order.orderId }, 'applying a polled status failed')
    return { ...base, result: 'write_failed', toStatus: null, error }
  }
}

/**
 * When the platform asked us to slow down, after the client's own retries: how long it asked for, in ms (its
 * Retry-After, on any status; 0 for a 429 that did not say), at most `maxMs` (the error backoff's cap).
 * Undefined for any other failure.
 *
 * The cap: a Retry-After is the platform's word, and a wrong one (99999999999 seconds, a date in the year
 * 9999, more seconds than a date can hold) would otherwise put the orders off the schedule for centuries, with
 * no flag, gauge or alert to show it, or make a time no database can store and fail every write-back.
 */
export function throttledFor(error: unknown, maxMs: number): number | undefined {
  if (!(error instanceof PartnerApiError)) return undefined
  if (error.retryAfterMs !== undefined) return Math.min(error.retryAfterMs, maxMs)
  return error.status === 429 ? 0 : undefined
}

// The same rule as the CLI's (usableTradeId): the client would refuse the id as a bad argument before sending, on
// every poll alike. The id is the order's, and only an operator can act on it (in the platform's dashboard).
async function flagUnusableTradeId(
  deps: PollOrderDeps,
  order: ClaimedOrder,
  leaseToken: string,
  base: Omit<PollResult, 'result' | 'toStatus' | 'error'>,
): Promise<PollResult> {
  const { db, clock, logger } = deps
  const flagged = await flagForOperator(db, {
    orderId: order.orderId,
    leaseToken,
    now: new Date(clock.now()),
    attention: UNUSABLE_TRADE_ID,
    sent: false,
  })
  if (!flagged) return { ...base, result: 'lease_lost', toStatus: null }
  // the reference and the id are text from outside: fields (escaped in a JSON line, shown as \uXXXX on a terminal),
  // never spliced into the message
  logger.warn(
    { orderId: order.orderId, externalReference: order.externalReference, tradeId: order.tradeId },
    "the order's stored trade id cannot be put in a request's path (blank, . or ..): nothing sent, order flagged " +
      "unusable_trade_id and no longer polled; act on the trade in the platform's dashboard or through its support",
  )
  return { ...base, result: 'unusable_trade_id', toStatus: null }
}

async function writeBackFailure(
  deps: PollOrderDeps,
  order: ClaimedOrder,
  leaseToken: string,
  error: unknown,
): Promise<PollResult> {
  const { db, clock, logger } = deps
  const base = {
    orderId: order.orderId,
    externalReference: order.externalReference,
    tradeId: order.tradeId,
    fromStatus: order.tradeStatus,
    toStatus: null,
  }
  const now = clock.now()
  if (error instanceof PartnerApiError && error.status === 404) {
    const flagged = await flagForOperator(db, { orderId: order.orderId, leaseToken, now: new Date(now), attention: TRADE_NOT_FOUND })
    if (!flagged) return { ...base, result: 'lease_lost' }
    logger.warn(
      { orderId: order.orderId, externalReference: order.externalReference, tradeId: order.tradeId },
      'the platform does not know this trade (404): order flagged trade_not_found and no longer polled',
    )
    return { ...base, result: 'not_found', error }
  }
  const backoffMs = backoffDelayS(order.pollAttempts, deps.backoff, deps.random) * 1000
  const throttledMs = throttledFor(error, deps.backoff.capS * 1000)
  const nextPollAt = new Date(now + Math.max(backoffMs, throttledMs ?? 0))
  const rescheduled = await rescheduleAfterError(db, { orderId: order.orderId, leaseToken, nextPollAt })
  if (!rescheduled) return { ...base, result: 'lease_lost' }
  logger.debug(
    { orderId: order.orderId, tradeId: order.tradeId, attempts: order.pollAttempts, nextPollAt, err: error },
    'poll failed: backing off',
  )
  return { ...base, result: throttledMs === undefined ? 'error' : 'throttled', nextPollAt, error }
}
