// The compiled CLI when the service advertised in DATA_DIR/serve.json cannot run its command: a service that
// does not answer is a failure (exit 1), not a bad argument; a service that refuses has its answer printed on
// one line, visible, ending in our code. The advertised service is this test process (alive, so the file
// stands) with its operator listener played by a server the test owns, or by a port nobody listens on.
import { mkdtempSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { ServiceFile } from '../src/local/running-service.js'
import { freePort, runCli } from './helpers/cli-process.js'

function advertise(dataDir: string, adminUrl: string): void {
  const service: ServiceFile = {
    pid: process.pid,
    url: adminUrl,
    adminUrl,
    token: 'not-a-real-token',
    webhookUrl: `${adminUrl}/webhooks/partner`,
    mode: 'local',
    database: { kind: 'pglite', location: dataDir },
  }
  writeFileSync(path.join(dataDir, 'serve.json'), `${JSON.stringify(service)}\n`, { mode: 0o600 })
}

describe('the CLI when the running service cannot run its command', () => {
  let refusing: http.Server
  let refusingUrl: string

  beforeAll(async () => {
    refusing = http.createServer((_req, res) => {
      res.writeHead(500, { 'content-type': 'text/plain' })
      res.end(`boom\u001b[31m\nforged: line ${'x'.repeat(2_000)}`)
    })
    await new Promise<void>((resolve) => refusing.listen(0, '127.0.0.1', resolve))
    refusingUrl = `http://127.0.0.1:${(refusing.address() as AddressInfo).port}`
  })
  afterAll(() => new Promise((resolve) => refusing.close(resolve)))

  it('exits 1 with [service_unreachable] when the advertised service does not answer', async () => {
    const dataDir = mkdtempSync(path.join(tmpdir(), 'cli-unreachable-'))
    advertise(dataDir, `http://127.0.0.1:${await freePort()}`)
    const result = await runCli(['orders', 'list'], { DATA_DIR: dataDir })
    expect(result.code).toBe(1)
    expect(result.stderr).toContain(`(pid ${process.pid}) does not answer`)
    expect(result.stderr.trim()).toMatch(/\[service_unreachable\]$/)
    expect(result.stdout).toBe('')
  })

  it('prints a refusal on one line, its controls visible and its length cut, ending in [service_refused], exit 1', async () => {
    const dataDir = mkdtempSync(path.join(tmpdir(), 'cli-refused-'))
    advertise(dataDir, refusingUrl)
    const result = await runCli(['orders', 'list'], { DATA_DIR: dataDir })
    expect(result.code).toBe(1)
    const lines = result.stderr.trim().split('\n')
    expect(lines).toHaveLength(1)
    expect(lines[0]).toMatch(/^The running service refused the command \(500\): boom\\u001b\[31m\\u000aforged: line x+… \(2,023 characters\) \[service_refused\]$/)
    expect(result.stderr).not.toContain('\u001b')
  })
})
