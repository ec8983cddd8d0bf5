// What a newcomer does after cloning: start the service, then the commands the banner prints, with the built CLI
// (as the image and the bin entry run it: its banner names the compiled CLI by its whole path, as the image has no
// tsx for `npm run cli --`).
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type CliResult, childEnv, freePort, spawnCli, waitForLogLine, stopChild } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')

describe('a newcomer’s first minutes, with the built CLI', () => {
  // a space and a quote: the banner's commands quote it for the shell
  const dataDir = mkdtempSync(path.join(tmpdir(), "newcomer's data dir-"))
  const env: Record<string, string> = { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0' }
  let service: ReturnType<typeof spawnCli>
  let banner = ''
  let url = ''
  let adminUrl = ''

  beforeAll(async () => {
    // dist/ as `npm run build` makes it (helpers/build-dist.ts): the test runs the CLI as the Docker image and the bin entry do
    expect(existsSync(path.join(root, 'dist/src/cli.js'))).toBe(true)
    // the package's bin entry is that file
    const bin = (JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { bin: Record<string, string> }).bin
    expect(bin['partner-escrow']).toBe('dist/src/cli.js')
    env.SANDBOX_PORT = String(await freePort())
    service = spawnCli(['serve'], env)
    service.stdout!.on('data', (chunk) => {
      banner += chunk
    })
    const listening = await waitForLogLine(service, 'service listening')
    url = String(listening.url)
    adminUrl = String(listening.adminUrl)
    while (!banner.includes('lost and repeated webhooks')) await new Promise((resolve) => setTimeout(resolve, 20))
  }, 300_000)

  afterAll(async () => {
    await stopChild(service)
    for (const directory of [dataDir, otherTerminal]) rmSync(directory, { recursive: true, force: true })
  })

  it('says it runs in local sandbox mode and where it listens', () => {
    expect(banner).toContain('LOCAL SANDBOX MODE')
    expect(banner).toContain(`receiver  ${url}/webhooks/partner`)
    expect(banner).toContain(`sandbox   http://127.0.0.1:${env.SANDBOX_PORT}/api/partner/v1/`)
    expect(banner).toContain(`metrics   ${adminUrl}/metrics`)
  })

  it('runs every command the banner prints, as printed, in a shell of another terminal', async () => {
    const commands = banner
      .split('\n')
      .map((line) => line.trim())
      .filter((line) => line.includes(`${cliPath} `) && !line.startsWith('Or watch'))
    expect(commands).toHaveLength(3)
    // the service's DATA_DIR is not ./data: the commands carry it, quoted for the shell
    for (const command of commands) expect(command).toMatch(/^DATA_DIR='[^']*newcomer'\\''s data dir-\w+' node \S+ /)
    expect(banner).toContain(`lost and repeated webhooks: node ${cliPath} demo`)
    const outputs: string[] = []
    for (const command of commands) {
      const result = await runInAnotherTerminal(command)
      expect(result.code, `${command}\n${result.stderr}`).toBe(0)
      outputs.push(result.stdout)
    }
    // they reached the running service, not a database of their own in the other terminal's ./data
    expect(existsSync(path.join(otherTerminal, 'data'))).toBe(false)
    expect(outputs[0]).toContain('created order order-1')
    expect(outputs[1]).toMatch(/trd_\w+/)
    // the trade's status came back by the API's answer; its webhook follows
    expect(outputs[2]).toMatch(/status\s+created/)
    expect(outputs[2]).toMatch(/trade\s+trd_\w+ TRD-\d+/)
  })

  it('serves /readyz on the public port and Prometheus metrics on the operator port only', async () => {
    expect((await fetch(`${url}/readyz`)).status).toBe(200)
    expect((await fetch(`${url}/metrics`)).status).toBe(404)
    const metrics = await (await fetch(`${adminUrl}/metrics`)).text()
    expect(metrics).toContain('# TYPE webhook_deliveries_total counter')
    expect(metrics).toContain('poller_orders_due')
  })

  it('prints the operator console and its token, which opens the console on the operator port only', async () => {
    // stdout is a pipe here, as in `npm start > service.log`: the banner names the file, not the token
    const line = new RegExp(`console   ${adminUrl}/console/   \\(log in with the admin token: adminToken in (.+)\\)`).exec(banner)
    expect(line, banner).not.toBeNull()
    expect(line![1]).toBe(path.join(dataDir, 'local-secrets.json'))
    const token = (JSON.parse(readFileSync(line![1]!, 'utf8')) as { adminToken: string }).adminToken
    expect(token).toMatch(/^[0-9a-f]{64}$/)
    expect(banner).not.toContain(token)
    expect((await fetch(`${adminUrl}/console/`)).status).toBe(401)
    const overview = await fetch(`${adminUrl}/console/`, { headers: { Authorization: `Bearer ${token}` } })
    expect(overview.status).toBe(200)
    expect(await overview.text()).toContain('Needs a human')
    expect((await fetch(`${url}/console/`, { headers: { Authorization: `Bearer ${token}` } })).status).toBe(404)
  })
})

// Another terminal: a POSIX shell with none of the service's environment, in a directory of its own, so a command
// without the service's DATA_DIR would open its own database there.
const otherTerminal = mkdtempSync(path.join(tmpdir(), 'newcomer-terminal-'))
const cliPath = path.join(root, 'dist/src/cli.js')

function runInAnotherTerminal(command: string): Promise<CliResult> {
  const child = spawn('/bin/sh', ['-c', command], {
    cwd: otherTerminal,
    // the node this test runs on first
    env: { ...childEnv({}), PATH: `${path.dirname(process.execPath)}:${process.env.PATH ?? ''}` },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => {
    stdout += chunk
  })
  child.stderr.on('data', (chunk) => {
    stderr += chunk
  })
  return once(child, 'exit').then(([code]) => ({ code: code as number | null, stdout, stderr }))
}
