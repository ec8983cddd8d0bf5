// The compiled CLI loads the HTTP client (undici), the Postgres driver (pg) and the broker's client (amqplib) only
// when a command makes the connection that needs one (src/lazy-packages.ts): imported with the modules that use them,
// they cost each command's start 300 ms of CPU, on commands that never connect to the platform, to Postgres or to a
// broker. A command forwarded to the running service loads no more than it needs to forward itself (environment.ts).
// What the process loads is seen by a probe preloaded into it (fixtures/package-load-probe.mjs), which the cases check
// sees what the CLI does load (pino, the forwarding module).
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import type { Kysely } from 'kysely'
import { afterAll, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { seededCliDatabase } from './helpers/cli-database.js'
import { freePort, receiverEnv, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { postgresUrl } from './helpers/test-database.js'

const probe = path.resolve(import.meta.dirname, 'fixtures/package-load-probe.mjs')
const LAZY = ['undici', 'pg', 'amqplib'] as const
const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup()
})

/** `args` run by the compiled CLI in `env`, and the packages it loaded, of `names`. */
async function loadedBy(args: string[], env: Record<string, string>, names: readonly string[]) {
  const out = path.join(mkdtempSync(path.join(tmpdir(), 'package-probe-')), 'loaded.txt')
  const result = await runCli(args, { ...env, NODE_OPTIONS: `--import ${pathToFileURL(probe).href}`, PACKAGE_LOAD_PROBE: out })
  let requests: string[] = []
  try {
    requests = readFileSync(out, 'utf8').split('\n')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error
  }
  const loaded = names.filter((name) => requests.some((request) => request === name || request.includes(`/node_modules/${name}/`)))
  return { result, loaded, requests }
}

describe('the packages a command loads', () => {
  it('`orders list` on the embedded database loads none of undici, pg and amqplib (and the probe sees pino)', async () => {
    const env = receiverEnv(migratedDataDir('lazy-packages-'))
    const { result, loaded } = await loadedBy(['orders', 'list'], env, ['pino', ...LAZY])
    expect(result, result.stderr).toMatchObject({ code: 0, stdout: '(no orders)\n' })
    expect(loaded).toEqual(['pino'])
  })

  it('a command that calls the platform loads undici, at the call: `trades open` with nothing listening, [not_sent]', async () => {
    const env = receiverEnv(migratedDataDir('lazy-packages-call-'))
    const args = ['trades', 'open', 'lazy-1', '--title', 'A lamp', '--amount', '1.00', '--currency', 'KES', '--seller', 'usr_1']
    const { result, loaded } = await loadedBy(args, env, LAZY)
    expect(result.code, result.stderr).toBe(1)
    expect(result.stderr).toContain('[not_sent]')
    expect(loaded).toEqual(['undici'])
  })

  // found measuring it: the forwarded command imported config.ts for two small readings of the environment, and with it
  // zod and the schema's modules, half its CPU (environment.ts)
  it('a command forwarded to the running service loads neither the configuration (config.ts) nor zod, nor any of the three', async () => {
    const env = { DATA_DIR: migratedDataDir('lazy-packages-forward-'), PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false', SANDBOX_PORT: String(await freePort()) }
    const service = spawnCli(['serve'], env)
    try {
      await waitForLogLine(service, 'service listening')
      const { result, loaded, requests } = await loadedBy(['orders', 'list'], env, ['zod', ...LAZY])
      expect(result, result.stderr).toMatchObject({ code: 0, stdout: '(no orders)\n' })
      // the probe sees the ES modules: the one that forwards the command
      expect(requests.some((request) => request.endsWith('/dist/src/local/running-service.js'))).toBe(true)
      expect(requests.filter((request) => request.endsWith('/dist/src/config.js'))).toEqual([])
      expect(loaded).toEqual([])
      // nor Node's own copy of undici, nor http2: on Node 22 and 24, node:http taken through an ES import made its
      // namespace of every export, its WebSocket among them, which loads them (local/service-request.ts)
      expect(requests.filter((request) => ['node-internal:internal/deps/undici/undici', 'node-internal:http2'].includes(request))).toEqual([])
      expect(requests).toContain('node-internal:_http_client')
    } finally {
      await stopChild(service)
    }
  })

  // the program's help is made from program.ts's list of commands: loading each command's file (and webhook's raw-body
  // with it) took half of `--help`'s start. `orders list` loads its own file and no other command's.
  it('`--help` loads no command\'s file, nor raw-body; `orders list` loads orders\' file alone', async () => {
    const env = receiverEnv(migratedDataDir('lazy-packages-help-'))
    const commandFiles = (requests: string[]) => requests.filter((request) => /\/dist\/src\/cli\/[a-z-]+\.command\.js$/.test(request)).map((request) => path.basename(request))
    const help = await loadedBy(['--help'], env, ['raw-body', 'iconv-lite', ...LAZY])
    expect(help.result.code, help.result.stderr).toBe(0)
    expect(help.result.stdout).toContain('orders ')
    expect(help.requests.some((request) => request.endsWith('/dist/src/cli/program.js'))).toBe(true)
    expect(commandFiles(help.requests)).toEqual([])
    expect(help.loaded).toEqual([])
    const list = await loadedBy(['orders', 'list'], env, [])
    expect(list.result, list.result.stderr).toMatchObject({ code: 0, stdout: '(no orders)\n' })
    expect([...new Set(commandFiles(list.requests))]).toEqual(['orders.command.js'])
  })

  it.skipIf(!postgresUrl)('`orders list` through DATABASE_URL loads pg, and neither undici nor amqplib (Postgres)', async () => {
    const seed = (db: Kysely<Database>) => insertOrders(db, [{ externalReference: 'lazy-pg-1' }])
    const { env } = await seededCliDatabase('postgres', { prefix: 'lazy-packages-pg-', env: {}, seed, cleanups })
    const { result, loaded } = await loadedBy(['orders', 'list'], env, LAZY)
    expect(result.code, result.stderr).toBe(0)
    expect(result.stdout).toContain('lazy-pg-1')
    expect(loaded).toEqual(['pg'])
  })
})
