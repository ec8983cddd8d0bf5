// `trades ...`: create and move the platform trade of one of your orders (named by its external reference).
// The platform is the configured one, or the in-process sandbox in local mode.
import type { Command } from 'commander'
import { printable } from '../printable.js'
import { quoteForShell } from '../quote-for-shell.js'
import {
  isOutcomeUnknown,
  PartnerAnswerAbandonedError,
  PartnerApiError,
  PartnerInvalidResponseError,
  PartnerNetworkError,
  PartnerNotSentError,
  PartnerStoppedBeforeSentError,
  PartnerTimeoutError,
  PartnerValidationError,
} from '../partner-api/partner-api-error.js'
import type { CreateTradeRequest, DisputeRecord, MilestoneAnswer, MilestoneInput, MilestoneRecord, TradeRecord } from '../partner-api/types.js'
import type { TradeDeps } from '../trades/trade-deps.js'
import { NotRecordedLocallyError } from '../trades/local-record-failure.js'
import { TradeOperationError } from '../trades/trade-operation-error.js'
import { orderReference } from './cli-arguments.js'
import {
  type ChangeInFlight,
  CommandFailedError,
  escaped,
  markTookEffect,
  printJson,
  runsInService,
  setExitCode,
  StoppedBySignalError,
  UsageError,
  withDatabase,
  write,
  writeError,
} from './cli-context.js'
import { explainRefusal, explainServerError } from './explain-refusal.js'
import { holdSignalsForCall } from './hold-signals-for-call.js'
import { orderJson } from './order-json.js'

interface TradeDepsOptions {
  /**
   * The command only reads (a GET, retried by the client): a call that got no answer changed nothing on the
   * platform, so it is `[no_answer]`, to be run again, never `[outcome_unknown]`.
   */
  reads?: boolean
  /** What to tell the operator when the call's outcome is unknown (a timeout, a lost answer, a second Ctrl-C). */
  unknownOutcome?: string
  /** What became of the order when the call could not be sent; asked once it failed. */
  orderWhenNotSent?: () => string
  /** Lines of their own (each after a line feed) on what became of the order when the platform refused; asked once it did. */
  orderWhenRefused?: () => string
  /**
   * The command's change, when it writes it in one transaction and holds no stop signal itself (`trades link`): what
   * a signal while its COMMIT is in flight names, and where to look whether it was made (withDatabase's `committing`).
   * A trade call (runTradeCall) holds the signals itself, and its own rules apply.
   */
  committing?: ChangeInFlight
}

/**
 * Runs a command with the trades service wired from the config, and turns its failures into the CLI's
 * contract: a request that fails validation is a usage error (exit 2, the field named); a refusal by the
 * platform (explain-refusal.ts) or by the order's state, a platform not reached and an answer not known exit 1,
 * their line ending in our code in brackets.
 */
export async function withTradeDeps<T>(
  run: (deps: TradeDeps) => Promise<T>,
  {
    reads = false,
    unknownOutcome = 'The platform may or may not have done it: check with `trades get` (the order is polled soon).',
    orderWhenNotSent = () => 'the order is unchanged',
    orderWhenRefused = () => '',
    committing,
  }: TradeDepsOptions = {},
): Promise<T> {
  const [{ systemClock }, { createPartnerApiClient, partnerApiBaseUrl }, { DEFAULT_RETRY }, { observationSettings }] =
    await Promise.all([
      import('../clock.js'),
      import('../partner-api/create-partner-api-client.js'),
      import('../partner-api/partner-api-transport.js'),
      import('../orders/observations.js'),
    ])
  return withDatabase(async ({ config, logger, db, reactions, clock = systemClock }) => {
    // with the default retries: a GET is sent up to DEFAULT_RETRY.maxAttempts times, a POST once; each retry is
    // told on stderr as it comes (a read answered 503 took 18 s with no word)
    const onRetry = ({ method, path, reason, waitMs, attempt, maxAttempts }: { method: string; path: string; reason: string; waitMs: number; attempt: number; maxAttempts: number }) =>
      writeError(`${method} ${path}: ${reason}; sending it again in ${formatWait(waitMs)} (attempt ${attempt} of ${maxAttempts})\n`)
    const client = createPartnerApiClient(config, { logger, clock, onRetry })
    try {
      const notice = (line: string) => writeError(`${line}\n`)
      return await run({ db, client, clock, logger, notice, settings: {
          expectedWebhookS: config.poll.expectedWebhookS,
          partnerKind: config.partner.kind,
          createTimeoutMs: config.partner.timeoutMs,
          observation: observationSettings(config, reactions.handlersFor),
        },
      })
    } catch (error) {
      const localSandbox = config.partner.mode === 'local' ? { url: partnerApiBaseUrl(config), dataDir: config.dataDir } : undefined
      const readAttempts = DEFAULT_RETRY.maxAttempts
      throw explainFailure(error, { reads, readAttempts, unknownOutcome, orderWhenNotSent, orderWhenRefused }, localSandbox)
    }
  }, committing ? { committing } : {})
}

/**
 * withTradeDeps for a call that may move money or a trade (a POST), then `print` its answer. Run on its own, it
 * holds stop signals from before the database opens until the answer is printed (hold-signals-for-call.ts): a
 * first one that came before the answer adds a line and exit code 130 to the answer printed as usual.
 */
export async function runTradeCall<T>(
  run: (deps: TradeDeps) => Promise<T>,
  print: (result: T) => void,
  {
    recorded = () => RECORDED_LOCALLY,
    ...options
  }: Omit<TradeDepsOptions, 'committing'> & {
    /** What the order records of the answer, for the line after a first signal (pollOnlyRecorded's, for a record with no trade status). */
    recorded?: (result: T) => string
  } = {},
): Promise<void> {
  // inside a running service the signals are the service's, and it finishes the command
  const held = runsInService() ? undefined : holdSignalsForCall()
  try {
    const result = await withTradeDeps((deps) => run(held ? { ...deps, guard: held.guard } : deps), options)
    // the platform answered and the order records it: an output lost from here is not the call's failure
    await markTookEffect()
    print(result)
    if (held?.stopped()) {
      writeError(`stopped by a signal after the call in flight: the platform’s answer is above, ${recorded(result)}\n`)
      setExitCode(130)
    }
  } catch (error) {
    // a stop signal came while the call was at the platform, which then gave no answer in time: its line as usual,
    // and the exit a stop signal's, 130, as when a second signal stopped the wait (it was 1, the signal unmentioned).
    // A refusal is an answer, printed as one, exit 1
    if (held?.stopped() && error instanceof CommandFailedError && error.code === 'outcome_unknown') {
      throw new StoppedBySignalError(`${error.message}\nstopped by a signal while the call was in flight: its outcome is above`)
    }
    // the same, the platform's answer not the record the call was sent for (another trade's, another milestone's or
    // proposal's): nothing of it applied, what the call did not known, as after a timeout, and the exit is the stop
    // signal's (it was 1, the signal unmentioned)
    if (held?.stopped() && error instanceof CommandFailedError && error.code === 'answer_mismatch') {
      throw new StoppedBySignalError(
        `${error.message}\nstopped by a signal during the call, whose answer was not the record it was sent for: its outcome is not known (above)`,
      )
    }
    // the same, the platform's answer not recorded (`trades open`: the order gone or its create another command's, the
    // database lost): its line names the trade, and the exit is the stop signal's, as the first signal's line said
    // "then stopping" (it was 1, the signal unmentioned)
    if (held?.stopped() && error instanceof CommandFailedError && error.code === 'trade_not_recorded') {
      throw new StoppedBySignalError(`${error.message}\nstopped by a signal after the call: the platform’s answer is not recorded (above)`)
    }
    // the same, the call's connection never set up in time: nothing was sent (its line says so), and the exit is the
    // stop signal's too (it was 1, the signal unmentioned)
    if (held?.stopped() && error instanceof CommandFailedError && error.code === 'not_sent') {
      throw new StoppedBySignalError(`${error.message}\nstopped by a signal while the call waited for its connection: nothing was sent (above)`)
    }
    throw error
  } finally {
    held?.off()
  }
}

/** What the order records of an answer with a trade status: the status, as any observation records it. */
const RECORDED_LOCALLY = 'recorded locally'

/**
 * What the order records of an answer that holds no trade status, `record` ("a dispute record"): only its poll brought
 * forward (run-trade-operation.ts). "Recorded locally" sent the operator to `orders show` for a dispute it never holds.
 */
export function pollOnlyRecorded(record: string): string {
  return `and the order records only its poll brought forward (${record} holds no trade status)`
}

/** A wait for a person: `0.3 s`, `5 s`. */
function formatWait(ms: number): string {
  return ms < 10_000 ? `${(Math.round(ms / 100) / 10).toLocaleString('en-US')} s` : `${Math.round(ms / 1000).toLocaleString('en-US')} s`
}

function explainFailure(
  error: unknown,
  { reads, readAttempts, unknownOutcome, orderWhenNotSent, orderWhenRefused }: Required<Omit<TradeDepsOptions, 'committing'>> & { readAttempts: number },
  /** Local mode's platform: the sandbox `npm start` runs from `dataDir`, which knows that directory's key. */
  localSandbox?: { url: string; dataDir: string },
): unknown {
  if (error instanceof NotRecordedLocallyError) {
    // the call's own line (`[outcome_unknown]`, a 5xx's), then what the database could not record of it: the database's
    // failure alone said "try again later" of a call that may have been done
    const explained = explainFailure(error.callError, { reads, readAttempts, unknownOutcome, orderWhenNotSent, orderWhenRefused }, localSandbox)
    if (explained instanceof Error) explained.message = `${explained.message}\n  ${printable(error.note)}`
    return explained
  }
  // a TradeOperationError names the order by its reference as given, which may hold a line feed: one line here
  if (error instanceof TradeOperationError && error.code === 'stopped') {
    return new StoppedBySignalError(`${printable(error.message)} [${error.code}]`)
  }
  if (error instanceof PartnerValidationError) return new UsageError(`Invalid request: ${error.message}`)
  if (error instanceof PartnerApiError && localSandbox && (error.code === 'unknown_key' || error.code === 'invalid_signature')) {
    // the sandbox of this DATA_DIR's service knows its key: one that does not is another checkout's, on the same port
    return explainRefusal(
      error,
      `${orderWhenRefused()}\n  In local mode the platform is the sandbox that \`npm start\` runs from ${localSandbox.dataDir}, ` +
        `with that directory's key; the one at ${localSandbox.url} does not know it, so another service (another ` +
        'checkout or DATA_DIR) holds that port: stop it, or give this one another SANDBOX_PORT, and start this one.',
    )
  }
  // CommandFailedError from here on, never a plain Error: run-cli.ts reads a plain one's message for a database
  // failure, and these messages quote the platform (a 503 saying `Connection terminated`, a key of its answer)
  // a 5xx (or a 3xx) to a call that changes something: not a refusal, as the call may have been done behind the gateway
  if (!reads && error instanceof PartnerApiError && isOutcomeUnknown(error)) return explainServerError(error, `\n  ${unknownOutcome}`)
  if (error instanceof PartnerApiError) return explainRefusal(error, orderWhenRefused())
  if (error instanceof TradeOperationError) return new CommandFailedError(error.code, printable(error.message))
  if (error instanceof PartnerStoppedBeforeSentError) {
    // the trade functions say it as a stop before sending; this is the one that reached here as it was (the order
    // could not be set back: the line under it says so)
    return new StoppedBySignalError(`${printable(error.message)}: nothing was sent and ${orderWhenNotSent()} [stopped]`)
  }
  if (error instanceof PartnerNotSentError && error.proxy && error.beyondProxy) {
    // the tunnel was up: the proxy settings did their part, and what failed is the platform's (its TLS)
    return new CommandFailedError(
      'not_sent',
      `Could not reach the platform at ${error.url} through the proxy ${error.proxy}: ${error.reason}. Nothing ` +
        `was sent and ${orderWhenNotSent()}; the proxy let the call through: check PARTNER_API_BASE_URL.`,
    )
  }
  if (error instanceof PartnerNotSentError && error.proxy) {
    return new CommandFailedError(
      'not_sent',
      `Could not reach the platform at ${error.url} through the proxy ${error.proxy}: ${error.reason}. Nothing ` +
        `was sent and ${orderWhenNotSent()}; check HTTPS_PROXY / HTTP_PROXY and NO_PROXY.`,
    )
  }
  if (error instanceof PartnerNotSentError) {
    return new CommandFailedError(
      'not_sent',
      `Could not reach the platform at ${error.url} (${error.reason}): nothing was sent and ${orderWhenNotSent()}. ` +
        'In local mode the sandbox runs inside `npm start`: start it, then run this again; ' +
        'otherwise check PARTNER_API_BASE_URL.',
    )
  }
  const noAnswer =
    error instanceof PartnerTimeoutError || (error instanceof PartnerNetworkError && !(error instanceof PartnerInvalidResponseError))
  if (reads && noAnswer) {
    // a read changes nothing, so nothing is unknown. The client sent it `readAttempts` times and throws the last
    // attempt's failure, a timeout or a lost connection. An answer that is not the record did come: not here
    return new CommandFailedError('no_answer', `${error.message} after ${readAttempts} attempts; nothing was changed by it: try again`)
  }
  if (reads && error instanceof PartnerInvalidResponseError) {
    // an answer came, but not one to show: the read changed nothing either
    return new CommandFailedError('invalid_response', `${error.message}; a GET changes nothing on the platform, and nothing of the answer is shown`)
  }
  if (isOutcomeUnknown(error)) {
    // the same words as a timeout's: the operator's giving up on the answer leaves what a timeout leaves
    const message = `${(error as Error).message}. ${unknownOutcome}`
    return error instanceof PartnerAnswerAbandonedError
      ? new StoppedBySignalError(`${message} [outcome_unknown]`)
      : new CommandFailedError('outcome_unknown', message)
  }
  return error
}

function printTrade(trade: TradeRecord, json: boolean | undefined, extra: Record<string, unknown> = {}): void {
  if (json) printJson({ ...extra, trade })
  else write(escaped`${trade.external_reference}: trade ${trade.trade_id} (${trade.reference}) is ${trade.status}\n`)
}

// the ids are what `trades milestone deliver|release` takes
function printMilestones(trade: TradeRecord): void {
  for (const item of trade.milestones ?? []) {
    write(escaped`  milestone ${item.milestone_id} ${item.title ?? '?'} ${item.amount ?? '?'}: ${item.status ?? '?'}\n`)
  }
}

/**
 * The dispute of a trade record, and each of its proposals on a line of its own: the id `proposals respond` takes,
 * who made it, its outcome (a split with the buyer's share) and its status. After a `proposals create` whose outcome
 * is unknown, this is where the operator sees whether the proposal was made. Every field is the platform's text, each
 * escaped; one the record leaves out shows as `?`.
 */
function printDispute(dispute: DisputeRecord): void {
  write(escaped`  dispute ${dispute.dispute_id}: ${shownField(dispute.status)}\n`)
  if (dispute.proposals === undefined) {
    write('    proposals: not in the platform’s record\n')
    return
  }
  if (dispute.proposals.length === 0) write('    no proposals\n')
  for (const proposal of dispute.proposals) {
    const split = proposal.split_buyer_pct === undefined || proposal.split_buyer_pct === null ? '' : escaped` (buyer’s share ${shownField(proposal.split_buyer_pct)}%)`
    write(
      escaped`    proposal ${proposal.proposal_id} by ${shownField(proposal.party)}: ${shownField(proposal.outcome)}` +
        split +
        escaped`, ${shownField(proposal.status)}\n`,
    )
  }
}

/** A field the record types unknown (responses.ts), for a line: text as it came, a number or a flag as written, `?` for none. */
function shownField(value: unknown): string {
  if (value === undefined || value === null) return '?'
  if (typeof value === 'string') return value
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') return String(value)
  return JSON.stringify(value)
}

/**
 * What `trades milestone deliver|release` prints of its answer, which is the trade record or the milestone record
 * (the spec allows either): the milestone's line first, as it is what the command moved (a milestone trade stays
 * funded until its last release), then the trade's line, or, for a milestone record, that it carries no trade status.
 * `--json` prints `{"trade": …}` or `{"milestone": …}`, by which record came.
 */
function printMilestoneAnswer(reference: string, milestoneId: string, answer: MilestoneAnswer, json: boolean | undefined): void {
  if (json) {
    printJson(answer.record === 'trade' ? { trade: answer.trade } : { milestone: answer.milestone })
    return
  }
  const milestoneLine = (item: MilestoneRecord) =>
    write(escaped`${reference}: milestone ${item.milestone_id} (${item.title ?? '?'}) is ${item.status ?? '?'}\n`)
  if (answer.record === 'milestone') {
    milestoneLine(answer.milestone)
    write(escaped`  the platform answered the milestone record, which holds no trade status: \`trades get ${reference}\` shows the trade\n`)
    return
  }
  const moved = answer.trade.milestones?.find((item) => item.milestone_id === milestoneId)
  if (moved) milestoneLine(moved)
  printTrade(answer.trade, false)
}

export function parseMilestone(spec: string): MilestoneInput {
  const colon = spec.lastIndexOf(':')
  const title = spec.slice(0, colon).trim()
  const amount = spec.slice(colon + 1).trim()
  if (colon < 0 || !title || !amount) {
    throw new UsageError(`--milestone must be "title:amount", e.g. "Frame:70.00"; got "${printable(spec)}"`)
  }
  return { title, amount }
}

interface OpenOptions {
  title: string
  amount: string
  currency: string
  seller?: string
  buyerName?: string
  buyerPhone?: string
  milestone: string[]
  retry?: boolean
  json?: boolean
}

export function registerTradesCommands(trades: Command): void {
  trades
    .command('open')
    .description('create the platform trade for an order (the order is created locally if new)')
    .argument('<reference>', 'the order’s external reference', orderReference)
    .requiredOption('--title <title>', 'name of the trade')
    .requiredOption('--amount <amount>', 'decimal amount, e.g. 120.00')
    .requiredOption('--currency <code>', 'currency code, e.g. EUR')
    .option('--seller <id>', 'seller’s platform user id (required for PARTNER_KIND=marketplace)')
    .option('--buyer-name <name>', 'name of the buyer')
    .option('--buyer-phone <phone>', 'buyer’s phone in international format, e.g. +4915112345678')
    .option(
      '--milestone <title:amount>',
      'a milestone (repeat for each); makes the trade milestone-based',
      (spec: string, all: string[]) => [...all, spec],
      [],
    )
    .option('--retry', 'send the create again although an earlier one may have made the trade')
    .option('--json', 'print the result as JSON')
    .action(async (reference: string, options: OpenOptions) => {
      const request: Omit<CreateTradeRequest, 'external_reference'> = {
        title: options.title,
        amount: options.amount,
        currency: options.currency,
        ...(options.seller !== undefined && { seller_id: options.seller }),
        ...(options.buyerName !== undefined && { buyer_name: options.buyerName }),
        ...(options.buyerPhone !== undefined && { buyer_phone: options.buyerPhone }),
        ...(options.milestone.length > 0 && { milestones: options.milestone.map(parseMilestone) }),
      }
      const { openTradeForOrder } = await import('../trades/open-trade-for-order.js')
      // a new order is created before the create is sent, and stays when nothing could be sent
      let orderCreated = false
      const onOrderCreated = () => {
        orderCreated = true
      }
      await runTradeCall(
        (deps) => openTradeForOrder(deps, reference, request, { retry: options.retry === true, onOrderCreated }),
        (trade) => {
          printTrade(trade, options.json)
          if (!options.json) printMilestones(trade)
        },
        {
          unknownOutcome:
            'The trade may or may not exist: the order is marked unknown and is linked when the trade’s ' +
            `webhook arrives. Send the create again only on purpose: \`trades open ${printable(reference)} ... --retry\`.`,
          orderWhenNotSent: () =>
            orderCreated
              ? `no trade was opened, but order ${printable(reference)} was created locally: the same command opens its trade ` +
                'once the platform can be reached'
              : 'the order is unchanged',
          orderWhenRefused: () =>
            orderCreated
              ? `\n  No trade was opened, but order ${printable(reference)} was created locally, with no trade: the same command ` +
                'opens its trade once what the platform refused is put right'
              : '',
        },
      )
    })

  for (const kind of ['fund', 'deliver', 'release', 'cancel'] as const) {
    trades
      .command(kind)
      .description(`${kind} the order’s trade`)
      .argument('<reference>', 'the order’s external reference', orderReference)
      .option('--json', 'print the trade record as JSON')
      .action(async (reference: string, options: { json?: boolean }) => {
        const { runTradeOperation } = await import('../trades/run-trade-operation.js')
        await runTradeCall(
          (deps) => runTradeOperation(deps, reference, { kind }),
          (trade) => printTrade(trade, options.json),
        )
      })
  }

  const milestone = trades.command('milestone').description('deliver or release one milestone of the trade')
  for (const step of ['deliver', 'release'] as const) {
    milestone
      .command(step)
      .description(`${step} one milestone`)
      .argument('<reference>', 'the order’s external reference', orderReference)
      .argument('<milestoneId>', 'the platform’s milestone id')
      .option('--json', 'print the record the platform answered as JSON: {"trade": …} or {"milestone": …}')
      .action(async (reference: string, milestoneId: string, options: { json?: boolean }) => {
        const kind = step === 'deliver' ? 'deliver_milestone' : 'release_milestone'
        const { runTradeOperation } = await import('../trades/run-trade-operation.js')
        await runTradeCall(
          (deps) => runTradeOperation(deps, reference, { kind, milestoneId }),
          (answer) => printMilestoneAnswer(reference, milestoneId, answer, options.json),
          { recorded: (answer) => (answer.record === 'milestone' ? pollOnlyRecorded('a milestone record') : RECORDED_LOCALLY) },
        )
      })
  }

  trades
    .command('get')
    .description('fetch the trade from the platform, beside the local order')
    .argument('<reference>', 'the order’s external reference', orderReference)
    .option('--json', 'print the platform’s trade record and the local order as JSON')
    .action(async (reference: string, options: { json?: boolean }) => {
      const { getTradeForOrder } = await import('../trades/get-trade-for-order.js')
      const { order, trade } = await withTradeDeps((deps) => getTradeForOrder(deps, reference), { reads: true })
      if (options.json) {
        printJson({ order: orderJson(order), trade })
        return
      }
      write(escaped`${reference}: trade ${trade.trade_id} (${trade.reference}) is ${trade.status} on the platform\n`)
      printMilestones(trade)
      if (trade.dispute) printDispute(trade.dispute)
      write(`local order: ${JSON.stringify(orderJson(order))}\n`)
    })

  trades
    .command('link')
    .description('link an order with no trade to a trade found on the platform, if the trade names the order')
    .argument('<reference>', 'the order’s external reference', orderReference)
    .argument('<tradeId>', 'the platform’s trade id')
    .option('--json', 'print the outcome, the local order and the platform’s trade record as JSON')
    .action(async (reference: string, tradeId: string, options: { json?: boolean }) => {
      const { linkTradeToOrder } = await import('../trades/link-trade-to-order.js')
      const result = await withTradeDeps((deps) => linkTradeToOrder(deps, reference, tradeId), {
        reads: true,
        orderWhenRefused: () => `\n  Nothing was linked: order ${printable(reference)} is as it was.`,
        // one transaction: a signal while its COMMIT is in flight cannot say that nothing was linked
        committing: {
          change: `the link of order ${printable(reference)} to trade ${printable(tradeId)}`,
          see: `\`orders show ${quoteForShell(reference)}\` says whether the order has the trade`,
        },
      })
      if (result.outcome !== 'already_linked') await markTookEffect({ done: 'the order was linked to the trade', see: 'see the order with `orders show`' })
      if (options.json) {
        printJson({ ...result, order: orderJson(result.order) })
        return
      }
      const { order } = result
      if (result.outcome === 'already_linked') {
        write(escaped`${reference}: already linked to trade ${order.tradeId} (${order.tradeStatus ?? 'status unknown'}): nothing changed\n`)
        return
      }
      const { trade } = result
      write(escaped`${reference}: linked to trade ${trade.trade_id} (${trade.reference}), ${trade.status} on the platform\n`)
      const cleared = result.previousAttention === 'trade_create_unknown' && order.attention === null ? 'flag trade_create_unknown cleared; ' : ''
      const poll = order.nextPollAt ? `next poll at ${order.nextPollAt.toISOString()}` : 'not polled (a terminal status)'
      write(`  ${cleared}${poll}\n`)
    })
}
