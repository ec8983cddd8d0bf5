import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { PartnerKind } from '../config.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import type { ObservationSettings } from '../orders/apply-observation.js'
import type { PartnerApiClient } from '../partner-api/partner-api.client.js'
import { isOutcomeUnknown, PartnerNotSentError, PartnerValidationError } from '../partner-api/partner-api-error.js'

/** The platform calls the trades service makes: the client, or a fake of it in a test. */
export type PartnerTradeApi = Pick<
  PartnerApiClient,
  | 'createTrade'
  | 'getTrade'
  | 'fundTrade'
  | 'deliverTrade'
  | 'releaseTrade'
  | 'cancelTrade'
  | 'deliverMilestone'
  | 'releaseMilestone'
  | 'openDispute'
  | 'createProposal'
  | 'respondToProposal'
>

/**
 * How an operator's stop reaches a call that may move money or a trade (the CLI's Ctrl-C:
 * src/cli/hold-signals-for-call.ts). Absent (a service, a test), only the call's timeout ends a wait.
 */
export interface CallGuard {
  /** True once a stop was asked for: asked before anything is written and again right before sending. */
  stopRequested(): boolean
  /**
   * Called as the call is sent; the signal it answers is aborted (with PartnerAnswerAbandonedError) when the
   * operator stops waiting for the answer: the call then ends as a timeout does, outcome unknown.
   */
  sending(): AbortSignal
  /**
   * The call is over, and how (CallEnd): what is left is recording that locally. A stop signal then says what the call
   * came to, never "answered" for a call that was not. Called again by a recording that has decided what it writes
   * (CallEnd's `deciding`), with what it decided.
   */
  settled(end: CallEnd): void
  /**
   * A local write before the call is sent, `change` (a statement that runs on without the process on Postgres), is in
   * flight until the returned function is called: a stop that ends the process then says it may or may not have been
   * made, and `see` where to look.
   */
  writing?(write: { change: string; see: string }): () => void
  /**
   * The platform's answer, `answer` ("the answer to the fund call on trade tr_1"), is being recorded in one transaction
   * until the returned function is called, with whether that transaction committed: a stop that ends the process then
   * says whether the record may have been made (its COMMIT sent: not known) or was not (rolled back), and `see` where
   * to look and what to do.
   */
  recording?(record: { answer: string; see: string }): (committed: boolean) => void
}

/** `work`, the transaction recording an answer, its end told to `recording` (CallGuard.recording's): whether it committed. */
export function toldWhenRecorded<T>(recording: ((committed: boolean) => void) | undefined, work: Promise<T>): Promise<T> {
  return work.then(
    (made) => {
      recording?.(true)
      return made
    },
    (databaseError: unknown) => {
      recording?.(false)
      throw databaseError
    },
  )
}

/**
 * How a call to the platform ended. answered: a 2xx, whose record is recorded (or, `found`, what the recording writes
 * in a case only it can tell); refused: a 4xx, nothing done there;
 * not_sent: never written (a request refused before sending, no connection), nothing done there; unknown: no answer
 * (a timeout, a lost connection, the operator's abandoned wait) or a 5xx, the platform may or may not have done it.
 * `records` is the local write that follows a failed call ("the mark of order o_1's create as unknown"), and `see`
 * where to look.
 */
export type CallEnd =
  | {
      outcome: 'answered'
      /**
       * An answer whose record depends on what the recording reads first (`trades open`: the order, under its lock):
       * until the recording has decided, what it reads ("order o_1"). A stop signal then says the record is being
       * decided, and the recording settles the call again once it has (plain, or `found`): "recording and printing its
       * answer" was not true of an order gone, or whose create another command took over, meanwhile.
       */
      deciding?: string | undefined
      /**
       * What the recording found that makes it write something other than the answer's record ("order o_1 was linked
       * to trade tr_1 meanwhile"), what it records then ("the order's trade_mismatch flag", "nothing of it"), and where
       * to look and what to do should the process end before that is printed (in place of the recording's `see`).
       */
      found?: { what: string; records: string; see: string } | undefined
    }
  | {
      outcome: 'refused' | 'not_sent' | 'unknown'
      records?: { change: string; see: string } | undefined
      /**
       * In place of `records`, until the recording has decided what it writes (`trades open` answered with the record
       * of another order: the unknown mark, or, once it has read the order under its lock, nothing of an order gone,
       * the flag of one linked or whose create was taken over meanwhile): why the outcome is not known ("its answer is
       * the record of another order"), what it reads ("order o_1"), and where to look. The recording settles the call
       * again once it has, with its `records`.
       */
      deciding?: { why: string; reads: string; see: string } | undefined
    }

/** How a call that failed ended (CallEnd): any error other than no answer, a 5xx or one never sent is a refusal. */
export function failedCallOutcome(error: unknown): 'refused' | 'not_sent' | 'unknown' {
  if (isOutcomeUnknown(error)) return 'unknown'
  return error instanceof PartnerNotSentError || error instanceof PartnerValidationError ? 'not_sent' : 'refused'
}

export interface TradeDeps {
  db: Kysely<Database>
  client: PartnerTradeApi
  clock: Clock
  logger: Logger
  /**
   * EXPECTED_WEBHOOK_S: when to poll after an API call; how its answer is applied (observations.ts);
   * PARTNER_KIND, which a trade create is validated for before its order is created; and PARTNER_API_TIMEOUT_MS,
   * the longest a create can be at the platform (it is sent once, never retried), which tells a create another
   * command is sending from one whose command stopped.
   */
  settings: { expectedWebhookS: number; observation: ObservationSettings; partnerKind: PartnerKind; createTimeoutMs: number }
  guard?: CallGuard | undefined
  /** Tells the operator something of the order beside the call's answer (the CLI: a line on stderr); absent, only logged. */
  notice?: ((line: string) => void) | undefined
}
