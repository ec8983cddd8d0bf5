// A PARTNER_API_KEY_ID that no header can carry (found from outside: `pk_€x` passed the configuration, then every
// call failed before sending and read as of unknown outcome): the compiled CLI refuses it at start, naming the
// variable and never its value, exit 2, and opens nothing.
import { describe, expect, it } from 'vitest'
import { remoteServeEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

describe('a PARTNER_API_KEY_ID a header cannot carry, the compiled CLI', () => {
  it('is refused at start, [config_invalid], its name given and its value not', async () => {
    const dataDir = migratedDataDir('key-id-')
    for (const [name, value] of [
      ['PARTNER_API_KEY_ID', 'pk_€x'],
      ['PARTNER_API_KEY_ID', 'pk_with space'],
      ['PARTNER_SANDBOX_API_KEY_ID', 'pk_ключ'],
    ] as const) {
      const env = { ...remoteServeEnv({ dataDir, platformUrl: 'http://127.0.0.1:9' }), [name]: value }
      const result = await runCli(['trades', 'open', 'key-id-1', '--title', 'A lamp', '--amount', '1.00', '--currency', 'KES', '--seller', 'usr_1'], env)
      expect(result.code, value).toBe(2)
      expect(result.stderr).toContain('Invalid configuration [config_invalid]')
      expect(result.stderr).toContain(`${name}: must be printable ASCII without spaces: it is sent as the X-Partner-Key-Id header`)
      expect(result.stderr).not.toContain(value)
      expect(result.stdout).toBe('')
    }
    const shown = await runCli(['orders', 'show', 'key-id-1'], remoteServeEnv({ dataDir, platformUrl: 'http://127.0.0.1:9' }))
    expect(shown.stderr).toMatch(/^No order with external reference key-id-1/)
  })
})
