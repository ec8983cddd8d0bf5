// The public application, what the platform reaches: the webhook path, /healthz and /readyz, nothing
// else (metrics and operator endpoints are on the operator listener, admin-app.ts). Built from its
// dependencies; it never listens (see server.ts). POST to the webhook path goes straight to its endpoint
// on Node's own request and response (webhook-endpoint.ts: the hot path, without Express's per-request
// work); everything else to Express.
import express from 'express'
import type { Kysely } from 'kysely'
import { type Clock, monotonicNow } from '../clock.js'
import type { Config } from '../config.js'
import type { Database } from '../db/database.js'
import { diskFullNote } from '../db/disk-full-note.js'
import type { Logger } from '../logger.js'
import type { Metrics } from '../metrics/metrics.js'
import { observationSettings } from '../orders/observations.js'
import type { ReactionRouting } from '../reactions/reaction-registry.js'
import { errorBody } from './app-error.js'
import { errorHandler, notFoundHandler } from './error-handler.js'
import { healthRoutes } from './health.routes.js'
import { InflightBodyBudget } from './inflight-body-budget.js'
import { type App, expressListener, readRequestTarget } from './request-target.js'
import { createDeliveryIngest, type DeliveryIngest } from '../webhooks/delivery-ingest.js'
import { createEventHandlers, type EventHandlers } from '../webhooks/event-handlers.js'
import { webhookEndpoint } from '../webhooks/webhook-endpoint.js'

export interface AppDeps {
  config: Config
  db: Kysely<Database>
  logger: Logger
  clock: Clock
  /** Prometheus metrics the webhook routes record into (served by the operator listener). */
  metrics?: Metrics | undefined
  /** False while the service waits for its database at start-up: /readyz and deliveries answer 503. */
  isReady?: () => boolean
  /**
   * True once a signal arrived: /readyz answers 503 so a load balancer stops sending work here, while
   * requests that still arrive are served (each answer closes its connection, so none is reused).
   */
  isDraining?: () => boolean
  /**
   * The embedded database's data directory is almost full (db/storage-guard.ts): deliveries and /readyz answer
   * 503 until space is freed.
   */
  storageLow?: (() => boolean) | undefined
  /** Seller and buyer event handlers (service.ts registers the fork's); none when not given. */
  eventHandlers?: EventHandlers | undefined
  /** The reaction handlers: whether an observation the app applies brings events for them (none when absent). */
  reactions?: ReactionRouting | undefined
  /** The group commit and the memory of stored ids (service.ts makes them); made here when absent. */
  ingest?: DeliveryIngest | undefined
}

export type { App }

export function createApp(deps: AppDeps): App {
  const ingest =
    deps.ingest ??
    createDeliveryIngest({ ...deps, settings: observationSettings(deps.config, deps.reactions?.handlersFor) })
  const path = deps.config.webhook.path
  // a delivery refused for a full disk turns /readyz 503 (db/disk-full-note.ts); its hold timed on the monotonic
  // clock: by the wall clock, one stepped back an hour kept /readyz unready for that hour
  const diskFull = diskFullNote(() => monotonicNow(deps.clock))
  const webhook = webhookEndpoint({
    ...deps,
    diskFull,
    ...ingest,
    eventHandlers: deps.eventHandlers ?? createEventHandlers(),
    path,
    bodyLimitBytes: deps.config.webhook.bodyLimitBytes,
    // body bytes are reserved before a byte is read, so held-open bodies cannot grow the process's memory
    budget: new InflightBodyBudget(deps.config.limits.maxInflightBodyBytes, deps.config.limits.slowBodyMs),
    secrets: deps.config.webhook.secrets,
  })

  const app = express()
  app.disable('x-powered-by')
  app.set('trust proxy', false)
  // <, > and & in an answer's JSON as \u escapes: a 404 echoes the path an outsider sent
  app.set('json escape', true)
  if (deps.isDraining) {
    const isDraining = deps.isDraining
    app.use((_req, res, next) => {
      if (isDraining()) res.setHeader('Connection', 'close')
      next()
    })
  }
  app.use(healthRoutes({ ...deps, diskFull }))
  // the path as Express matches it (a trailing slash, another letter case): the same endpoint
  app.post(path, (req, res) => webhook(req, res))
  // another method on the webhook's path (a browser's GET, a probe's HEAD) is told the one it takes: a 404 there
  // read as if the path were wrong, and sent operators looking for a typo in WEBHOOK_PATH
  app.all(path, (req, res) => {
    res.setHeader('Allow', 'POST')
    res.status(405).json(errorBody('method_not_allowed', `${req.method} is not accepted here: the platform POSTs its webhooks to this path`))
  })
  app.use(notFoundHandler())
  app.use(errorHandler(deps.logger))

  const viaExpress = expressListener(app)
  // the exact path, as the platform is configured to send it, skips Express
  return (req, res) => {
    if (!readRequestTarget(req, res)) return
    if (req.method === 'POST' && pathOf(req.url) === path) webhook(req, res)
    else viaExpress(req, res)
  }
}

function pathOf(url: string | undefined): string {
  if (url === undefined) return ''
  const query = url.indexOf('?')
  return query === -1 ? url : url.slice(0, query)
}
