// A platform whose connection is never set up within the timeout (its SYN unanswered: a listener whose backlog is
// full, as behind a firewall that drops packets), with the compiled CLI: not one byte of the request was written, so
// the call was not sent ([not_sent]) and the order is left as it was, not marked unknown as a timeout after sending is.
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { remoteServeEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

describe('a connection never set up within PARTNER_API_TIMEOUT_MS, the compiled CLI', () => {
  let listener: ChildProcess
  let env: Record<string, string>
  beforeAll(async () => {
    listener = spawn('python3', [path.join(import.meta.dirname, 'helpers/full-backlog-listener.py')], { stdio: ['pipe', 'pipe', 'inherit'] })
    const [chunk] = (await once(listener.stdout!, 'data')) as [Buffer]
    const port = Number(chunk.toString().trim())
    env = { ...remoteServeEnv({ dataDir: migratedDataDir('connect-never-up-'), platformUrl: `http://127.0.0.1:${port}` }), PARTNER_API_TIMEOUT_MS: '1500' }
  })
  afterAll(() => {
    listener.stdin!.end()
    listener.kill('SIGKILL')
  })

  it('`trades open` says nothing was sent, [not_sent], and the order has no create pending or unknown', async () => {
    const open = ['trades', 'open', 'never-connected', '--title', 'A lamp', '--amount', '10.00', '--currency', 'KES', '--seller', 'usr_1']
    const result = await runCli(open, env)
    expect(result.code).toBe(1)
    expect(result.stderr).toMatch(/no connection within 1,500 ms, so the request was not written/)
    expect(result.stderr).toMatch(/nothing was sent .*\[not_sent\]\n$/)
    expect(result.stderr).not.toContain('outcome_unknown')
    const shown = await runCli(['orders', 'show', 'never-connected', '--json'], env)
    expect(JSON.parse(shown.stdout)).toMatchObject({ tradeId: null, tradeCreateState: 'none' })
    // nothing stands in the way of the same command once the platform can be reached
    const again = await runCli(open, env)
    expect(again.stderr).toContain('[not_sent]')
    expect(again.stderr).not.toContain('trade_create_unknown')
  })
})
