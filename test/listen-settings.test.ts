// A listener that cannot open names the variable to change: the compiled `serve` with each of its three ports
// taken by another process, and a host that is no address of this machine. Node's own words were "listen
// EADDRINUSE: address already in use 127.0.0.1:3000", which names neither. A taken port is found before the
// database is opened: a first start used to run PGlite's initdb (and leave its database) before it said so.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs'
import { createServer, type Server } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { describeListenError } from '../src/listen-error.js'
import { childEnv, freePort, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const taken: Server[] = []
const emptyDirs: string[] = []
afterAll(() => {
  for (const server of taken) server.close()
  for (const directory of emptyDirs) rmSync(directory, { recursive: true, force: true })
})

function emptyDataDir(): string {
  const directory = mkdtempSync(path.join(tmpdir(), 'listen-first-'))
  emptyDirs.push(directory)
  return directory
}

function logMessages(stdout: string): unknown[] {
  return stdout
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => (JSON.parse(line) as { msg: unknown }).msg)
}

async function takePort(): Promise<number> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  taken.push(server)
  return (server.address() as { port: number }).port
}


// `serve` on DATA_DIR with every listener on a free port but `setting`'s, which another process holds
async function serveWithPortTaken(setting: string, dataDir: string) {
  const busy = await takePort()
  const env: Record<string, string> = {
    DATA_DIR: dataDir,
    PORT: String(await freePort()),
    ADMIN_PORT: String(await freePort()),
    SANDBOX_PORT: String(await freePort()),
    [setting]: String(busy),
  }
  return { busy, result: await runCli(['serve'], env) }
}
// A user that may not listen on ports under 1024. As root, the compiled CLI runs without the one capability that
// allows it (setpriv drops CAP_NET_BIND_SERVICE; the files stay readable); as any other user, as itself, where the
// machine keeps those ports privileged.
const portStartFile = '/proc/sys/net/ipv4/ip_unprivileged_port_start'
const asRoot = process.getuid?.() === 0
const privilegedPortRefused = asRoot ? existsSync('/usr/bin/setpriv') : existsSync(portStartFile) && Number(readFileSync(portStartFile, 'utf8')) > 80

async function runCliUnprivileged(args: string[], env: Record<string, string>) {
  const cli = [process.execPath, path.resolve('dist/src/cli.js'), ...args]
  const [command, ...commandArgs] = asRoot ? ['/usr/bin/setpriv', '--bounding-set=-net_bind_service', '--inh-caps=-net_bind_service', ...cli] : cli
  const child = spawn(command!, commandArgs, { env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] })
  let stderr = ''
  child.stderr.on('data', (chunk) => {
    stderr += chunk
  })
  child.stdout.resume()
  const [code] = (await once(child, 'exit')) as [number | null]
  return { code, stderr }
}

describe('a listener that cannot open', () => {
  it.skipIf(!privilegedPortRefused)('names PORT, ADMIN_PORT, SANDBOX_PORT or --port when this user may not listen on a port under 1024, and exits 1', async () => {
    for (const setting of ['PORT', 'ADMIN_PORT', 'SANDBOX_PORT']) {
      const env: Record<string, string> = {
        DATA_DIR: emptyDataDir(),
        PORT: String(await freePort()),
        ADMIN_PORT: String(await freePort()),
        SANDBOX_PORT: String(await freePort()),
        [setting]: '80',
      }
      expect(await runCliUnprivileged(['serve'], env), setting).toEqual({
        code: 1,
        stderr: `${setting}=80: this user may not listen on 127.0.0.1:80 (ports under 1024 need privileges); set ${setting} to 1024 or above [port_not_permitted]\n`,
      })
    }
    expect(await runCliUnprivileged(['sandbox', '--port', '80'], { DATA_DIR: emptyDataDir() })).toEqual({
      code: 1,
      stderr: '--port=80: this user may not listen on 127.0.0.1:80 (ports under 1024 need privileges); set --port to 1024 or above [port_not_permitted]\n',
    })
  })

  it('names PORT, ADMIN_PORT or SANDBOX_PORT when another process holds it, and exits 1', async () => {
    for (const setting of ['PORT', 'ADMIN_PORT', 'SANDBOX_PORT']) {
      const { busy, result } = await serveWithPortTaken(setting, migratedDataDir('listen-'))
      expect(result.code, setting).toBe(1)
      expect(result.stderr).toBe(`${setting}=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set ${setting} to a free port [port_in_use]\n`)
    }
  })

  it('fails a first start before it makes the embedded database: no initdb, no database left in DATA_DIR', async () => {
    for (const setting of ['PORT', 'ADMIN_PORT', 'SANDBOX_PORT']) {
      const dataDir = emptyDataDir()
      const { busy, result } = await serveWithPortTaken(setting, dataDir)
      expect(result.code, setting).toBe(1)
      expect(result.stderr).toBe(`${setting}=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set ${setting} to a free port [port_in_use]\n`)
      expect(logMessages(result.stdout), setting).not.toContain('initialising the embedded database (first start only)')
      // the local secrets are made before the ports are known to be free, and the next start keeps using them
      expect(readdirSync(dataDir), setting).toEqual(['local-secrets.json'])
    }
  })

  it('fails a start on Postgres before it connects to the database', async () => {
    // stands in for Postgres: the test only counts who connects
    const connections: unknown[] = []
    const database = createServer((socket) => {
      connections.push(socket.remoteAddress)
      socket.destroy()
    })
    database.listen(0, '127.0.0.1')
    await once(database, 'listening')
    taken.push(database)
    const busy = await takePort()
    const dataDir = emptyDataDir()
    const env = {
      DATA_DIR: dataDir,
      DATABASE_URL: `postgres://escrow@127.0.0.1:${(database.address() as { port: number }).port}/escrow`,
      PORT: String(busy),
      ADMIN_PORT: String(await freePort()),
      SANDBOX_PORT: String(await freePort()),
    }
    const result = await runCli(['serve'], env)
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 1,
      stderr: `PORT=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set PORT to a free port [port_in_use]\n`,
    })
    expect(connections).toEqual([])
    expect(readdirSync(dataDir)).toEqual(['local-secrets.json'])
  })

  it('names --port when `sandbox --port` is held by another process', async () => {
    const busy = await takePort()
    const result = await runCli(['sandbox', '--port', String(busy)], { DATA_DIR: migratedDataDir('listen-') })
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 1,
      stderr: `--port=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set --port to a free port [port_in_use]\n`,
    })
  })

  it('names SANDBOX_PORT when `sandbox` took its port from SANDBOX_PORT and another process holds it', async () => {
    const busy = await takePort()
    const result = await runCli(['sandbox'], { DATA_DIR: migratedDataDir('listen-'), SANDBOX_PORT: String(busy) })
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 1,
      stderr: `SANDBOX_PORT=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set SANDBOX_PORT to a free port [port_in_use]\n`,
    })
  })

  it('says PORT and ADMIN_PORT clash when both name one port on overlapping addresses, where it blamed another process', async () => {
    // HOST=0.0.0.0 covers ADMIN_HOST=127.0.0.1; nothing else listens on the port
    const port = await freePort()
    for (const host of ['127.0.0.1', '0.0.0.0']) {
      const env = { DATA_DIR: migratedDataDir('listen-'), HOST: host, PORT: String(port), ADMIN_PORT: String(port), SANDBOX_PORT: String(await freePort()) }
      const result = await runCli(['serve'], env)
      expect({ code: result.code, stderr: result.stderr }, host).toEqual({
        code: 1,
        stderr: `ADMIN_PORT=${port}: PORT and ADMIN_PORT clash: this service's own listener for PORT already listens on ${host}:${port}; set ADMIN_PORT to another port [port_clash]\n`,
      })
    }
    // the in-process sandbox of local mode likewise
    const env = { DATA_DIR: migratedDataDir('listen-'), PORT: String(port), ADMIN_PORT: String(await freePort()), SANDBOX_PORT: String(port) }
    const result = await runCli(['serve'], env)
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 1,
      stderr: `SANDBOX_PORT=${port}: PORT and SANDBOX_PORT clash: this service's own listener for PORT already listens on 127.0.0.1:${port}; set SANDBOX_PORT to another port [port_clash]\n`,
    })
  })

  it('still names another process when one holds ADMIN_PORT and PORT is the same port on another address', async () => {
    // the same port on addresses apart is no clash: the service's own listener on 127.0.0.2 is not what holds 127.0.0.1
    const busy = await takePort()
    const env = { DATA_DIR: migratedDataDir('listen-'), HOST: '127.0.0.2', PORT: String(busy), ADMIN_PORT: String(busy), SANDBOX_PORT: String(await freePort()) }
    const result = await runCli(['serve'], env)
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 1,
      stderr: `ADMIN_PORT=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set ADMIN_PORT to a free port [port_in_use]\n`,
    })
  })

  it('starts with PORT and ADMIN_PORT one port on addresses apart (HOST=127.0.0.2, ADMIN_HOST=127.0.0.1)', async () => {
    const port = await freePort()
    const env = { DATA_DIR: migratedDataDir('listen-'), HOST: '127.0.0.2', PORT: String(port), ADMIN_PORT: String(port), SANDBOX_PORT: String(await freePort()) }
    const child = spawnCli(['serve'], env)
    try {
      const listening = await waitForLogLine(child, 'service listening')
      expect({ url: listening.url, adminUrl: listening.adminUrl }).toEqual({ url: `http://127.0.0.2:${port}`, adminUrl: `http://127.0.0.1:${port}` })
    } finally {
      await stopChild(child)
    }
  })

  it('refuses a `sandbox --port` or `demo --console-port` that is no port with exit 2, before anything starts', async () => {
    for (const args of [['sandbox', '--port', '99999'], ['demo', '--console', '--console-port', '65536'], ['demo', '--console-port', 'abc']]) {
      const result = await runCli(args, { DATA_DIR: migratedDataDir('listen-') })
      expect({ code: result.code, stdout: result.stdout }, args.join(' ')).toEqual({ code: 2, stdout: '' })
      expect(result.stderr).toContain(`argument '${args.at(-1)}' is invalid. must be a port from 0 to 65535 (0: a free one)`)
    }
  })

  it('refuses a port written other than in decimal digits (0x10 was port 16) with exit 2, naming the variable or option', async () => {
    for (const setting of ['PORT', 'ADMIN_PORT', 'SANDBOX_PORT']) {
      for (const value of ['0x10', '1e3', '+80']) {
        const result = await runCli(['serve'], { DATA_DIR: emptyDataDir(), [setting]: value })
        expect({ code: result.code, stderr: result.stderr }, `${setting}=${value}`).toEqual({
          code: 2,
          stderr: `Invalid configuration [config_invalid]\n  - ${setting}: must be a whole number in decimal digits (0-9)\n`,
        })
      }
    }
    for (const args of [['sandbox', '--port', '0x10'], ['demo', '--console', '--console-port', '0x10'], ['demo', '--console-port', '1e3']]) {
      const result = await runCli(args, { DATA_DIR: migratedDataDir('listen-') })
      expect({ code: result.code, stdout: result.stdout }, args.join(' ')).toEqual({ code: 2, stdout: '' })
      expect(result.stderr).toContain(`argument '${args.at(-1)}' is invalid. must be a port from 0 to 65535 (0: a free one)`)
    }
    // `sandbox` reads SANDBOX_PORT for its --port too
    const fromEnvironment = await runCli(['sandbox'], { DATA_DIR: migratedDataDir('listen-'), SANDBOX_PORT: '0x10' })
    expect({ code: fromEnvironment.code, stdout: fromEnvironment.stdout }).toEqual({ code: 2, stdout: '' })
    expect(fromEnvironment.stderr).toContain("value '0x10' from env 'SANDBOX_PORT' is invalid. must be a port from 0 to 65535 (0: a free one)")
  })

  it('names --console-port when the demo’s console port is held by another process, before the demo runs', async () => {
    const busy = await takePort()
    const result = await runCli(['demo', '--trades', '1', '--console', '--console-port', String(busy)], {})
    expect({ code: result.code, stdout: result.stdout, stderr: result.stderr }).toEqual({
      code: 1,
      stdout: '',
      stderr: `--console-port=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set --console-port to a free port [port_in_use]\n`,
    })
  })

  it('names SANDBOX_HOST or --host, as it was given, when `sandbox`’s host is no address of this machine', async () => {
    const port = String(await freePort())
    const fromEnvironment = await runCli(['sandbox'], { DATA_DIR: migratedDataDir('listen-'), SANDBOX_PORT: port, SANDBOX_HOST: '192.0.2.1' })
    expect({ code: fromEnvironment.code, stderr: fromEnvironment.stderr }).toEqual({
      code: 1,
      stderr: 'SANDBOX_HOST=192.0.2.1: no such address on this machine (EADDRNOTAVAIL); set SANDBOX_HOST to one of its addresses, such as 127.0.0.1 or 0.0.0.0 [no_such_address]\n',
    })
    const fromCommandLine = await runCli(['sandbox', '--port', port, '--host', '192.0.2.1'], { DATA_DIR: migratedDataDir('listen-') })
    expect({ code: fromCommandLine.code, stderr: fromCommandLine.stderr }).toEqual({
      code: 1,
      stderr: '--host=192.0.2.1: no such address on this machine (EADDRNOTAVAIL); set --host to one of its addresses, such as 127.0.0.1 or 0.0.0.0 [no_such_address]\n',
    })
  })

  it('names HOST when it is no address of this machine', async () => {
    // 192.0.2.0/24 is reserved for documentation: no machine has it
    const env = { DATA_DIR: migratedDataDir('listen-'), HOST: '192.0.2.1', PORT: String(await freePort()) }
    const result = await runCli(['serve'], env)
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(
      'HOST=192.0.2.1: no such address on this machine (EADDRNOTAVAIL); set HOST to one of its addresses, such as 127.0.0.1 or 0.0.0.0 [no_such_address]\n',
    )
  })

  it('names HOST, ADMIN_HOST or --host when it is a name no lookup finds, not the database', async () => {
    // a lookup's ENOTFOUND (or EAI_AGAIN offline) was read as the database's: "The database cannot be reached"
    for (const setting of ['HOST', 'ADMIN_HOST']) {
      const env = { DATA_DIR: migratedDataDir('listen-'), PORT: String(await freePort()), ADMIN_PORT: String(await freePort()), [setting]: 'no-such-host.invalid' }
      const result = await runCli(['serve'], env)
      expect(result.code, setting).toBe(1)
      expect(result.stderr, setting).toMatch(
        new RegExp(`^${setting}=no-such-host\\.invalid: no such address on this machine \\((ENOTFOUND|EAI_AGAIN)\\); set ${setting} to one of its addresses, such as 127\\.0\\.0\\.1 or 0\\.0\\.0\\.0 \\[no_such_address\\]\n$`),
      )
    }
    const sandbox = await runCli(['sandbox', '--port', String(await freePort()), '--host', 'no-such-host.invalid'], { DATA_DIR: migratedDataDir('listen-') })
    expect(sandbox.code).toBe(1)
    expect(sandbox.stderr).toMatch(/^--host=no-such-host\.invalid: no such address on this machine \((ENOTFOUND|EAI_AGAIN)\); .* \[no_such_address\]\n$/)
  })

  it('says what a privileged port needs, and lets any other error through as it is', () => {
    const target = { portSetting: 'PORT', hostSetting: 'HOST', port: 80, host: '0.0.0.0' }
    const denied = Object.assign(new Error('listen EACCES: permission denied 0.0.0.0:80'), { code: 'EACCES' })
    expect(describeListenError(denied, target).message).toBe(
      'PORT=80: this user may not listen on 0.0.0.0:80 (ports under 1024 need privileges); set PORT to 1024 or above [port_not_permitted]',
    )
    const other = Object.assign(new Error('something else'), { code: 'EMFILE' })
    expect(describeListenError(other, target)).toBe(other)
  })
})
