// The Express application, built from its dependencies; it never listens (see server.ts).
import express, { type Express } from 'express'
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Config } from '../config.js'
import type { Database } from '../db/database.js'
import { localCliRoutes } from '../local/local-cli.js'
import type { Logger } from '../logger.js'
import type { Metrics } from '../metrics/metrics.js'
import { errorHandler, notFoundHandler } from './error-handler.js'
import { healthRoutes } from './health.routes.js'
import { metricsRoutes } from './metrics.routes.js'
import { webhookRoutes } from '../webhooks/webhook.routes.js'

export interface AppDeps {
  config: Config
  db: Kysely<Database>
  logger: Logger
  clock: Clock
  /** Prometheus metrics; GET config.metrics.path serves them when given. */
  metrics?: Metrics | undefined
  /** False while the service waits for its database at start-up: /readyz and deliveries answer 503. */
  isReady?: () => boolean
  /** Local mode on embedded PGlite: run forwarded operator commands (src/local/local-cli.ts). */
  localCliToken?: string | undefined
}

export function createApp(deps: AppDeps): Express {
  const app = express()
  app.disable('x-powered-by')
  app.set('trust proxy', false)
  app.use(healthRoutes(deps))
  app.use(
    webhookRoutes({
      ...deps,
      path: deps.config.webhook.path,
      bodyLimitBytes: deps.config.webhook.bodyLimitBytes,
      batch: { maxBatch: deps.config.webhook.batchMax, maxInFlight: deps.config.webhook.batchStatements },
      seenCapacity: deps.config.webhook.seenCacheSize,
      secrets: deps.config.webhook.secrets,
      settings: { staleAfterS: deps.config.poll.staleAfterS },
    }),
  )
  if (deps.metrics && deps.config.metrics.enabled) app.use(metricsRoutes({ metrics: deps.metrics, path: deps.config.metrics.path }))
  if (deps.localCliToken) {
    app.use(
      localCliRoutes({
        token: deps.localCliToken,
        context: { config: deps.config, db: deps.db, logger: deps.logger },
      }),
    )
  }
  app.use(notFoundHandler())
  app.use(errorHandler(deps.logger))
  return app
}
