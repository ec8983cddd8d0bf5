// The Express application, built from its dependencies; it never listens (see server.ts).
import express, { type Express } from 'express'
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Config } from '../config.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import { errorHandler, notFoundHandler } from './error-handler.js'
import { healthRoutes } from './health.routes.js'

export interface AppDeps {
  config: Config
  db: Kysely<Database>
  logger: Logger
  clock: Clock
}

export function createApp(deps: AppDeps): Express {
  const app = express()
  app.disable('x-powered-by')
  app.set('trust proxy', false)
  app.use(healthRoutes(deps))
  app.use(notFoundHandler())
  app.use(errorHandler(deps.logger))
  return app
}
