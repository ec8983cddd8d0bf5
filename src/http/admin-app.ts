// The operator Express application, on its own listener (ADMIN_PORT, bound to 127.0.0.1 by default):
// Prometheus metrics and, in local mode, the command endpoint the CLI forwards to. Whoever can reach
// the public webhook URL reaches none of this.
import express, { type Express } from 'express'
import type { Kysely } from 'kysely'
import type { Config } from '../config.js'
import type { Database } from '../db/database.js'
import { localCliRoutes } from '../local/local-cli.js'
import type { Logger } from '../logger.js'
import type { Metrics } from '../metrics/metrics.js'
import { errorHandler, notFoundHandler } from './error-handler.js'
import { metricsRoutes } from './metrics.routes.js'

export interface AdminAppDeps {
  config: Config
  db: Kysely<Database>
  logger: Logger
  /** Prometheus metrics; GET config.metrics.path serves them when given and enabled. */
  metrics?: Metrics | undefined
  /** Local mode on embedded PGlite: run forwarded operator commands (src/local/local-cli.ts). */
  localCliToken?: string | undefined
}

export function createAdminApp(deps: AdminAppDeps): Express {
  const app = express()
  app.disable('x-powered-by')
  app.set('trust proxy', false)
  if (deps.metrics && deps.config.metrics.enabled) {
    app.use(metricsRoutes({ metrics: deps.metrics, path: deps.config.metrics.path }))
  }
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
