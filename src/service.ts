// Wires the parts into the running service: database, migrations, HTTP app. Stopped in reverse order.
import { type Clock, systemClock } from './clock.js'
import type { Config } from './config.js'
import { migrateToLatest } from './db/migrate.js'
import { type DatabaseHandle, openDatabase } from './db/open-database.js'
import { createApp } from './http/app.js'
import { listen, type RunningServer } from './http/server.js'
import type { Logger } from './logger.js'

export interface RunningService {
  readonly url: string
  readonly database: DatabaseHandle
  stop(): Promise<void>
}

export async function startService({
  config,
  logger,
  clock = systemClock,
}: {
  config: Config
  logger: Logger
  clock?: Clock
}): Promise<RunningService> {
  const database = openDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolSize: config.databasePoolSize,
    logger,
  })
  let server: RunningServer | undefined
  try {
    const { applied } = await migrateToLatest(database.db)
    logger.info({ applied, database: database.kind }, 'migrations applied')
    const app = createApp({ config, db: database.db, logger, clock })
    server = await listen(app, { port: config.port, host: config.host })
  } catch (error) {
    await database.close()
    throw error
  }
  const running = server
  logger.info(
    { url: running.url, database: database.kind, webhookPath: config.webhook.path },
    'service listening',
  )
  return {
    url: running.url,
    database,
    stop: async () => {
      await running.stop(config.shutdownTimeoutMs)
      await database.close()
    },
  }
}
