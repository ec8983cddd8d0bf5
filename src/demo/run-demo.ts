// `npm run demo`: the whole system against the sandbox, with faults. 50 trades (ten of each kind) go
// through their lifecycle by the API client; the sandbox drops, repeats, reorders and delays their
// webhooks, and a few trades' webhooks fail every attempt. Then the poller reconciles, and the run
// checks that every order matches the platform, and says which converged by webhook and which the
// poller healed. Every transition is also forwarded (the built-in reaction handler) to a local receiver
// that verifies its Standard Webhooks signature and deduplicates by webhook-id, as a partner's system would.
//
// It also leaves what an operator meets in real life, for the console (`keepConsole`: the operator listener
// stays up after the table, with the dispatcher and the sandbox): the disputes' second handler,
// notify-seller, calls a service that is down for the whole run, so its jobs end failed (and the service is
// back once the table is printed: retrying them works); a trade opened on the platform by another system,
// whose webhook is parked for want of an order; and an order imported with a trade id the platform does not
// know, which the poller flags trade_not_found.
import type { AddressInfo } from 'node:net'
import { randomBytes } from 'node:crypto'
import { type Clock, systemClock } from '../clock.js'
import { migrateToLatest } from '../db/migrate.js'
import { type DatabaseHandle, openDatabase } from '../db/open-database.js'
import { createAdminApp } from '../http/admin-app.js'
import { createApp } from '../http/app.js'
import { listen } from '../http/server.js'
import { createLogger, type Logger } from '../logger.js'
import { applyObservation } from '../orders/apply-observation.js'
import { createOrder } from '../orders/create-order.js'
import { findOrderByExternalReference, orderHistory } from '../orders/order.repository.js'
import { requeueOpenOrders, schedulePollAfterApiCall } from '../orders/poll-schedule.repository.js'
import { PartnerApiClient } from '../partner-api/partner-api.client.js'
import { parseConfig } from '../config.js'
import { createDispatcher, type Dispatcher } from '../reactions/dispatcher.js'
import { DEFAULT_DISPATCHER_SETTINGS } from '../reactions/dispatcher-settings.js'
import { createForwarder } from '../reactions/forwarder.js'
import { countFailedJobsByHandler, reactionJobStats } from '../reactions/reaction-job.repository.js'
import { createReactionRegistry } from '../reactions/reaction-registry.js'
import { createPoller } from '../reconcile/poller.js'
import { createSandbox, type Sandbox } from '../sandbox/create-sandbox.js'
import { apiObservation, observationSettings } from '../orders/observations.js'
import { searchDeliveries } from '../webhooks/delivery.repository.js'
import { openTradeForOrder } from '../trades/open-trade-for-order.js'
import { runTradeOperation } from '../trades/run-trade-operation.js'
import type { TradeDeps } from '../trades/trade-deps.js'
import { type DemoForwardReceiver, startForwardReceiver } from './forward-receiver.js'
import { progressBar } from './progress-bar.js'

export type DemoKind = 'plain' | 'milestone' | 'cancelled' | 'disputed' | 'receiver down'

/** Which channel brought each order its final status: the API's answer, a webhook, or the poller. */
export interface DemoRow {
  kind: DemoKind
  orders: number
  byApiAnswer: number
  byWebhook: number
  healedByPoller: number
  matching: number
  /** Transitions of these orders (status history rows: one event each). */
  transitions: number
  /** Events the local receiver verified and counted once by webhook-id. */
  forwarded: number
}

export interface DemoReport {
  rows: DemoRow[]
  mismatches: { reference: string; order: string | null; platform: string }[]
  webhooks: { sent: number; dropped: number; duplicated: number; failedAttempts: number }
  pollCycles: number
  /**
   * The forwarder's receiver. `requests` counts each one: the table's transitions, the repeats, the refusals, and the
   * events of orders not in the table (`outsideTable`: the order leaveWorkForAnOperator imports has a transition too).
   */
  forward: {
    requests: number
    duplicates: number
    invalid: number
    stillPending: number
    outsideTable: { reference: string; events: number }[]
  }
  /** What the run left for an operator: the console's "needs a human". */
  leftForOperator: { failedReactions: number; parkedReferences: string[]; flaggedReferences: string[] }
  /** With keepConsole: where the console is, its token, and how to end it all. */
  console?: DemoConsole
}

export interface DemoConsole {
  url: string
  token: string
  /** Stops the console, the dispatcher and the sandbox, and closes the database. */
  close(): Promise<void>
}

/** The failing reaction handler and the other system's trade and order the demo leaves behind. */
export const DEMO_FAILING_HANDLER = 'notify-seller'

/**
 * Where the demo's own log lines go: `out`, each on a line of its own (on a terminal the progress bar is drawn on
 * the current line), but those of DEMO_FAILING_HANDLER, whose failures are the demo's point and which the report
 * shows ("left for the operator"): as JSON among the progress lines they read as the demo breaking.
 */
function demoLogLines(out: NodeJS.WritableStream & { isTTY?: boolean }): { write: (line: string) => void } {
  return {
    write(line) {
      if (fromFailingHandler(line)) return
      out.write(out.isTTY ? `\n${line}` : line)
    },
  }
}

function fromFailingHandler(line: string): boolean {
  try {
    return (JSON.parse(line) as { handler?: unknown }).handler === DEMO_FAILING_HANDLER
  } catch {
    return false
  }
}
export const DEMO_ELSEWHERE_REFERENCE = 'demo-opened-elsewhere'
export const DEMO_UNKNOWN_TRADE_REFERENCE = 'demo-imported-unknown-trade'

export interface DemoOptions {
  trades?: number
  seed?: number
  /** Where the progress lines go. */
  out?: NodeJS.WritableStream & { isTTY?: boolean }
  logger?: Logger
  /**
   * Keep the operator console up after the report (on 127.0.0.1), with the
   * dispatcher and the sandbox, until the returned console is closed.
   */
  keepConsole?: boolean
  /** The console's port with keepConsole; 0 picks a free one. */
  consolePort?: number
}

const KINDS: DemoKind[] = ['plain', 'milestone', 'cancelled', 'disputed', 'receiver down']
/** The demo's partner API client's timeout, which its trades service also judges a create in flight by. */
const DEMO_PARTNER_TIMEOUT_MS = 5_000
const SECRETS = {
  keyId: 'pk_demo',
  apiSecret: 'demo-api-secret-not-for-production-0001',
  webhookSecret: 'demo-webhook-secret-not-for-production-01',
}

export async function runDemo({
  trades = 50,
  seed = 7,
  out = process.stdout,
  logger,
  keepConsole = false,
  consolePort = 0,
}: DemoOptions = {}): Promise<DemoReport> {
  // a fresh secret each run, as FORWARD_SECRET would be (whsec_ and the base64 of 32 random bytes)
  const forwardKey = randomBytes(32).toString('base64')
  const forwardSecret = `whsec_${forwardKey}`
  const adminToken = randomBytes(24).toString('hex')
  // the log lines go where the progress lines go: with --json, stdout holds the report alone
  const log =
    logger ??
    createLogger({
      level: 'error',
      secrets: [SECRETS.apiSecret, SECRETS.webhookSecret, forwardKey, adminToken],
      destination: demoLogLines(out),
    })
  const config = parseConfig({
    PARTNER_API_BASE_URL: 'http://127.0.0.1:1',
    PARTNER_API_KEY_ID: SECRETS.keyId,
    PARTNER_API_SECRET: SECRETS.apiSecret,
    WEBHOOK_SECRETS: SECRETS.webhookSecret,
    DATA_DIR: 'memory://',
    METRICS_ENABLED: 'false',
    ADMIN_TOKEN: adminToken,
  })
  const clock: Clock = systemClock
  const say = (text: string) => out.write(`${text}\n`)
  const startedAt = Date.now()
  say('demo: creating a throwaway in-memory database (PGlite initialises it: a few seconds)…')
  const database: DatabaseHandle = openDatabase({ dataDir: 'memory://' })
  let sandbox: Sandbox | undefined
  let receiver: Awaited<ReturnType<typeof listen>> | undefined
  let forwardReceiver: DemoForwardReceiver | undefined
  let dispatcher: Dispatcher | undefined
  let consoleServer: Awaited<ReturnType<typeof listen>> | undefined
  let kept = false
  try {
    await migrateToLatest(database.db)
    forwardReceiver = await startForwardReceiver(forwardSecret)
    // the seller notification service is down for the whole run, and back once the report is made
    const notifyService = { up: false }
    const reactions = createReactionRegistry()
      .on('trade.*', 'forwarder', createForwarder({ url: forwardReceiver.url, secret: forwardSecret, timeoutMs: 5_000 }))
      .on('trade.disputed', DEMO_FAILING_HANDLER, async () => {
        if (!notifyService.up) throw new Error('seller notification service answered 503 Service Unavailable (down for the whole demo run)')
      })
    // the dispatcher runs STALE_AFTER_S ahead (`later`): a job is due when it is enqueued, and a failing one's
    // retries come within the run
    const later: Clock = { now: () => Date.now() + (config.poll.staleAfterS + 1) * 1000, monotonicNow: clock.monotonicNow, sleep: clock.sleep }
    const startDispatcher = async () => {
      const started = createDispatcher({
        db: database.db,
        handler: reactions.handler,
        timeoutOf: reactions.timeoutOf,
        streams: reactions,
        clock: later,
        logger: log,
        listen: database.listen,
        // short backoffs, so a handler that keeps failing reaches the dead letter within the run
        settings: { ...DEFAULT_DISPATCHER_SETTINGS, concurrency: 8, maxAttempts: 5, backoff: { baseS: 0.1, capS: 1 } },
      })
      await started.start()
      return started
    }
    dispatcher = await startDispatcher()
    receiver = await listen(createApp({ config, db: database.db, logger: log, clock, reactions }), { port: 0, host: '127.0.0.1' })
    sandbox = createSandbox({
      ...SECRETS,
      webhookUrl: `${receiver.url}${config.webhook.path}`,
      retryBaseDelayMs: 5,
      refundDelayMs: 10,
      faults: { dropRate: 0.3, duplicateRate: 0.1, reorderRate: 0.15, delayRate: 0.1, delayMs: 20, seed },
      logger: log,
    })
    const client = new PartnerApiClient({
      baseUrl: await sandbox.listen(0),
      keyId: SECRETS.keyId,
      secret: SECRETS.apiSecret,
      env: 'sandbox',
      kind: 'marketplace',
      timeoutMs: DEMO_PARTNER_TIMEOUT_MS,
      clock,
      logger: log,
    })
    const observation = observationSettings(config, reactions.handlersFor)
    const deps: TradeDeps = {
      db: database.db,
      client,
      clock,
      logger: log,
      settings: { expectedWebhookS: config.poll.expectedWebhookS, observation, partnerKind: config.partner.kind, createTimeoutMs: DEMO_PARTNER_TIMEOUT_MS },
    }

    say(`demo: database ready after ${((Date.now() - startedAt) / 1000).toFixed(1)} s; ${trades} trades against the sandbox, with faults (seed ${seed})`)
    const plan = Array.from({ length: trades }, (_, index) => ({
      reference: `demo-${String(index + 1).padStart(3, '0')}`,
      kind: KINDS[index % KINDS.length]!,
    }))
    say(`demo: ${DEMO_FAILING_HANDLER}, a second reaction to disputes, calls a service that is down for this run: its jobs end failed, left for the operator (the table says how many), for the console`)
    const bar = progressBar(plan.length, out, 'trades')
    // a handful at a time, as a partner's traffic would arrive
    for (let start = 0; start < plan.length; start += 5) {
      await Promise.all(
        plan.slice(start, start + 5).map(async ({ reference, kind }) => {
          await runLifecycle(deps, sandbox!, reference, kind)
          bar.tick(`${reference} ${kind}`)
        }),
      )
    }
    bar.done()
    say('demo: waiting for the sandbox to finish its webhook retries…')
    await sandbox.idle()
    await leaveWorkForAnOperator(deps, sandbox, client)
    say('demo: reconciling: the poller fetches every order still open, as it would after STALE_AFTER_S')

    // as it would be once STALE_AFTER_S had passed: every order still open is due (`reconcile --requeue-open
    // --within 0`, due by the database's clock, which dates what the poller writes: a poller on a clock run ahead
    // would find each order it polled due again at once)
    await requeueOpenOrders(database.db, { withinS: 0, partnerEnv: config.partner.env })
    const poller = createPoller({
      db: database.db,
      fetcher: client,
      clock,
      logger: log,
      settings: {
        intervalS: 1,
        concurrency: 8,
        batchSize: 100,
        observation,
        leaseS: 60,
      },
      replica: 'demo',
    })
    let pollCycles = 0
    for (;;) {
      const summary = await poller.runOnce()
      pollCycles++
      say(`demo: poll cycle ${pollCycles}: ${summary.claimed} orders polled`)
      if (summary.claimed === 0 || pollCycles > 10) break
    }

    // (a few seconds here; on a machine busy with other work a minute and more, so the bound is generous)
    say('demo: waiting for the forwarder to hand every transition to the local receiver…')
    const stillPending = await forwarded(database, later, reactions.names, 90_000)
    await dispatcher.stop()
    dispatcher = undefined

    const report = await compare(deps, sandbox, plan, pollCycles, forwardReceiver, stillPending)
    say(`demo: done in ${((Date.now() - startedAt) / 1000).toFixed(1)} s`)
    if (!keepConsole) return report

    // the console, on what the run left; the notification service is back, so a retry succeeds
    notifyService.up = true
    dispatcher = await startDispatcher()
    consoleServer = await listen(
      // on the real clock (the times it shows); a retried job is due at once for the dispatcher, which runs ahead
      createAdminApp({ config, db: database.db, logger: log, clock, reactions, reconcileOnce: () => poller.runOnce() }),
      // the demo command's option, named when the port is taken
      { port: consolePort, host: '127.0.0.1', settings: { port: '--console-port', host: 'the console host' } },
    )
    const port = (consoleServer.server.address() as AddressInfo).port
    kept = true
    const running = { dispatcher, sandbox, receiver, forwardReceiver, consoleServer }
    return {
      ...report,
      console: {
        url: `http://127.0.0.1:${port}/console/`,
        token: adminToken,
        close: async () => {
          await running.consoleServer.stop(1_000)
          await running.dispatcher.stop()
          await running.sandbox.close()
          await running.receiver.stop(1_000)
          await running.forwardReceiver.close()
          await database.close()
        },
      },
    }
  } finally {
    if (!kept) {
      await consoleServer?.stop(1_000)
      await dispatcher?.stop()
      await sandbox?.close()
      await receiver?.stop(1_000)
      await forwardReceiver?.close()
      await database.close()
    }
  }
}

/**
 * What an operator meets in real life, made after the lifecycles with the sandbox's faults off (so it is
 * the same whatever the seed): a trade another system opened for a reference with no order here (its
 * webhook is parked), and an order imported with a trade id the platform does not know (the poller
 * flags it trade_not_found).
 */
async function leaveWorkForAnOperator(deps: TradeDeps, sandbox: Sandbox, client: PartnerApiClient): Promise<void> {
  sandbox.setFaults({ dropRate: 0, duplicateRate: 0, reorderRate: 0, delayRate: 0 })
  await client.createTrade({
    title: 'Opened by another system',
    amount: '15.00',
    currency: 'EUR',
    seller_id: 'seller-demo',
    external_reference: DEMO_ELSEWHERE_REFERENCE,
  })
  await sandbox.idle()
  const now = new Date(deps.clock.now())
  const { order } = await createOrder(
    deps.db,
    { externalReference: DEMO_UNKNOWN_TRADE_REFERENCE, now: () => now },
    deps.settings.observation,
  )
  // as an import from an older system would link it: the trade id it had, which the platform does not know
  await applyObservation(
    deps.db,
    apiObservation(
      { orderId: order.id, externalReference: DEMO_UNKNOWN_TRADE_REFERENCE },
      { trade_id: 'trd_imported_0000', status: 'created' },
      now,
    ),
    deps.settings.observation,
  )
  await schedulePollAfterApiCall(deps.db, order.id, { pollAfterS: 0, now })
}

/** Waits (up to `boundMs`) until no reaction job is left to run; answers how many still are. */
async function forwarded(database: DatabaseHandle, clock: Clock, handlers: readonly string[], boundMs: number): Promise<number> {
  const until = Date.now() + boundMs
  for (;;) {
    const stats = await reactionJobStats(database.db, new Date(clock.now()), handlers)
    const left = stats.pending + stats.running
    if (left === 0 || Date.now() > until) return left
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

async function runLifecycle(deps: TradeDeps, sandbox: Sandbox, reference: string, kind: DemoKind): Promise<void> {
  const base = { title: `Demo ${kind}`, amount: '40.00', currency: 'EUR', seller_id: 'seller-demo' }
  if (kind === 'milestone') {
    const trade = await openTradeForOrder(deps, reference, {
      ...base,
      // the milestones split the amount: their sum is the trade's
      amount: '30.00',
      milestones: [1, 2, 3].map((n) => ({ title: `Part ${n}`, amount: '10.00' })),
    })
    await runTradeOperation(deps, reference, { kind: 'fund' })
    for (const milestone of trade.milestones ?? []) {
      await runTradeOperation(deps, reference, { kind: 'deliver_milestone', milestoneId: milestone.milestone_id })
      await runTradeOperation(deps, reference, { kind: 'release_milestone', milestoneId: milestone.milestone_id })
    }
    return
  }
  const trade = await openTradeForOrder(deps, reference, base)
  // the receiver is "down" for this trade: all 6 attempts of each of its webhooks fail, so the refund
  // that follows its cancel reaches the order only through the poller
  if (kind === 'receiver down') sandbox.failTrade(trade.trade_id, true)
  await runTradeOperation(deps, reference, { kind: 'fund' })
  if (kind === 'cancelled' || kind === 'receiver down') {
    await runTradeOperation(deps, reference, { kind: 'cancel' })
    return
  }
  await runTradeOperation(deps, reference, { kind: 'deliver' })
  if (kind === 'disputed') {
    await runTradeOperation(deps, reference, {
      kind: 'dispute',
      request: { reason: 'the delivered item does not match its description', party: 'buyer', category: 'not_as_described' },
    })
    const first = await runTradeOperation(deps, reference, {
      kind: 'proposal',
      request: { outcome: 'split', split_buyer_pct: '90', party: 'buyer' },
    })
    await runTradeOperation(deps, reference, {
      kind: 'respond',
      proposalId: first.proposal_id,
      request: { accept: false, party: 'seller' },
    })
    const second = await runTradeOperation(deps, reference, {
      kind: 'proposal',
      request: { outcome: 'split', split_buyer_pct: '50', party: 'seller' },
    })
    await runTradeOperation(deps, reference, {
      kind: 'respond',
      proposalId: second.proposal_id,
      request: { accept: true, party: 'buyer' },
    })
    return
  }
  await runTradeOperation(deps, reference, { kind: 'release' })
}

async function compare(
  deps: TradeDeps,
  sandbox: Sandbox,
  plan: { reference: string; kind: DemoKind }[],
  pollCycles: number,
  forwardReceiver: DemoForwardReceiver,
  stillPending: number,
): Promise<DemoReport> {
  const rows = new Map<DemoKind, DemoRow>(
    KINDS.map((kind) => [
      kind,
      { kind, orders: 0, byApiAnswer: 0, byWebhook: 0, healedByPoller: 0, matching: 0, transitions: 0, forwarded: 0 },
    ]),
  )
  const forwardedByReference = new Map<string, number>()
  for (const event of forwardReceiver.events) {
    const reference = event.data.external_reference
    forwardedByReference.set(reference, (forwardedByReference.get(reference) ?? 0) + 1)
  }
  const planned = new Set(plan.map(({ reference }) => reference))
  const outsideTable = [...forwardedByReference]
    .filter(([reference]) => !planned.has(reference))
    .map(([reference, events]) => ({ reference, events }))
  const mismatches: DemoReport['mismatches'] = []
  for (const { reference, kind } of plan) {
    const row = rows.get(kind)!
    const order = await findOrderByExternalReference(deps.db, reference)
    const platform = sandbox.trade(order!.tradeId!).status
    row.orders++
    if (order?.tradeStatus === platform) row.matching++
    else mismatches.push({ reference, order: order?.tradeStatus ?? null, platform })
    const history = await orderHistory(deps.db, order!.id)
    row.transitions += history.length
    row.forwarded += forwardedByReference.get(reference) ?? 0
    const last = history.at(-1)
    if (last?.source === 'poll') row.healedByPoller++
    else if (last?.source === 'webhook') row.byWebhook++
    else row.byApiAnswer++
  }
  const log = sandbox.deliveryLog
  const failed = await countFailedJobsByHandler(deps.db)
  const parked = await searchDeliveries(deps.db, { externalReference: DEMO_ELSEWHERE_REFERENCE, outcome: 'unmatched' }, { limit: 1 })
  const flagged = await findOrderByExternalReference(deps.db, DEMO_UNKNOWN_TRADE_REFERENCE)
  const leftForOperator = {
    failedReactions: failed.reduce((sum, row) => sum + row.jobs, 0),
    parkedReferences: parked.deliveries.length > 0 ? [DEMO_ELSEWHERE_REFERENCE] : [],
    flaggedReferences: flagged?.attention ? [DEMO_UNKNOWN_TRADE_REFERENCE] : [],
  }
  return {
    leftForOperator,
    rows: [...rows.values()].filter((row) => row.orders > 0),
    mismatches,
    webhooks: {
      sent: new Set(log.map((attempt) => attempt.eventId)).size,
      dropped: log.filter((attempt) => attempt.result === 'dropped').length,
      duplicated: log.filter((attempt) => attempt.result === 'duplicate').length,
      failedAttempts: log.filter((attempt) => attempt.result === 'failed' || attempt.result === 'timeout').length,
    },
    pollCycles,
    forward: { ...forwardReceiver.stats, stillPending, outsideTable },
  }
}

export function formatDemoReport(report: DemoReport): string {
  const header = ['kind', 'orders', 'by API answer', 'by webhook', 'healed by poller', 'match platform', 'forwarded events']
  const lines = report.rows.map((row) => [
    row.kind,
    String(row.orders),
    String(row.byApiAnswer),
    String(row.byWebhook),
    String(row.healedByPoller),
    `${row.matching}/${row.orders}`,
    `${row.forwarded}/${row.transitions}`,
  ])
  const total = report.rows.reduce(
    (sum, row) => ({
      orders: sum.orders + row.orders,
      byApi: sum.byApi + row.byApiAnswer,
      byWebhook: sum.byWebhook + row.byWebhook,
      healed: sum.healed + row.healedByPoller,
      matching: sum.matching + row.matching,
      transitions: sum.transitions + row.transitions,
      forwarded: sum.forwarded + row.forwarded,
    }),
    { orders: 0, byApi: 0, byWebhook: 0, healed: 0, matching: 0, transitions: 0, forwarded: 0 },
  )
  lines.push([
    'all',
    String(total.orders),
    String(total.byApi),
    String(total.byWebhook),
    String(total.healed),
    `${total.matching}/${total.orders}`,
    `${total.forwarded}/${total.transitions}`,
  ])
  const widths = header.map((title, i) => Math.max(title.length, ...lines.map((line) => line[i]!.length)))
  const format = (cells: string[]) => cells.map((cell, i) => cell.padEnd(widths[i]!)).join('  ')
  const { webhooks } = report
  // the requests the table does not explain: whose they are
  const outside = report.forward.outsideTable
  const outsideEvents = outside.reduce((sum, order) => sum + order.events, 0)
  const outsideNote =
    outsideEvents === 0
      ? ''
      : `; ${outsideEvents} ${outsideEvents === 1 ? 'event' : 'events'} of ${outside.map((order) => order.reference).join(', ')}, not in the table`
  return [
    '',
    format(header),
    format(widths.map((width) => '-'.repeat(width))),
    ...lines.map(format),
    '',
    `webhooks: ${webhooks.sent} events sent by the sandbox; ${webhooks.dropped} deliveries dropped, ` +
      `${webhooks.duplicated} duplicated, ${webhooks.failedAttempts} attempts failed (and were retried)`,
    `poller: ${report.pollCycles} cycle(s) until no order was left due`,
    `forwarder: ${total.forwarded} of ${total.transitions} transitions received, signature verified, once each by webhook-id ` +
      `(${report.forward.requests} requests, ${report.forward.duplicates} repeats, ${report.forward.invalid} refused` +
      `${report.forward.stillPending ? `, ${report.forward.stillPending} still pending` : ''}${outsideNote})`,
    `left for an operator (the console's "needs a human"): ${report.leftForOperator.failedReactions} failed ${DEMO_FAILING_HANDLER} reaction(s) ` +
      `(its service was down for the run and is back: retry them), ${report.leftForOperator.parkedReferences.length} parked delivery ` +
      `(${DEMO_ELSEWHERE_REFERENCE}: a trade another system opened), ${report.leftForOperator.flaggedReferences.length} flagged order ` +
      `(${DEMO_UNKNOWN_TRADE_REFERENCE}: a trade id the platform does not know)`,
    report.mismatches.length === 0
      ? 'Every order matches the platform.'
      : `MISMATCH: ${report.mismatches.map((m) => `${m.reference} order=${m.order} platform=${m.platform}`).join('; ')}`,
    '',
  ].join('\n')
}
