// `serve`: load config, start the service, stop it cleanly on SIGTERM/SIGINT.
import { type Config, ConfigError, configSecrets, loadConfig } from './config.js'
import { loggableError } from './db/database-errors.js'
import { createLogger } from './logger.js'
import { startService } from './service.js'

export async function main(): Promise<void> {
  let config: Config
  try {
    config = loadConfig()
  } catch (error) {
    if (error instanceof ConfigError) {
      console.error(error.message)
      process.exit(2)
    }
    throw error
  }
  const logger = createLogger({
    level: config.logLevel,
    pretty: config.logPretty,
    secrets: configSecrets(config),
  })
  if (config.localSecretsFile) {
    logger.info({ file: config.localSecretsFile }, 'local mode: generated secrets are kept in this file')
  }
  const service = await startService({ config, logger })

  let stopping = false
  const stop = async (signal: string) => {
    if (stopping) return
    stopping = true
    logger.info({ signal }, 'shutting down')
    try {
      await service.stop()
      logger.info('stopped')
      process.exit(0)
    } catch (error) {
      logger.error({ err: error }, 'shutdown failed')
      process.exit(1)
    }
  }
  process.once('SIGTERM', () => void stop('SIGTERM'))
  process.once('SIGINT', () => void stop('SIGINT'))

  // an unreachable database is waited for (prepare-database.ts); what waiting cannot fix ends the process
  try {
    await service.ready
  } catch (error) {
    if (stopping) return
    stopping = true
    logger.error({ err: loggableError(error) }, 'start-up failed')
    await service.stop()
    process.exit(1)
  }
  if (service.sandboxUrl)
    process.stdout.write(localModeBanner(config, service.url, service.sandboxUrl, service.adminUrl))
}

/** What a newcomer sees after `npm start`: where things are and what to type next (README quick start). */
export function localModeBanner(config: Config, url: string, sandboxUrl: string, adminUrl: string): string {
  const seller = config.partner.kind === 'marketplace' ? ' --seller seller-1' : ''
  const database = config.databaseUrl ? 'Postgres' : `embedded PGlite in ${config.dataDir}`
  return [
    '',
    'partner-escrow is running in LOCAL SANDBOX MODE: no platform is configured, a simulated one runs here.',
    `  receiver  ${url}${config.webhook.path}   (${database})`,
    `  sandbox   ${sandboxUrl}/api/partner/v1/   (the platform: signed API and webhooks)`,
    ...(config.metrics.enabled ? [`  metrics   ${adminUrl}${config.metrics.path}   (operator listener)`] : []),
    '',
    'Try next, in another terminal:',
    '  npm run cli -- orders create --external-reference order-1',
    `  npm run cli -- trades open order-1 --title "First trade" --amount 25.00 --currency EUR${seller}`,
    '  npm run cli -- orders show order-1',
    'Or watch a whole run with lost and repeated webhooks: npm run demo',
    '',
  ].join('\n')
}
