// `npm start` in local mode, stopped and started again over the same DATA_DIR: the in-process sandbox
// still knows the trades the orders point at, and its references carry on.
import { once } from 'node:events'
import { statSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { freePort, runCli, spawnCli, waitForLogLine, stopChild } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

describe('local mode across a restart', () => {
  const dataDir = migratedDataDir('local-restart-')
  const env: Record<string, string> = { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false' }
  let service: ReturnType<typeof spawnCli> | undefined

  async function start() {
    service = spawnCli(['serve'], env)
    await waitForLogLine(service, 'sandbox platform listening')
    service.stdout!.resume()
  }
  async function stop() {
    const running = service!
    service = undefined
    running.kill('SIGTERM')
    const [code] = await once(running, 'exit')
    expect(code).toBe(0)
  }
  afterAll(async () => {
    if (service) await stopChild(service)
  })

  const open = (reference: string) =>
    runCli(
      ['trades', 'open', reference, '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's-1', '--json'],
      env,
    )

  it('still finds the trades made before, and gives the next trade the next reference', async () => {
    env.SANDBOX_PORT = String(await freePort())
    await start()
    const opened = await open('order-1')
    expect(opened.stderr).toBe('')
    const { trade } = JSON.parse(opened.stdout) as { trade: { trade_id: string; reference: string } }
    expect(trade.reference).toBe('TRD-000001')
    expect((await runCli(['trades', 'fund', 'order-1'], env)).code).toBe(0)
    await stop()

    expect(statSync(path.join(dataDir, 'sandbox-state.json')).mode & 0o777).toBe(0o600)

    await start()
    const fetched = await runCli(['trades', 'get', 'order-1', '--json'], env)
    expect(fetched.stderr).toBe('')
    expect(fetched.code).toBe(0)
    const after = JSON.parse(fetched.stdout) as { trade: { trade_id: string; reference: string; status: string } }
    expect(after.trade).toMatchObject({ trade_id: trade.trade_id, reference: 'TRD-000001', status: 'funded' })
    // the platform's trade moves on from where it was
    expect((await runCli(['trades', 'deliver', 'order-1'], env)).stdout).toContain('is delivered')

    const next = JSON.parse((await open('order-2')).stdout) as { trade: { reference: string } }
    expect(next.trade.reference).toBe('TRD-000002')
  })

  // The start stops at a sandbox state it cannot read, closing the database it had begun to open: that close
  // waited for a thread nothing kept the process alive for, and most such starts ended 13 with no message
  it('refuses to start on a damaged sandbox state file, saying which file and what to do, exit 1', async () => {
    const damaged = migratedDataDir('local-damaged-state-')
    writeFileSync(path.join(damaged, 'sandbox-state.json'), '{')
    for (let run = 0; run < 2; run++) {
      const { code, stderr } = await runCli(['serve'], { ...env, DATA_DIR: damaged, SANDBOX_PORT: String(await freePort()) })
      expect({ code, stderr }).toEqual({
        code: 1,
        stderr: `The sandbox state file ${path.join(damaged, 'sandbox-state.json')} is not JSON; move it away to start the sandbox empty (its trades are then forgotten) [sandbox_state_invalid]\n`,
      })
    }
  })
})
