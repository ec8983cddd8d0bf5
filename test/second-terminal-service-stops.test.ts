// A trade command forwarded to the running service, which is stopped while the command's call is at the platform:
// the service answers what it could not finish 503 ("retry"), and the second terminal printed that as a refusal to
// retry. The platform had done the fund, and the fund run again as told was sent twice. Now the answer says the
// command had begun, and the second terminal says its outcome is unknown.
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { remoteServeEnv, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_KEY_ID, TEST_API_SECRET } from './helpers/test-config.js'

// the platform: a create is answered at once; a fund is held, unanswered, until the test ends
const held: ServerResponse[] = []
const funds: string[] = []
const platform = createServer((req, res) => {
  req.resume()
  req.on('end', () => {
    if (req.url?.endsWith('/fund/')) {
      funds.push(req.url)
      held.push(res)
      return
    }
    res.writeHead(201, { 'content-type': 'application/json' })
    res.end(JSON.stringify(tradeRecord({ trade_id: 'tr_stopped_1', external_reference: 'stopped-1', status: 'created' })))
  })
})
let platformUrl: string

beforeAll(async () => {
  platform.listen(0, '127.0.0.1')
  await once(platform, 'listening')
  platformUrl = `http://127.0.0.1:${(platform.address() as AddressInfo).port}`
})
afterAll(async () => {
  for (const res of held) res.destroy()
  platform.closeAllConnections()
  await new Promise((resolve) => platform.close(resolve))
})

it('says a forwarded `trades fund` cut short by the service stopping may or may not have been done, never to retry it', async () => {
  const dataDir = migratedDataDir('service-stops-')
  const service = spawnCli(
    ['serve'],
    { ...remoteServeEnv({ dataDir, platformUrl }), POLL_ENABLED: 'false', PARTNER_API_TIMEOUT_MS: '120000', SHUTDOWN_TIMEOUT_MS: '2000' },
  )
  try {
    await waitForLogLine(service, 'service listening')
    // what a second terminal compares its platform settings with (never a secret)
    const advertised = JSON.parse(readFileSync(path.join(dataDir, 'serve.json'), 'utf8')) as Record<string, unknown>
    expect(advertised.platform).toEqual({ env: 'sandbox', baseUrl: platformUrl, keyId: TEST_API_KEY_ID })
    expect(JSON.stringify(advertised)).not.toContain(TEST_API_SECRET)
    const secondTerminal = { DATA_DIR: dataDir }
    const opened = await runCli(['trades', 'open', 'stopped-1', '--title', 'Lamp', '--amount', '5.00', '--currency', 'EUR', '--seller', 's_1'], secondTerminal)
    expect([opened.code, opened.stderr]).toEqual([0, ''])

    const fund = runCli(['trades', 'fund', 'stopped-1'], secondTerminal)
    await eventually(() => funds.length === 1, 'the fund is at the platform', 60_000)
    service.kill('SIGTERM')
    const result = await fund

    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toContain('had begun to run `trades fund` and answered 503, not its result: it may or may not have taken effect')
    expect(result.stderr.trim().endsWith('[outcome_unknown]')).toBe(true)
    expect(result.stderr).not.toContain('[service_refused]')
    expect(result.stderr.trim().split('\n')).toHaveLength(1)
    expect(funds).toHaveLength(1)
  } finally {
    await stopChild(service)
  }
}, 300_000)
