// The compiled `serve` in local mode killed with SIGKILL right after its sandbox answered changes: every change it
// answered is in its state (the snapshot and the journal, src/sandbox/sandbox-state.ts), since each journal line is
// flushed before the answer goes out, and a sandbox started over the files has every trade as it was answered.
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { parseConfig } from '../src/config.js'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { createSandbox } from '../src/sandbox/create-sandbox.js'
import { readSandboxState } from '../src/sandbox/sandbox-state.js'
import { freePort, killLeftovers, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'

describe('the compiled serve in local mode, killed with SIGKILL', () => {
  const children: ChildProcess[] = []
  afterAll(() => killLeftovers(children))

  it('keeps every change its sandbox answered before the kill', async () => {
    const dataDir = migratedDataDir('sandbox-kill-')
    // the local key pair, generated into DATA_DIR/local-secrets.json here, as the service then reads it
    const config = parseConfig({ DATA_DIR: dataDir })
    const { keyId, secret } = config.partner
    const webhookSecret = config.webhook.secrets[0]!
    rememberSecret(secret, webhookSecret)
    const env = { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false', SANDBOX_PORT: String(await freePort()) }
    const child = spawnCli(['serve'], env)
    children.push(child)
    const { url } = await waitForLogLine(child, 'sandbox platform listening')
    child.stdout!.resume()
    // a bound on a hang, not a measure of speed: the service is busy with the receiver's share of the webhooks too
    const client = new PartnerApiClient({ baseUrl: String(url), keyId, secret, env: 'sandbox', kind: 'marketplace', timeoutMs: 120_000, clock: systemClock, logger: testLogger([secret]) })

    // one after another, then many at once: each answer is the trade as the sandbox says it now is
    const answered = new Map<string, string>()
    const note = (trade: { trade_id: string; status: string }) => answered.set(trade.trade_id, trade.status)
    const order = (i: number) => ({ title: 'Bike', amount: '120.00', currency: 'EUR', seller_id: 's-1', external_reference: `kill-${i}` })
    const ids: string[] = []
    for (let i = 0; i < 20; i++) {
      const trade = await client.createTrade(order(i))
      note(trade)
      ids.push(trade.trade_id)
    }
    for (const id of ids.slice(0, 15)) note(await client.fundTrade(id))
    for (const trade of await Promise.all(Array.from({ length: 20 }, (_, i) => client.createTrade(order(20 + i))))) note(trade)
    const last = await Promise.all([
      ...ids.slice(0, 10).map((id) => client.deliverTrade(id)),
      ...ids.slice(15).map((id) => client.cancelTrade(id)),
    ])
    for (const trade of last) note(trade)
    child.kill('SIGKILL')
    const [, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null]
    expect(signal).toBe('SIGKILL')

    const stateFile = path.join(dataDir, 'sandbox-state.json')
    const saved = readSandboxState(stateFile)!
    expect(saved.sequence).toBe(40)
    expect(new Map(saved.trades.map((trade) => [trade.trade_id, trade.status]))).toEqual(answered)
    expect([...answered.values()].toSorted()).toEqual(
      [...Array(10).fill('delivered'), ...Array(5).fill('funded'), ...Array(5).fill('cancelled'), ...Array(20).fill('created')].toSorted(),
    )
    // and a sandbox started over the files has them
    const restarted = createSandbox({ keyId, apiSecret: secret, webhookSecret, stateFile, logger: testLogger() })
    expect(new Map(restarted.trades().map((trade) => [trade.trade_id, trade.status]))).toEqual(answered)
    await restarted.close()
  })
})
