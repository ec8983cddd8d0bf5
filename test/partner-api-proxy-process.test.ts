// `serve` behind an HTTP proxy, as a partner behind a company firewall starts it: the compiled service with
// HTTP_PROXY / HTTPS_PROXY (and NO_PROXY) set, and the CLI from a second terminal opening a trade, which the
// service runs and sends to the platform (a sandbox of the test's) through the proxy. Local mode's own
// sandbox is called directly.
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { afterEach, describe, expect, it } from 'vitest'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { freePort, receiverEnv, runCli, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { type ConnectProxy, startConnectProxy } from './helpers/connect-proxy.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { testLogger } from './helpers/log-sink.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'

const PROXY_PASSWORD = 'pr0xy-pass-wOrd'

interface Service {
  child: ChildProcess
  env: Record<string, string>
  /** host:port of the platform the service calls */
  platformHost: string
  /** everything the service has written to stdout so far */
  stdout(): string
}

const running: ChildProcess[] = []
const proxies: ConnectProxy[] = []
const platforms: Sandbox[] = []
afterEach(async () => {
  for (const child of running.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM')
      await once(child, 'exit')
    }
  }
  await Promise.all(proxies.splice(0).map((proxy) => proxy.close()))
  await Promise.all(platforms.splice(0).map((platform) => platform.close()))
})

async function proxy(options: Parameters<typeof startConnectProxy>[0] = {}): Promise<ConnectProxy> {
  const started = await startConnectProxy(options)
  proxies.push(started)
  return started
}

// the platform: a sandbox of the test's own, on this machine, reached as a remote platform is (the service's
// own sandbox, local mode's, is never reached through a proxy)
async function startPlatform(): Promise<Sandbox> {
  const sandbox = createSandbox({ keyId: TEST_API_KEY_ID, apiSecret: TEST_API_SECRET, webhookSecret: TEST_WEBHOOK_SECRET, logger: testLogger() })
  platforms.push(sandbox)
  return sandbox
}

async function startService(proxyEnv: Record<string, string>, { local = false } = {}): Promise<Service> {
  const platform = await startPlatform()
  const platformUrl = await platform.listen(0)
  const sandboxPort = await freePort()
  const dataDir = migratedDataDir('proxy-')
  const env = {
    ...(local ? { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false', SANDBOX_PORT: String(sandboxPort) } : receiverEnv(dataDir)),
    ...(local ? {} : { PARTNER_API_BASE_URL: platformUrl }),
    LOG_LEVEL: 'debug',
    ...proxyEnv,
  }
  const child = spawnCli(['serve'], env, { built: true })
  running.push(child)
  let output = ''
  child.stdout!.on('data', (chunk: Buffer) => {
    output += chunk
  })
  await waitForLogLine(child, 'service listening', 120_000)
  const platformHost = local ? `127.0.0.1:${sandboxPort}` : new URL(platformUrl).host
  return { child, env, platformHost, stdout: () => output }
}

/** A new order and a trade for it, each command run from a second process (inside the service). */
async function openTrade(service: Service, reference: string) {
  const created = await runCli(['orders', 'create', '--external-reference', reference], service.env, { built: true })
  expect(created.stderr).toBe('')
  expect(created.code).toBe(0)
  return runCli(
    ['trades', 'open', reference, '--title', 'T', '--amount', '10', '--currency', 'EUR', '--seller', 's-1'],
    service.env,
    { built: true },
  )
}

describe('serve with HTTP_PROXY set', () => {
  it('sends the trade through the proxy: one CONNECT to the platform’s host:port', async () => {
    const through = await proxy()
    const service = await startService({ HTTP_PROXY: through.url(), HTTPS_PROXY: through.url() })
    const opened = await openTrade(service, 'proxied-1')
    expect(opened.stderr).toBe('')
    expect(opened.code).toBe(0)
    expect(opened.stdout).toMatch(/^proxied-1: trade \S+ \(\S+\) is /)
    // one POST, so one tunnel (the poller is off)
    expect(through.requests).toEqual([{ method: 'CONNECT', target: service.platformHost, proxyAuthorization: undefined }])
    expect(service.stdout()).toContain(`"proxy":"http://127.0.0.1:${through.port}"`)
  })

  it('goes directly with NO_PROXY=127.0.0.1: the proxy sees nothing', async () => {
    const bypassed = await proxy()
    const service = await startService({ HTTP_PROXY: bypassed.url(), HTTPS_PROXY: bypassed.url(), NO_PROXY: '127.0.0.1' })
    const opened = await openTrade(service, 'direct-1')
    expect(opened.stderr).toBe('')
    expect(opened.code).toBe(0)
    expect(bypassed.requests).toEqual([])
    expect(service.stdout()).toContain('"proxy":"none","noProxy":"127.0.0.1"')
  })

  it('opens the tunnel with the credentials of the proxy URL, and no log line holds the password', async () => {
    const guarded = await proxy({ credentials: `partner:${PROXY_PASSWORD}` })
    const service = await startService({ HTTP_PROXY: guarded.url(`partner:${PROXY_PASSWORD}`) })
    const opened = await openTrade(service, 'guarded-1')
    expect(opened.stderr).toBe('')
    expect(opened.code).toBe(0)
    const expected = `Basic ${Buffer.from(`partner:${PROXY_PASSWORD}`).toString('base64')}`
    expect(guarded.requests).toEqual([{ method: 'CONNECT', target: service.platformHost, proxyAuthorization: expected }])
    expect(service.stdout()).toContain(`"proxy":"http://127.0.0.1:${guarded.port}"`)
    expect(service.stdout()).not.toContain(PROXY_PASSWORD)
    // not blanked by the censor either: the line never held it
    expect(service.stdout()).not.toContain('[redacted]')
  })

  it('in local mode, calls its own sandbox directly: the proxy sees nothing', async () => {
    const unused = await proxy()
    const service = await startService({ HTTP_PROXY: unused.url(), HTTPS_PROXY: unused.url() }, { local: true })
    const opened = await openTrade(service, 'local-1')
    expect(opened.stderr).toBe('')
    expect(opened.code).toBe(0)
    expect(unused.requests).toEqual([])
    expect(service.stdout()).not.toContain('"proxy"')
  })

  it('fails the command naming the proxy when nothing listens there, and the service keeps running', async () => {
    const port = await freePort()
    const service = await startService({ HTTP_PROXY: `http://partner:${PROXY_PASSWORD}@127.0.0.1:${port}` })
    const opened = await openTrade(service, 'unreachable-1')
    expect(opened.code).toBe(1)
    expect(opened.stderr).toContain(`through the proxy http://127.0.0.1:${port}: could not connect to the proxy`)
    expect(opened.stderr).toContain('[not_sent]')
    expect(opened.stderr + opened.stdout + service.stdout()).not.toContain(PROXY_PASSWORD)
    expect(service.child.exitCode).toBeNull()
    const after = await runCli(['migrate', '--json'], service.env, { built: true })
    expect(after.code).toBe(0)
  })
})
