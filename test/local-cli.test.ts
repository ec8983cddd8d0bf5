import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { DatabaseInUseError, openDatabase } from '../src/db/open-database.js'
import { childEnv, freePort, runCli, spawnCli, waitForLogLine, stopChild } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const cliEntry = path.resolve(import.meta.dirname, '../dist/src/cli.js')

describe('operator commands while `npm start` owns the embedded database', () => {
  const dataDir = migratedDataDir('local-cli-')
  const env = { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false', SANDBOX_PORT: '0' }
  let service: ReturnType<typeof spawnCli>
  let url: string
  let adminUrl: string

  beforeAll(async () => {
    env.SANDBOX_PORT = String(await freePort())
    service = spawnCli(['serve'], env)
    const listening = await waitForLogLine(service, 'service listening')
    url = String(listening.url)
    adminUrl = String(listening.adminUrl)
  })
  afterAll(async () => {
    await stopChild(service)
  })

  it('refuses a second process opening the same embedded database, naming the owner', () => {
    expect(() => openDatabase({ dataDir })).toThrow(DatabaseInUseError)
    expect(() => openDatabase({ dataDir })).toThrow(`in use by process ${service.pid}`)
    expect(() => openDatabase({ dataDir })).toThrow(/ \[data_dir_in_use\]$/)
  })

  it('runs a database command inside the service and prints its output', async () => {
    const result = await runCli(['migrate', '--json'], env)
    expect(result.stderr).toBe('')
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toEqual({ applied: [] })
  })

  it('runs `reactions` and `prune` inside the service too, rather than refusing them as the database’s owner', async () => {
    const jobs = await runCli(['reactions', 'list', '--json'], env)
    expect(jobs.stderr).toBe('')
    expect(jobs.code).toBe(0)
    expect(JSON.parse(jobs.stdout)).toEqual([])
    const pass = await runCli(['prune', '--dry-run', '--json'], env)
    expect(pass.stderr).toBe('')
    expect(pass.code).toBe(0)
    expect(JSON.parse(pass.stdout)).toMatchObject({ ran: true, dryRun: true })
  })

  it('serves the command endpoint on the operator listener only, advertised in serve.json', async () => {
    const advertised = JSON.parse(readFileSync(path.join(dataDir, 'serve.json'), 'utf8'))
    expect(advertised).toMatchObject({ pid: service.pid, url, adminUrl })
    const { token } = advertised
    const call = (base: string) =>
      fetch(`${base}/_local/cli`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
        body: JSON.stringify({ args: ['migrate', '--json'] }),
      })
    expect((await call(url)).status).toBe(404)
    const response = await call(adminUrl)
    expect(response.status).toBe(200)
    expect(((await response.json()) as { code: number }).code).toBe(0)
  })

  it('refuses a forwarded command without the token of serve.json', async () => {
    const response = await fetch(`${adminUrl}/_local/cli`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer not-the-token' },
      body: JSON.stringify({ args: ['migrate'] }),
    })
    expect(response.status).toBe(401)
    expect(((await response.json()) as { error: { code: string } }).error.code).toBe('invalid_command_token')
    // the scheme in any case (RFC 9110); the token without it, or under another scheme, is refused
    const { token } = JSON.parse(readFileSync(path.join(dataDir, 'serve.json'), 'utf8'))
    const statusWith = async (authorization: string) =>
      (await fetch(`${adminUrl}/_local/cli`, { method: 'POST', headers: { 'content-type': 'application/json', authorization }, body: JSON.stringify({ args: ['migrate', '--json'] }) })).status
    expect(await statusWith(`bearer ${token}`)).toBe(200)
    for (const authorization of [token, `Basic ${token}`]) expect(await statusWith(authorization)).toBe(401)
  })

  it('refuses to run a command that is not an operator command, even with the token', async () => {
    const { token } = JSON.parse(readFileSync(path.join(dataDir, 'serve.json'), 'utf8'))
    const response = await fetch(`${adminUrl}/_local/cli`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify({ args: ['serve'] }),
    })
    expect(response.status).toBe(400)
    expect(((await response.json()) as { error: { code: string } }).error.code).toBe('invalid_payload')
  })

  it('removes serve.json on shutdown, after which commands open the database themselves', async () => {
    const other = migratedDataDir('local-cli-stop-')
    const child = spawnCli(['serve'], { ...env, DATA_DIR: other, SANDBOX_PORT: String(await freePort()) })
    await waitForLogLine(child, 'service listening')
    expect(existsSync(path.join(other, 'serve.json'))).toBe(true)
    child.kill('SIGTERM')
    await once(child, 'exit')
    expect(existsSync(path.join(other, 'serve.json'))).toBe(false)
    const result = await runCli(['migrate', '--json'], { ...env, DATA_DIR: other })
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toEqual({ applied: [] })
    // a service start and a command, each opening PGlite: slow on a busy machine
  })

  it('ignores a serve.json left by a process that no longer runs', async () => {
    const other = mkdtempSync(path.join(tmpdir(), 'local-cli-stale-'))
    writeFileSync(
      path.join(other, 'serve.json'),
      JSON.stringify({ pid: 2 ** 22 + 7, url: 'http://127.0.0.1:1', token: 'x' }),
    )
    const result = await runCli(['migrate', '--json'], { ...env, DATA_DIR: other })
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout).applied.length).toBeGreaterThan(0)
  })

  it('takes over a serve.json and a database lock left by a dead process that had its own pid (a container’s pid 1)', async () => {
    const other = migratedDataDir('local-cli-same-pid-')
    // the shell writes its pid as the dead owner's, then becomes the CLI: the same pid, as after a restart
    const leaveAsDeadOwner = (command: string) =>
      'mkdir -p "$DATA_DIR/pglite" && printf %s $$ > "$DATA_DIR/pglite/partner-escrow.lock" && ' +
      `printf '{"pid":%s,"adminUrl":"http://127.0.0.1:9","token":"x","database":{"kind":"pglite","location":"%s"}}' $$ "$DATA_DIR" > "$DATA_DIR/serve.json" && ` +
      `exec "${process.execPath}" "${cliEntry}" ${command}`
    const run = async (command: string) => {
      const childEnvironment = childEnv({ ...env, DATA_DIR: other, SANDBOX_PORT: String(await freePort()) })
      const child = spawn('/bin/sh', ['-c', leaveAsDeadOwner(command)], { env: childEnvironment })
      let stderr = ''
      child.stderr.on('data', (chunk) => (stderr += chunk))
      return { child, stderr: () => stderr }
    }
    const created = await run('orders create --external-reference same-pid-1')
    const [code] = (await once(created.child, 'exit')) as [number | null]
    expect(created.stderr()).not.toContain('service_unreachable')
    expect(created.stderr()).not.toContain('in use by process')
    expect(code).toBe(0)

    const served = await run('serve')
    await waitForLogLine(served.child, 'service listening')
    served.child.kill('SIGTERM')
    await once(served.child, 'exit')
    expect(served.stderr()).not.toContain('in use by process')
  })

  it('records in serve.json where the service listens and which database it uses, without credentials', () => {
    const service = JSON.parse(readFileSync(path.join(dataDir, 'serve.json'), 'utf8'))
    expect(service).toMatchObject({
      pid: service.pid,
      url,
      adminUrl,
      webhookUrl: `${url}/webhooks/partner`,
      sandboxUrl: `http://127.0.0.1:${env.SANDBOX_PORT}`,
      database: { kind: 'pglite', location: dataDir },
    })
  })

  it('refuses a command whose DATABASE_URL names another database than the running service’s, writing nothing', async () => {
    const result = await runCli(['orders', 'create', '--external-reference', 'elsewhere-1'], {
      ...env,
      DATABASE_URL: 'postgres://someone:hunter2-not-shown@db.example:5433/orders',
    })
    expect(result.code).toBe(2)
    expect(result.stderr).toContain(`uses embedded PGlite in ${dataDir}`)
    expect(result.stderr).toContain('Postgres db.example:5433/orders')
    expect(result.stderr).toContain('[wrong_database]')
    expect(result.stderr).not.toContain('hunter2')
    expect(result.stderr.trim().split('\n')).toHaveLength(1)
    const shown = await runCli(['orders', 'show', 'elsewhere-1'], env)
    expect(shown.code).toBe(1)
  })

  it('prints a reference with a line feed in `orders create`’s one line as \\u000a, though the service keeps a result’s line feeds', async () => {
    // what a second terminal typed (a reference from a webhook, pasted): the line feed made a second output line
    const reference = 'evil\u001b]0;pwn\u0007\u001b[2J\r\nFAKE  released\u202e'
    const created = await runCli(['orders', 'create', '--external-reference', reference], env)
    expect({ code: created.code, stderr: created.stderr }).toEqual({ code: 0, stderr: '' })
    const { id } = JSON.parse((await runCli(['orders', 'show', reference, '--json'], env)).stdout) as { id: number }
    expect(created.stdout).toBe(`created order evil\\u001b]0;pwn\\u0007\\u001b[2J\\u000d\\u000aFAKE  released\\u202e (id ${id})\n`)
  })

  it('sends `webhook send` without --url to the running service’s receiver', async () => {
    const body = path.join(dataDir, 'body.json')
    writeFileSync(body, '{"trade_id":"trd_x","reference":"R-X","status":"funded","external_reference":"nobody"}')
    // no PORT here: the receiver's port comes from serve.json
    const result = await runCli(['webhook', 'send', '--file', body, '--json'], { DATA_DIR: dataDir })
    expect(result.stderr).toBe('')
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toMatchObject({ status: 200, body: { received: true } })
  })

  // the commands a second terminal runs in the service called the platform at the configured port, 0 itself
  it('calls the sandbox at the port it was given for SANDBOX_PORT=0, for a command run inside the service', async () => {
    const other = { ...env, DATA_DIR: migratedDataDir('local-cli-any-port-'), SANDBOX_PORT: '0' }
    const child = spawnCli(['serve'], other)
    try {
      await waitForLogLine(child, 'service listening')
      const opened = await runCli(['trades', 'open', 'any-port-1', '--title', 'Lamp', '--amount', '12.00', '--currency', 'EUR', '--seller', 's-1', '--json'], { DATA_DIR: other.DATA_DIR })
      expect(opened.stderr).toBe('')
      expect(opened.code).toBe(0)
      expect(JSON.parse(opened.stdout)).toMatchObject({ trade: { reference: 'TRD-000001' } })
    } finally {
      child.kill('SIGTERM')
      await once(child, 'exit')
    }
  })
})
