// The operator Express application, on its own listener (ADMIN_PORT, bound to 127.0.0.1 by default):
// Prometheus metrics, the operator console (/console/, when ADMIN_TOKEN is set) and the routes the
// composition root gives it (service.ts: the command endpoint the CLI forwards to). Whoever can reach the
// public webhook URL reaches none of this.
import { finished } from 'node:stream/promises'
import express, { type RequestHandler, type Router } from 'express'
import type { Kysely } from 'kysely'
import { type Clock, systemClock } from '../clock.js'
import type { Config } from '../config.js'
import { consoleRoutes } from '../console/console.routes.js'
import { consolePath, withForwardedPrefix } from '../console/console-views.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import type { Metrics } from '../metrics/metrics.js'
import { observationSettings } from '../orders/observations.js'
import type { ReactionRouting } from '../reactions/reaction-registry.js'
import { longestCycleMs, type RunSummary } from '../reconcile/poller.js'
import { errorHandler, notFoundHandler } from './error-handler.js'
import { leaveBodyUnread } from './expect-continue.js'
import { isAllowedAdminHost, isLoopbackAddress } from './loopback-host.js'
import type { EventHandlers } from '../webhooks/event-handlers.js'
import { metricsRoutes } from './metrics.routes.js'
import { type App, expressListener, readRequestTarget } from './request-target.js'

export interface AdminAppDeps {
  config: Config
  /** The service's database, for operator routes that read it. */
  db: Kysely<Database>
  logger: Logger
  /** Prometheus metrics; GET config.metrics.path serves them when given and enabled. */
  metrics?: Metrics | undefined
  /** More operator routes (the local command endpoint, src/local/local-cli.ts), after the metrics. */
  routes?: readonly Router[] | undefined
  clock?: Clock
  /** The console's "run one reconcile cycle now"; answers undefined while the service is not ready. */
  reconcileOnce?: (() => Promise<RunSummary | undefined>) | undefined
  /**
   * The reaction handlers: whether a delivery the console re-applies brings events for them (none when
   * absent), and their names (only the registered handlers' streams count as pending).
   */
  reactions?: (ReactionRouting & { readonly names?: readonly string[] }) | undefined
  /** The seller and buyer event handlers a delivery the console re-applies runs again (none when absent). */
  eventHandlers?: EventHandlers | undefined
  /** The console page's deadline on the database (console.routes.ts, CONSOLE_PAGE_ANSWER_MS by default). */
  consolePageAnswerMs?: number | undefined
}

export function createAdminApp(deps: AdminAppDeps): App {
  const app = express()
  app.disable('x-powered-by')
  app.set('trust proxy', false)
  // <, > and & in an answer's JSON as \u escapes: a 404 echoes the path an outsider sent
  app.set('json escape', true)
  app.use(allowedHostOnly(deps.config.admin))
  if (deps.metrics && deps.config.metrics.enabled) {
    app.use(metricsRoutes({ metrics: deps.metrics, path: deps.config.metrics.path }))
  }
  if (deps.config.adminToken) {
    app.use(
      consoleRoutes({
        token: deps.config.adminToken,
        db: deps.db,
        logger: deps.logger,
        clock: deps.clock ?? systemClock,
        metrics: deps.metrics,
        observation: observationSettings(deps.config, deps.reactions?.handlersFor),
        bodyRetentionDays: deps.config.retention.bodyDays,
        reconcileOnce: deps.reconcileOnce,
        longestCycleMs: longestCycleMs(deps.config),
        reactionHandlers: deps.reactions?.names,
        eventHandlers: deps.eventHandlers,
        pageAnswerMs: deps.consolePageAnswerMs,
      }),
    )
    app.get('/', (req, res) => withForwardedPrefix(req.headers['x-forwarded-prefix'], () => finished(res), () => res.redirect(`${consolePath()}/`)))
  }
  for (const routes of deps.routes ?? []) app.use(routes)
  app.use(notFoundHandler())
  app.use(errorHandler(deps.logger))
  // a target Express cannot read, or nothing that answered: a 404 in the error shape, as on the public listener
  const viaExpress = expressListener(app)
  return (req, res) => {
    if (readRequestTarget(req, res)) viaExpress(req, res)
  }
}

/**
 * A Host of a name nobody listed is a browser that a web page's own name, rebound to this listener's address, sent
 * here (DNS rebinding), and it would read /metrics and the console's pages as that page's: refused before anything
 * else, from the headers. Loopback names, IP addresses and the names in ADMIN_ALLOWED_HOSTS are answered. Bound to
 * 0.0.0.0 and published on the host's loopback (the compose recipe), the listener used to answer any Host.
 */
function allowedHostOnly({ host, allowedHosts }: Config['admin']): RequestHandler {
  const loopback = isLoopbackAddress(host)
  return (req, res, next) => {
    // (two Host headers: Node keeps the first, and which one a proxy in front read is anyone's guess)
    if (isAllowedAdminHost(req.headers.host, allowedHosts) && (req.headersDistinct.host?.length ?? 0) <= 1) return next()
    leaveBodyUnread(req, res)
    res.status(403).json({
      error: {
        code: 'forbidden_host',
        message:
          `The operator listener (ADMIN_HOST=${host}) answers only a Host that is localhost, an IP address or a name ` +
          `in ADMIN_ALLOWED_HOSTS; ${loopback ? 'a proxy in front of it must send one of them as Host, or' : 'to reach it by name,'} ` +
          'list the name in ADMIN_ALLOWED_HOSTS',
      },
    })
  }
}
