// Wires the parts into the running service: database, migrations, HTTP app, and in local mode the
// command forwarding of src/local. Every part registers how to stop it; stop() runs those in reverse.
import { type Clock, systemClock } from './clock.js'
import type { Config } from './config.js'
import { migrateToLatest } from './db/migrate.js'
import { type DatabaseHandle, openDatabase } from './db/open-database.js'
import { createApp } from './http/app.js'
import { listen } from './http/server.js'
import { advertiseLocalService, createLocalCliToken } from './local/local-cli.js'
import type { Logger } from './logger.js'
import { createMetrics } from './metrics/metrics.js'

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
  const stops: { name: string; stop: () => Promise<void> | void }[] = []
  const stopAll = async () => {
    for (const { name, stop } of stops.reverse()) {
      try {
        await stop()
      } catch (error) {
        logger.error({ err: error, part: name }, 'stop failed')
      }
    }
  }

  try {
    const database = openDatabase({
      databaseUrl: config.databaseUrl,
      dataDir: config.dataDir,
      poolSize: config.databasePoolSize,
      logger,
    })
    stops.push({ name: 'database', stop: () => database.close() })
    const { applied } = await migrateToLatest(database.db)
    logger.info({ applied, database: database.kind }, 'migrations applied')

    const metrics = config.metrics.enabled ? createMetrics({ poolStats: database.poolStats }) : undefined
    // embedded PGlite belongs to this process: operator commands are forwarded here (src/local)
    const ownsDataDir = database.kind === 'pglite' && !config.dataDir.startsWith('memory://')
    const localCliToken = ownsDataDir ? createLocalCliToken() : undefined
    const app = createApp({ config, db: database.db, logger, clock, metrics, localCliToken })
    const server = await listen(app, { port: config.port, host: config.host })
    stops.push({ name: 'http server', stop: () => server.stop(config.shutdownTimeoutMs) })
    if (localCliToken) {
      stops.push({
        name: 'local command file',
        stop: advertiseLocalService(config.dataDir, server.url, localCliToken),
      })
    }
    logger.info(
      { url: server.url, database: database.kind, webhookPath: config.webhook.path },
      'service listening',
    )

    return { url: server.url, database, stop: stopAll }
  } catch (error) {
    await stopAll()
    throw error
  }
}
