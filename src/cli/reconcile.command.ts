// `reconcile --once`: one poll cycle now, as a replica of the poller would run it (claims, leases and
// the run record included, so it is safe beside running services). `reconcile --report`: the latest
// runs. `reconcile --requeue`: puts orders flagged for an operator (the platform answered 404, or a record of
// another trade or order) back on the poll schedule.
import { hostname } from 'node:os'
import type { Command } from 'commander'
import type { PartnerEnv } from '../config.js'
import { linkedElsewhere } from '../orders/order.js'
import { describeClockOffset } from '../partner-api/clock-offset.js'
import { printable } from '../printable.js'
import { leasedElsewhereLine } from '../reconcile/leased-elsewhere.js'
import type { RunSummary } from '../reconcile/poller.js'
import { orderReferences, wholeNumberUpTo } from './cli-arguments.js'
import {
  CommandFailedError,
  markTookEffect,
  printJson,
  printTable,
  runsInService,
  setExitCode,
  UsageError,
  withDatabase,
  write,
  writeError,
} from './cli-context.js'

interface ReconcileOptions {
  once?: boolean
  report?: boolean
  requeue?: boolean | string[]
  requeueOpen?: boolean
  within: number
  limit: number
  json?: boolean
}

const MAX_REPORT_LIMIT = 1_000
/** --requeue-open's window: 15 minutes, and at most a day. */
const DEFAULT_WITHIN_S = 900
const MAX_WITHIN_S = 86_400

export function registerReconcileCommands(reconcile: Command): void {
  reconcile
    .option('--once', 'claim the due orders, poll them and apply what the platform answers')
    .option('--report', 'show the latest reconciliation runs')
    .option(
      '--requeue [references...]',
      'clear `attention` and make these orders due now (no references: every flagged order, whatever its flag)',
      orderReferences,
    )
    .option(
      '--requeue-open',
      'give every open order of PARTNER_ENV a poll within --within seconds (after a database restore or failover lost transitions); flagged ones stay flagged',
    )
    .option('--within <seconds>', `with --requeue-open: the seconds its polls are spread over (0: all due now; at most ${MAX_WITHIN_S})`, wholeNumberUpTo(MAX_WITHIN_S, 0), DEFAULT_WITHIN_S)
    .option('--limit <n>', `runs to show with --report (at most ${MAX_REPORT_LIMIT})`, wholeNumberUpTo(MAX_REPORT_LIMIT), 20)
    .option('--json', 'print JSON')
    .action(async (options: ReconcileOptions, command: Command) => {
      const modes = [options.once, options.report, options.requeue, options.requeueOpen].filter((mode) => mode !== undefined)
      if (modes.length !== 1) {
        throw new UsageError('reconcile needs exactly one of --once, --report, --requeue or --requeue-open')
      }
      // a cycle claims POLL_BATCH_SIZE orders: --limit there was ignored without a word
      if (!options.report && command.getOptionValueSource('limit') === 'cli') {
        throw new UsageError('--limit goes with --report (the runs to show); a cycle claims POLL_BATCH_SIZE orders')
      }
      if (!options.requeueOpen && command.getOptionValueSource('within') === 'cli') {
        throw new UsageError('--within goes with --requeue-open (the window its polls are spread over)')
      }
      if (options.once) await runOnce(options.json)
      else if (options.report) await report(options.limit, options.json)
      else if (options.requeueOpen) await requeueOpen(options.within, options.json)
      else await requeue(options.requeue === true ? undefined : (options.requeue as string[]), options.json)
    })
}

async function runOnce(json: boolean | undefined): Promise<void> {
  const [
    { systemClock },
    { createPartnerApiClient },
    { createPoller, pollerSettings },
    { observationSettings },
    { stopOnSignals },
    { countLeasedDue, countOtherEnvironmentDue },
    { CLOCK_OFFSET_BOUND_MS },
    { databaseClockOffsetMs },
  ] = await Promise.all([
    import('../clock.js'),
    import('../partner-api/create-partner-api-client.js'),
    import('../reconcile/poller.js'),
    import('../orders/observations.js'),
    import('../stop-signals.js'),
    import('../orders/poll-schedule.repository.js'),
    import('../db/clock-guard.js'),
    import('../db/ping-database.js'),
  ])
  const { summary, otherEnvironment, leased, localSandboxOf } = await withDatabase(async ({ config, logger, db, reactions, clock = systemClock, onPollResult }) => {
    // a claim's lease and the orders' next polls are written by this machine's clock, and read by every replica's: far
    // from the database's, the cycle is refused as a replica's is (db/clock-guard.ts), before anything is claimed
    const offsetMs = await databaseClockOffsetMs(db, clock)
    if (Math.abs(offsetMs) > CLOCK_OFFSET_BOUND_MS) {
      const side = offsetMs < 0 ? 'ahead of' : 'behind'
      throw new CommandFailedError(
        'clock_offset',
        `This machine's clock is ${Math.round(Math.abs(offsetMs) / 1000)} s ${side} the database's, past the ${CLOCK_OFFSET_BOUND_MS / 1000} s bound: ` +
          "nothing was claimed (a claim's lease and the next polls would be written by this clock); fix this machine's clock (timedatectl, chrony, ntpd)",
      )
    }
    const poller = createPoller({
      db,
      fetcher: createPartnerApiClient(config, { logger, clock }),
      clock,
      logger,
      settings: pollerSettings(config.poll, observationSettings(config, reactions.handlersFor), config.partner, config.databaseStatementTimeoutMs),
      replica: `cli:${hostname()}:${process.pid}`,
      ...(onPollResult ? { onPollResult } : {}),
    })
    const run = async (): Promise<RunSummary> => {
      if (runsInService()) return poller.runOnce()
      // Ctrl-C stops the cycle as a replica's shutdown does: the claims not polled are given back (due again at
      // once) and the run is recorded as stopped, rather than left leased and "running" for good
      // a second signal ended the process without a word, its claims left leased and its run `running`
      const off = stopOnSignals(
        () => {
          void poller.stop()
          writeError('stopping: the orders not polled are given back (a second Ctrl-C ends the process now, its claimed orders left leased)\n')
        },
        () => {
          writeError(
            `Stopped by a second signal: the orders this run claimed and did not poll are due again when their lease ends (within ${config.poll.leaseS} s, ` +
              'POLL_LEASE_S), and `reconcile --report` shows the run without an end; the polls it had answered are recorded [stopped]\n',
          )
          process.exit(130)
        },
      )
      try {
        return await poller.runOnce()
      } finally {
        off()
      }
    }
    const env = config.partner.env
    // the due orders the claim will leave to another poller's lease: counted before it, when none is this cycle's
    const leased = await countLeasedDue(db, new Date(clock.now()), env)
    const ran = await run()
    // the cycle's polls are applied and its run recorded, each poll committed on its own
    await markTookEffect({ done: 'the cycle ran and its run is recorded', see: 'see it with `reconcile --report`' })
    // the due orders the claim left: linked under the other PARTNER_ENV (README, "Going live")
    return {
      summary: ran,
      otherEnvironment: { env, due: await countOtherEnvironmentDue(db, new Date(clock.now()), env) },
      leased,
      // local mode: the platform polled is the sandbox that `npm start` runs from this DATA_DIR
      localSandboxOf: config.partner.mode === 'local' ? config.dataDir : undefined,
    }
  })
  if (json) {
    printJson({
      ...summary,
      otherEnvironmentDue: otherEnvironment.due,
      leasedElsewhereDue: leased.due,
      leasedElsewhereUntil: leased.until,
    })
  } else {
    printSummary(summary)
    const leasedLine = leasedElsewhereLine(leased, '`reconcile --report`')
    if (leasedLine) write(`${leasedLine}\n`)
    if (otherEnvironment.due > 0) {
      const other = otherEnvironment.env === 'live' ? 'sandbox' : 'live'
      write(
        `left ${otherEnvironment.due} due order(s) linked under PARTNER_ENV=${other}: not polled while PARTNER_ENV=${otherEnvironment.env} ` +
          '(`orders list` shows their env; README, "Going live")\n',
      )
    }
  }
  // the first poll that failed says why (the log line is not the operator's to read)
  if (summary.firstFailure) {
    writeError(`first error, order ${printable(summary.firstFailure.externalReference)}: ${printable(summary.firstFailure.reason)}\n`)
    // no platform configured, and the sandbox that stands in for it not running: a command on its own does not start it
    if (summary.firstFailure.notSent && localSandboxOf !== undefined) {
      writeError(
        `in local mode the platform is the sandbox, which runs inside \`npm start\` (from ${printable(localSandboxOf)}): start it, then run this ` +
          'again (or set PARTNER_API_BASE_URL to poll a platform)\n',
      )
    }
  }
  if (summary.stoppedReason === 'unauthorized') {
    writeError(
      summary.clockOffsetS === null
        ? 'stopped: the platform answered 401 (check PARTNER_API_KEY_ID / PARTNER_API_SECRET / PARTNER_ENV) [unauthorized]\n'
        : `stopped: the platform answered 401: ${describeClockOffset(summary.clockOffsetS)} [unauthorized]\n`,
    )
    setExitCode(1)
  }
  if (summary.stoppedReason === 'shutdown') {
    writeError(`stopped by a signal: the orders not polled were given back, due again now\n`)
    setExitCode(130)
  }
  if (summary.stoppedReason === 'platform_failing') {
    writeError(`stopped: the platform is failing (polls in a row ended in its errors after their retries); the orders not polled were given back [platform_failing]\n`)
    setExitCode(1)
  }
  if (summary.stoppedReason === 'throttled') {
    writeError(
      `stopped: the platform asked us to slow down (429 or Retry-After); the orders not polled are due again at ${summary.throttledUntil?.toISOString()} [throttled]\n`,
    )
    setExitCode(1)
  }
}

function printSummary(summary: RunSummary): void {
  const counts = Object.entries(summary.results)
    .filter(([, count]) => count > 0)
    .map(([result, count]) => `${result} ${count}`)
    .join(', ')
  write(
    `run ${summary.runId}: claimed ${summary.claimed}, polled ${summary.polled}, changed ${summary.changed}, ` +
      `errors ${summary.errors}${summary.released ? `, released ${summary.released}` : ''}` +
      `${counts ? ` (${counts})` : ''}${summary.stoppedReason ? `; stopped: ${summary.stoppedReason}` : ''}\n`,
  )
  // flagged before the claim, and no poll of theirs: said apart, as they wait for an operator
  const flagged = summary.flaggedCreates
  if (flagged.length > 0) {
    const named = flagged.slice(0, 20).map((reference) => printable(reference)).join(', ')
    write(
      `flagged trade_create_unknown: ${flagged.length} order(s) whose trade create got no answer and no webhook linked a ` +
        `trade (${named}${flagged.length > 20 ? ', …' : ''}): check the platform, then \`trades open REFERENCE --retry\` or \`trades link\`\n`,
    )
  }
}

async function report(limit: number, json: boolean | undefined): Promise<void> {
  const [{ listReportedRuns }, { unauthorizedMessage }, { longestCycleMs }] = await Promise.all([
    import('../reconcile/reconcile-run.repository.js'),
    import('../reconcile/reconcile-cycle.js'),
    import('../reconcile/poller.js'),
  ])
  // running or unfinished by the database's time, not this machine's (listReportedRuns)
  const { runs, longestMs } = await withDatabase(async ({ db, config }) => {
    const longestMs = longestCycleMs(config)
    return { runs: await listReportedRuns(db, { limit, longestCycleMs: longestMs }), longestMs }
  })
  if (json) {
    printJson(runs)
    return
  }
  printTable(
    runs.map((run) => ({
      id: run.id,
      replica: run.replica,
      started: run.startedAt,
      seconds: run.finishedAt ? ((run.finishedAt.getTime() - run.startedAt.getTime()) / 1000).toFixed(1) : run.state,
      polled: run.polled,
      changed: run.changed,
      errors: run.errors,
      stopped: run.stoppedReason,
    })),
    '(no reconciliation runs yet)',
  )
  // the words do not fit a column: one line under the table for each run a clock offset explains
  for (const run of runs) {
    if (run.clockOffsetS !== null) write(`run ${run.id}: ${unauthorizedMessage(run.clockOffsetS)}\n`)
  }
  const unfinished = runs.filter((run) => run.state === 'unfinished').map((run) => run.id)
  if (unfinished.length > 0) {
    write(
      `unfinished (run${unfinished.length === 1 ? '' : 's'} ${unfinished.join(', ')}): no end recorded ${Math.round(longestMs / 1000)} s after ` +
        'the start, past the longest a cycle runs: its process stopped (killed, its host lost) or lost the database; ' +
        'its counts are unknown, and its orders came due again when their lease ran out\n',
    )
  }
}

/** Said of a requeued order linked under the other PARTNER_ENV: due, but no poller of this one takes it. */
function polledElsewhere(order: { partnerEnv: PartnerEnv | null }, current: PartnerEnv): string {
  const elsewhere = linkedElsewhere(order, current)
  return elsewhere ? ` (linked under PARTNER_ENV=${elsewhere}: polled only there)` : ''
}

/** The unknown references a refusal names; the rest are counted. */
const MISSING_SHOWN = 20

async function requeue(externalReferences: string[] | undefined, json: boolean | undefined): Promise<void> {
  const { requeueOrders } = await import('../orders/poll-schedule.repository.js')
  // due now by the database's time, not this machine's (requeueOrders)
  const { results, partnerEnv } = await withDatabase(
    async ({ db, config }) => ({
      results: await requeueOrders(db, externalReferences ? { externalReferences } : {}),
      partnerEnv: config.partner.env,
    }),
    { committing: { change: 'the requeue of the orders', see: '`orders show` gives an order\'s next poll' } },
  )
  if (results.length > 0) await markTookEffect({ done: 'the orders were requeued', see: 'see them with `orders show`' })
  const found = new Set(results.map((result) => result.externalReference))
  const missing = (externalReferences ?? []).filter((reference) => !found.has(reference))
  if (json) printJson({ results, missing })
  else {
    for (const result of results) {
      write(
        result.outcome === 'requeued'
          ? `${printable(result.externalReference)}: due now${result.previousAttention ? ` (was ${result.previousAttention})` : ''}${polledElsewhere(result, partnerEnv)}\n`
          : `${printable(result.externalReference)}: attention cleared; not polled (no trade id or a terminal status)\n`,
      )
    }
    if (results.length === 0 && !externalReferences) write('no order is flagged for an operator\n')
  }
  if (missing.length > 0) {
    // in the words of every other command's look-up, the references listed when several are unknown
    // the first MISSING_SHOWN of them: a line of every one of 70,000 unknown references was megabytes long
    const shown = missing.slice(0, MISSING_SHOWN).map(printable).join(', ')
    const more = missing.length > MISSING_SHOWN ? ` and ${(missing.length - MISSING_SHOWN).toLocaleString('en-US')} more (--json lists them all)` : ''
    throw new CommandFailedError('order_not_found', `No order with external ${missing.length === 1 ? 'reference' : 'references'} ${shown}${more}`)
  }
}

async function requeueOpen(withinS: number, json: boolean | undefined): Promise<void> {
  const [{ requeueOpenOrders }, { stopOnSignals }] = await Promise.all([import('../orders/poll-schedule.repository.js'), import('../stop-signals.js')])
  // it commits a slice of 10,000 orders at a time: a stop signal ends it after the slice in flight, and says how far
  // it got (inside a running service the signals are the service's)
  const stop = new AbortController()
  const { requeued, flagged, from, total, stopped } = await withDatabase(async ({ db, config }) => {
    const off = runsInService()
      ? () => {}
      : stopOnSignals(() => {
          // on Postgres the batch's statement runs on without the process: one ended before its answer is not rolled
          // back. The embedded database runs in this process, and ends with it: the batch in flight is not committed
          const second = config.databaseUrl
            ? 'that batch may still commit'
            : 'the embedded database ends with it, and that batch is not committed'
          writeError(`stopping after the batch in flight (a second Ctrl-C ends the process now, without the count: ${second})\n`)
          stop.abort()
        })
    try {
      return await requeueOpenOrders(db, { withinS, partnerEnv: config.partner.env, signal: stop.signal })
    } finally {
      off()
    }
  })
  if (requeued > 0) await markTookEffect({ done: 'the open orders were requeued', see: '`orders list` shows their next polls' })
  if (json) printJson({ requeued, flagged, from: from.toISOString(), withinS, ...(stopped ? { stopped, total } : {}) })
  else {
    write(
      requeued === 0
        ? `no open order waits for its poll past the next ${withinS} s\n`
        : `${requeued.toLocaleString('en-US')} open order(s) due ` +
            (withinS === 0 ? 'now' : `within the next ${withinS} s, spread evenly (about ${perSecond(requeued, withinS)} a second)`) +
            `, from ${from.toISOString()} by the database's clock\n`,
    )
    if (flagged > 0) write(`${flagged.toLocaleString('en-US')} flagged for an operator left as they are: \`reconcile --requeue\` clears them\n`)
  }
  if (stopped) {
    writeError(
      `stopped by a signal after the batch in flight: ${requeued.toLocaleString('en-US')} of ${total.toLocaleString('en-US')} open orders were requeued (above); ` +
        `the others keep their polls: run it again to requeue them [stopped]\n`,
    )
    setExitCode(130)
  } else if (stop.signal.aborted) {
    // the signal came with the last slice in flight: "stopping after the batch in flight" was all it said, and then
    // the command ended as if none had come
    writeError('the stop signal came during the last batch, which committed: nothing was left undone\n')
  }
}

/** A rate, to two significant figures, for a person. */
function perSecond(count: number, seconds: number): string {
  const rate = Number((count / seconds).toPrecision(2))
  // toLocaleString keeps 3 decimals at most: 0.0022 read 0.002
  return rate >= 1 ? rate.toLocaleString('en-US') : String(rate)
}
