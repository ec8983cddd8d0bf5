import { type Config, ConfigError, parseConfig } from '../../src/config.js'
import { rememberSecret } from './log-sink.js'

export const TEST_WEBHOOK_SECRET = 'whsec_test_0123456789abcdef0123456789'
export const TEST_API_KEY_ID = 'pk_test_key'
export const TEST_API_SECRET = 'apisec_test_0123456789abcdef0123456789'

rememberSecret(TEST_WEBHOOK_SECRET, TEST_API_SECRET)

/** A Config as the service would parse it from this environment (remote mode, test secrets). */
export function testConfig(env: Record<string, string> = {}): Config {
  return parseConfig({
    PARTNER_API_BASE_URL: 'http://127.0.0.1:1',
    PARTNER_API_KEY_ID: TEST_API_KEY_ID,
    PARTNER_API_SECRET: TEST_API_SECRET,
    WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
    DATA_DIR: 'memory://',
    // the operator listener on a free port, as PORT: '0' does for the public one
    ADMIN_PORT: '0',
    LOG_LEVEL: 'debug',
    ...env,
  })
}

/** The problems a configuration is refused with; throws when it is taken. */
export function problemsOf(env: Record<string, string>): string[] {
  try {
    parseConfig(env)
  } catch (error) {
    if (error instanceof ConfigError) return [...error.problems]
    throw error
  }
  throw new Error('expected the configuration to be refused')
}
