// `serve`: load config, start the service, stop it cleanly on SIGTERM/SIGINT.
import { type Config, ConfigError, configSecrets, loadConfig } from './config.js'
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
}
