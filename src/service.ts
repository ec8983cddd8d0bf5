// Wires the parts into the running service: database, HTTP app, migrations, the poller, the reaction
// dispatcher, retention's pruner, and the command forwarding of src/local. Every part registers how to stop it.
//
// stop() drains, then closes. At once: /readyz answers 503 (a load balancer stops sending requests here),
// the poller stops claiming and gives its unpolled claims back, and the reaction dispatcher stops claiming,
// lets running handlers finish and gives back the leases of those that could not: what they leave, other
// replicas take at once; the pruner stops between two batches. After SHUTDOWN_DRAIN_DELAY_MS (time for
// the balancer's health checks to notice) the public listener refuses new connections and lets requests in
// flight finish. Then the other parts stop in reverse order of start, the database last.
//
// The HTTP listener opens before the database is known to be there: while Postgres is unreachable at
// start-up the service retries (prepare-database.ts), /readyz answers 503 and deliveries get 503 (the
// platform retries them); once migrated, the poller starts and the service is ready.
import { randomUUID } from 'node:crypto'
import { hostname } from 'node:os'
import type { CliContext } from './cli/cli-context.js'
import { type Clock, systemClock } from './clock.js'
import type { Config } from './config.js'
import { type DatabaseHandle, embeddedDatabaseExists, openDatabase } from './db/open-database.js'
import { databaseClockOffsetMs, pingDatabase } from './db/ping-database.js'
import { createClockGuard } from './db/clock-guard.js'
import { reactionChannel } from './db/reaction-channel.js'
import { prepareDatabase } from './db/prepare-database.js'
import { checkStatementTimeout } from './db/statement-timeout.js'
import { checkSessionDefaults } from './db/session-defaults.js'
import { watchStatistics } from './db/statistics-watch.js'
import { watchStorage } from './db/storage-guard.js'
import { createAdminApp } from './http/admin-app.js'
import { createApp } from './http/app.js'
import { listen } from './http/server.js'
import { createLocalCliToken, type LocalCommandRunner, localCliRoutes } from './local/local-cli.js'
import { dataDirProblem } from './data-dir.js'
import { describeListenError, type ListenTarget } from './listen-error.js'
import { advertiseLocalService, databaseIdentity } from './local/running-service.js'
import type { Logger } from './logger.js'
import { probeListenTargets } from './probe-listen-targets.js'
import { createMetrics } from './metrics/metrics.js'
import { readTableSizes } from './db/table-sizes.js'
import { createDispatcherNotifier } from './orders/apply-observation.js'
import { observationSettings } from './orders/observations.js'
import { countOrdersNeedingAttention } from './orders/order.repository.js'
import { createPartnerApiClient } from './partner-api/create-partner-api-client.js'
import { configuredReactions } from './reactions/configured-reactions.js'
import { createDispatcher, type Dispatcher } from './reactions/dispatcher.js'
import { DEFAULT_DISPATCHER_SETTINGS } from './reactions/dispatcher-settings.js'
import type { ReactionRegistry } from './reactions/reaction-registry.js'
import { reactionJobStats } from './reactions/reaction-job.repository.js'
import { createPoller, dueOrderStats, longestCycleMs, type Poller, type PollResult, pollerSettings, type RunSummary } from './reconcile/poller.js'
import { createPruner, type Pruner, prunerSettings } from './retention/prune.js'
import { createSandbox } from './sandbox/create-sandbox.js'
import { sandboxStateFile } from './sandbox/sandbox-state.js'
import { countParkedDeliveries, oldestDeliveryReceivedAt } from './webhooks/delivery.repository.js'
import { createDeliveryIngest } from './webhooks/delivery-ingest.js'
import { configuredEventHandlers } from './webhooks/event-handlers.js'
import { serviceVersion } from './version.js'

export interface RunningService {
  /** The public listener: the webhook path, /healthz, /readyz. */
  readonly url: string
  /** The operator listener: metrics and, in local mode, the command endpoint. */
  readonly adminUrl: string
  readonly database: DatabaseHandle
  /** Settles once the database is migrated and the poller started; rejects if that cannot happen. */
  readonly ready: Promise<void>
  /** The reconciliation poller, once ready; undefined when POLL_ENABLED=false. */
  readonly poller: Poller | undefined
  /** The reaction dispatcher, once ready. */
  readonly dispatcher: Dispatcher | undefined
  /** Retention's pruning loop, once ready (on Postgres one replica at a time prunes). */
  readonly pruner: Pruner | undefined
  /** Local mode only: the in-process sandbox platform's URL. */
  readonly sandboxUrl: string | undefined
  /** Drains (see above; the delay only once the service was ready), then stops every part. */
  stop(options?: { drainDelayMs?: number }): Promise<void>
  /** The parts whose stop has begun and not yet ended; `part: step` for a part that says what its stop waits for. */
  stillStopping(): string[]
}

export async function startService({
  config,
  logger,
  clock = systemClock,
  runCommand,
  registerReactions,
  partnerHandlers = true,
  pgliteTemplate,
  random = Math.random,
}: {
  config: Config
  logger: Logger
  clock?: Clock
  /** The poller's source in [0, 1) for its jitter (between cycles, and each order's error backoff). */
  random?: () => number
  /** Runs a second terminal's command line here (the entry point's, src/cli/run-cli.ts); none: no endpoint. */
  runCommand?: LocalCommandRunner | undefined
  /** Reaction handlers registered in code beside the configured ones and partner-handlers.ts. */
  registerReactions?: ((reactions: ReactionRegistry) => void) | undefined
  /**
   * Whether the fork's handlers (registerPartnerHandlers in partner-handlers.ts) run: the project's own tests start
   * the service without them (test/helpers/test-service.ts); a fork's tests of its handlers turn them on.
   */
  partnerHandlers?: boolean | undefined
  /**
   * A PGlite cluster (a dump, as `dumpDataDir` gives) that an embedded database in `memory://` starts from
   * instead of an initdb of its own: the tests' initialised one. Not read for a DATA_DIR on disk or Postgres.
   */
  pgliteTemplate?: Blob | undefined
}): Promise<RunningService> {
  // `takesWork`: stopped first: the claims at once, the requests when the drain delay ends
  // `waitingOn`: what a part's stop waits for now, named beside the part when the stop runs past its bound
  const stops: {
    name: string
    stop: () => Promise<void> | void
    takesWork?: 'claims' | 'requests'
    waitingOn?: () => string | undefined
  }[] = []
  let draining = false
  let ready = false
  // the parts whose stop has begun and not ended: what a stop past its bound names as what it waited for
  const stopping = new Map<string, (() => string | undefined) | undefined>()
  const stopPart = async ({ name, stop, waitingOn }: (typeof stops)[number]) => {
    stopping.set(name, waitingOn)
    try {
      await stop()
    } catch (error) {
      logger.error({ err: error, part: name }, 'stop failed')
    } finally {
      stopping.delete(name)
    }
  }
  const stopAll = async ({ drainDelayMs = 0 }: { drainDelayMs?: number } = {}) => {
    draining = true
    const parts = stops.splice(0).reverse()
    const claimsStopped = Promise.all(parts.filter((part) => part.takesWork === 'claims').map(stopPart))
    if (ready && drainDelayMs > 0) {
      logger.info({ drainDelayMs }, 'draining: /readyz answers 503; still serving until the load balancer notices')
      await new Promise((resolve) => setTimeout(resolve, drainDelayMs))
    }
    await Promise.all([claimsStopped, ...parts.filter((part) => part.takesWork === 'requests').map(stopPart)])
    for (const part of parts.filter((part) => !part.takesWork)) await stopPart(part)
  }

  // local mode: no platform is configured, so the sandbox plays it in this process (never for live)
  const runsSandbox = config.partner.mode === 'local' && config.partner.env === 'sandbox'
  const sandboxTarget: ListenTarget = { portSetting: 'SANDBOX_PORT', hostSetting: 'the sandbox host', port: config.sandbox.port, host: '127.0.0.1' }
  try {
    // the reaction handlers (the forwarder, the fork's own): the app, the poller, the console, forwarded commands and
    // the dispatcher share them. Registered first: a registration the code got wrong ends the start before anything
    // is opened, with its coded line (reaction-setup-error.ts)
    const reactions = configuredReactions(config, { clock, logger, register: registerReactions, partnerHandlers })
    // closed after the dispatcher stopped (stops run in reverse): no handler is publishing by then
    stops.push({ name: 'reaction handlers', stop: () => reactions.close() })
    // a taken port ends the start before the database is opened or, on a first start, made (PGlite's initdb)
    await probeListenTargets([
      { portSetting: 'PORT', hostSetting: 'HOST', port: config.port, host: config.host },
      { portSetting: 'ADMIN_PORT', hostSetting: 'ADMIN_HOST', port: config.admin.port, host: config.admin.host },
      ...(runsSandbox ? [sandboxTarget] : []),
    ])
    const template = !config.databaseUrl && config.dataDir.startsWith('memory://') ? pgliteTemplate : undefined
    if (!config.databaseUrl && !template && !embeddedDatabaseExists(config.dataDir)) {
      // PGlite's initdb runs once, silently, for several seconds: say so
      logger.info({ dataDir: config.dataDir }, 'initialising the embedded database (first start only)')
    }
    const database = openDatabase({
      databaseUrl: config.databaseUrl,
      listenUrl: config.databaseListenUrl,
      dataDir: config.dataDir,
      pgliteTemplate: template,
      poolSize: config.databasePoolSize,
      statementTimeoutMs: config.databaseStatementTimeoutMs,
      // a command run in a second terminal before the service wrote serve.json opens the database for a moment
      lockWaitMs: SERVE_LOCK_WAIT_MS,
      maxWalBytes: config.dataDirMaxWalBytes,
      minFreeBytes: config.dataDirMinFreeBytes,
      logger,
    })
    stops.push({ name: 'database', stop: () => database.close() })
    // the embedded database on disk: deliveries are refused while its disk is almost full (db/storage-guard.ts)
    const storage =
      !config.databaseUrl && !config.dataDir.startsWith('memory://') && config.dataDirMinFreeBytes > 0
        ? watchStorage({ directory: config.dataDir, minFreeBytes: config.dataDirMinFreeBytes, logger })
        : undefined
    if (storage) stops.push({ name: 'storage guard', stop: () => storage.stop() })
    // the embedded database has no autovacuum to keep its planner's statistics current, and a Postgres may run
    // with it off: the service stands in for it there (db/statistics-watch.ts)
    const statistics = watchStatistics({ db: database.db, logger, clock, whileAutovacuumOff: database.kind === 'postgres' })
    stops.push({ name: 'statistics watch', stop: () => statistics.stop() })
    let markReady!: () => void
    let markFailed!: (error: unknown) => void
    const databaseReady = new Promise<void>((resolve, reject) => {
      markReady = resolve
      markFailed = reject
    })
    databaseReady.catch(() => {})
    const metrics = config.metrics.enabled
      ? createMetrics({
          poolStats: database.poolStats,
          databaseUp: () => pingDatabase(database.db),
          // PGlite runs on this machine's own clock
          ...(database.kind === 'postgres' ? { databaseClockOffset: () => databaseClockOffsetMs(database.db, clock) } : {}),
          ...(database.notificationsHeard ? { notificationsHeard: database.notificationsHeard } : {}),
          ...(database.kind === 'postgres' ? { autovacuumOff: () => statistics.autovacuumOff() } : {}),
          dueOrders: () => dueOrderStats(database.db, clock, config.partner.env),
          parkedDeliveries: () => countParkedDeliveries(database.db, new Date(clock.now())),
          ordersNeedingAttention: () => countOrdersNeedingAttention(database.db),
          reactionJobs: () => reactionJobStats(database.db, new Date(clock.now()), reactions.names),
          oldestDelivery: () => oldestDeliveryReceivedAt(database.db),
          tableSizes: () => readTableSizes(database.db),
          ...(storage ? { dataDirStorage: { freeBytes: () => storage.freeBytes, minFreeBytes: storage.minFreeBytes } } : {}),
          pruneIntervalS: config.retention.intervalS,
          ...(config.poll.enabled ? { pollIntervalS: config.poll.intervalS, pollLongestCycleS: longestCycleMs(config) / 1000 } : {}),
        }, { clock })
      : undefined
    // a second terminal's commands are run here (operator listener), on this database, in every mode (src/local).
    // On Postgres DATA_DIR holds nothing else: one this process cannot write (a read-only root file system in a
    // container) costs that convenience only, and a second terminal's commands run on their own
    const dataDirUnusable = config.dataDir.startsWith('memory://') ? undefined : dataDirProblem(config.dataDir)
    if (dataDirUnusable) {
      logger.warn({ problem: dataDirUnusable }, 'DATA_DIR cannot be written: serve.json is not written, and commands in a second terminal run on their own')
    }
    const advertised = !config.dataDir.startsWith('memory://') && !dataDirUnusable
    const localCliToken = advertised && runCommand ? createLocalCliToken() : undefined
    const eventHandlers = configuredEventHandlers()
    // After this process's own commit that enqueued jobs, its dispatcher is woken at once (no NOTIFY round
    // trip). The NOTIFY is for the other replicas: it names this process (its own listener ignores it), and
    // it is sent only while this one drains, or while another process listens (looked up every few seconds)
    // and may hold a handler's stream (new events create no job: only a stream's holder has work to do).
    let dispatcher: Dispatcher | undefined
    const notifyToken = randomUUID()
    const notifyOtherReplicas = createDispatcherNotifier(database.db, notifyToken)
    const otherReplicas = watchOtherListeners(database, logger)
    stops.push({ name: 'replica watch', stop: otherReplicas.stop })
    const onJobsEnqueued = () => {
      // its own commit brought events: the streams read them (no job row became due, so the job loop sleeps on)
      dispatcher?.wakeStreams()
      if (draining || (otherReplicas.present() && !dispatcher?.holdsEveryStream())) notifyOtherReplicas()
    }
    // STALE_AFTER_S, the reaction handlers and the wake, bound once: every observation this process applies uses them
    const observation = observationSettings(config, reactions.handlersFor, onJobsEnqueued)
    const app = createApp({
      config,
      db: database.db,
      logger,
      clock,
      metrics,
      eventHandlers,
      reactions,
      ingest: createDeliveryIngest({
        config,
        db: database.db,
        logger,
        settings: observation,
        metrics,
        onParked: (count) => statistics.parkedStored(count),
      }),
      isReady: () => ready,
      isDraining: () => draining,
      storageLow: storage && (() => storage.low),
    })
    const server = await listen(app, {
      port: config.port,
      host: config.host,
      connectionCap: {
        maxConnections: config.limits.maxConnections,
        slowMs: config.limits.slowBodyMs,
        onDropped: () => metrics?.requestsRefused.inc({ reason: 'max_connections' }),
        onCut: () => metrics?.requestsRefused.inc({ reason: 'slow_connection' }),
      },
      onTimedOut: () => metrics?.requestsRefused.inc({ reason: 'request_timeout' }),
      onBodyIncomplete: () => metrics?.requestsRefused.inc({ reason: 'body_incomplete' }),
    })
    // half of SHUTDOWN_TIMEOUT_MS for requests in flight (after the drain delay; the poller and the
    // dispatcher stop from the signal on), the rest for stopping the parts after it
    stops.push({
      name: 'http server',
      stop: () => server.stop(Math.floor(config.shutdownTimeoutMs / 2)),
      takesWork: 'requests',
    })
    // the console's "run one cycle now": a one-off poller like `reconcile --once`, once the database is ready
    const consoleActions: { reconcileOnce?: () => Promise<RunSummary> } = {}
    // what a second terminal's command runs with in this process; its config names the sandbox's own port below,
    // once it listens (SANDBOX_PORT=0 gave those commands http://127.0.0.1:0 for the platform)
    const commandContext: CliContext = {
      config,
      db: database.db,
      holdLock: database.holdLock,
      vacuum: database.vacuum,
      withoutTimeouts: database.withoutTimeouts,
      logger,
      reactions,
      eventHandlers,
      retentionHooks: metrics?.retentionHooks,
      onPollResult: metrics ? ({ result }) => metrics.pollResults.inc({ result }) : undefined,
    }
    const adminServer = await listen(
      createAdminApp({
        config,
        db: database.db,
        logger,
        metrics,
        routes:
          localCliToken && runCommand
            ? [
                localCliRoutes({
                  token: localCliToken,
                  context: commandContext,
                  runCommand,
                  whenReady: databaseReady,
                }),
              ]
            : [],
        clock,
        reconcileOnce: async () => (ready && consoleActions.reconcileOnce ? consoleActions.reconcileOnce() : undefined),
        reactions,
        eventHandlers,
      }),
      { port: config.admin.port, host: config.admin.host, settings: { port: 'ADMIN_PORT', host: 'ADMIN_HOST' } },
    )
    stops.push({ name: 'operator http server', stop: () => adminServer.stop(Math.floor(config.shutdownTimeoutMs / 2)) })
    logger.info({ url: server.url, adminUrl: adminServer.url, database: database.kind }, 'http listener open; waiting for the database')

    let sandboxUrl: string | undefined
    if (runsSandbox) {
      const sandbox = createSandbox({
        keyId: config.partner.keyId,
        apiSecret: config.partner.secret,
        webhookSecret: config.webhook.secrets[0]!,
        webhookUrl: `${server.url}${config.webhook.path}`,
        controlToken: config.sandbox.controlToken,
        partnerKind: config.partner.kind,
        milestoneAnswer: config.sandbox.milestoneAnswer,
        stateFile: sandboxStateFile(config.dataDir),
        clock,
        logger,
      })
      sandboxUrl = await sandbox
        .listen(sandboxTarget.port, sandboxTarget.host)
        .catch((error: unknown) => {
          throw describeListenError(error, sandboxTarget)
        })
      stops.push({ name: 'sandbox', stop: () => sandbox.close() })
      logger.info({ url: sandboxUrl }, 'sandbox platform listening')
      commandContext.config = { ...config, partner: { ...config.partner, baseUrl: sandboxUrl } }
    }

    if (localCliToken) {
      const advertised = await advertiseLocalService(config.dataDir, {
        url: server.url,
        adminUrl: adminServer.url,
        token: localCliToken,
        webhookUrl: `${server.url}${config.webhook.path}`,
        sandboxUrl,
        mode: config.partner.mode,
        database: databaseIdentity(config),
        platform: { env: config.partner.env, baseUrl: commandContext.config.partner.baseUrl ?? '', keyId: config.partner.keyId },
      })
      stops.push({ name: 'serve.json', stop: advertised.remove })
      if (advertised.other !== undefined) {
        logger.warn(
          { dataDir: config.dataDir, pid: advertised.other },
          'another service runs from this DATA_DIR and keeps serve.json: commands in a second terminal go to it, not to this one',
        )
      }
    }

    const fetcher = createPartnerApiClient(config, {
      logger,
      clock,
      ...(sandboxUrl ? { baseUrl: sandboxUrl } : {}),
      ...(metrics ? { onClockOffset: metrics.partnerApiHooks.onClockOffset } : {}),
    })
    // no lease nor due time written by a clock far from the database's: the poller's and the dispatcher's claims ask
    // it first (db/clock-guard.ts), measured against the clock they write with
    const clockGuard = createClockGuard({ db: database.db, clock, logger, onRefused: (loop) => metrics?.clockOffsetRefused.inc({ loop }) })
    const pollerOf = (replica: string, hooks = {}) =>
      createPoller({
        db: database.db,
        fetcher,
        clock,
        random,
        logger,
        settings: pollerSettings(config.poll, observation, config.partner, config.databaseStatementTimeoutMs),
        replica,
        clockGuard,
        ...hooks,
      })
    // its polls count in poller_polls_total as the poller's do (a 401 among them sets off the unauthorized alert); its
    // cycle is not the poller's own, which the stalled-poller alert watches
    consoleActions.reconcileOnce = () =>
      pollerOf(`console:${hostname()}:${process.pid}`, metrics ? { onPollResult: ({ result }: PollResult) => metrics.pollResults.inc({ result }) } : {}).runOnce()
    let poller: Poller | undefined
    let pruner: Pruner | undefined
    const startUp = new AbortController()
    stops.push({ name: 'database start-up', stop: () => startUp.abort(), takesWork: 'claims' })
    // a loop that claims work: started, and stopped at the signal (its claims given back), before the database
    const runLoop = async <T extends { start(): void | Promise<void>; stop(): Promise<void>; waitingOn?(): string | undefined }>(
      name: string,
      loop: T,
    ) => {
      await loop.start()
      stops.push({ name, stop: () => loop.stop(), takesWork: 'claims', ...(loop.waitingOn ? { waitingOn: () => loop.waitingOn?.() } : {}) })
      return loop
    }
    const whenReady = (async () => {
      const { applied } = await prepareDatabase({ database, logger, clock, signal: startUp.signal })
      logger.info({ applied, database: database.kind }, 'migrations applied')
      await checkStatementTimeout(database, logger)
      await checkSessionDefaults(database, logger)
      if (startUp.signal.aborted || draining) return
      if (config.poll.enabled) {
        poller = await runLoop('poller', pollerOf(`${hostname()}:${process.pid}`, metrics ? metrics.pollerHooks(clock) : {}))
      }
      // every replica runs one
      dispatcher = await runLoop(
        'reaction dispatcher',
        createDispatcher({
          db: database.db,
          handler: reactions.handler,
          timeoutOf: reactions.timeoutOf,
          streams: reactions,
          clock,
          logger,
          clockGuard,
          listen: (channel, onNotify) =>
            database.listen(channel, (payload) => {
              if (payload !== notifyToken) onNotify()
            }),
          settings: {
            ...DEFAULT_DISPATCHER_SETTINGS,
            concurrency: config.reactions.concurrency,
            maxAttempts: config.reactions.maxAttempts,
            leaseMs: config.reactions.leaseS * 1000,
            backoff: config.reactions.backoff,
            heldBackWarnMs: config.reactions.heldBackWarnS * 1000,
            // from the signal on, beside the public listener, which has the same half after the drain delay
            shutdownTimeoutMs: Math.floor(config.shutdownTimeoutMs / 2),
          },
          ...(metrics ? metrics.reactionHooks(reactions.names) : {}),
        }),
      )
      // every replica runs the loop; the advisory lock lets one prune at a time. Stopped at the signal, between batches.
      pruner = await runLoop(
        'pruner',
        createPruner({
          db: database.db,
          holdLock: database.holdLock,
          vacuum: database.vacuum,
          clock,
          logger,
          settings: prunerSettings(config.retention),
          onPruned: metrics?.retentionHooks.onPruned,
          onPass: metrics ? (_result, finishedAt) => metrics.retentionHooks.onPass(finishedAt) : undefined,
        }),
      )
      // the embedded database's start leaves 150-190 MB of garbage that V8 would keep for seconds more
      await database.collectGarbage?.()
      ready = true
      logger.info(
        {
          url: server.url,
          adminUrl: adminServer.url,
          database: database.kind,
          webhookPath: config.webhook.path,
          version: serviceVersion(),
        },
        'service listening',
      )
    })()
    whenReady.then(markReady, markFailed)

    return {
      url: server.url,
      adminUrl: adminServer.url,
      database,
      ready: whenReady,
      get poller() {
        return poller
      },
      get dispatcher() {
        return dispatcher
      },
      get pruner() {
        return pruner
      },
      sandboxUrl,
      stop: stopAll,
      stillStopping: () =>
        [...stopping].map(([name, waitingOn]) => {
          const step = waitingOn?.()
          return step === undefined ? name : `${name}: ${step}`
        }),
    }
  } catch (error) {
    await stopAll()
    throw error
  }
}

// How often a replica looks for the other processes listening for reaction jobs.
// How long a start waits for the embedded database's lock that a running process holds: a command's moment, not a
// second `npm start`, which is refused after it
const SERVE_LOCK_WAIT_MS = 10_000
const LISTENER_LOOK_INTERVAL_MS = 5_000

/**
 * Whether another process listens on `channel`, looked up every few seconds. Until the first answer, and
 * whenever a look fails, the answer is yes: a NOTIFY too many costs a statement, one too few a replica's wake.
 */
function watchOtherListeners(database: DatabaseHandle, logger: Logger): { present(): boolean; stop(): void } {
  let present = true
  let failing = false
  // this schema's channel, asked of the database once it answers
  let channel: string | undefined
  const others = async () => database.otherListeners((channel ??= await reactionChannel(database.db)))
  const look = () => {
    others().then(
      (sessions) => {
        // undefined: it cannot tell
        present = sessions === undefined || sessions > 0
        failing = false
      },
      (error: unknown) => {
        present = true
        if (!failing) logger.debug({ err: error }, 'cannot count the other replicas listening; notifying them all the same')
        failing = true
      },
    )
  }
  look()
  const timer = setInterval(look, LISTENER_LOOK_INTERVAL_MS)
  timer.unref()
  return { present: () => present, stop: () => clearInterval(timer) }
}
