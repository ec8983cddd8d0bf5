// `serve` behind an HTTP proxy, as a partner behind a company firewall starts it: the compiled service with
// HTTP_PROXY / HTTPS_PROXY (and NO_PROXY) set, and the CLI from a second terminal opening a trade, which the
// service runs and sends to the platform (a sandbox of the test's) through the proxy. Local mode's own
// sandbox is called directly. An https:// proxy too, with the test CA given in NODE_EXTRA_CA_CERTS: one whose
// certificate is for another host is the proxy's failure, a platform's refused inside its tunnel the platform's.
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import tls from 'node:tls'
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
const tlsServers: tls.Server[] = []
afterEach(async () => {
  for (const child of running.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM')
      await once(child, 'exit')
    }
  }
  await Promise.all(proxies.splice(0).map((proxy) => proxy.close()))
  await Promise.all(platforms.splice(0).map((platform) => platform.close()))
  await Promise.all(tlsServers.splice(0).map((server) => new Promise<void>((resolve) => server.close(() => resolve()))))
})

async function proxy(options: Parameters<typeof startConnectProxy>[0] = {}): Promise<ConnectProxy> {
  const started = await startConnectProxy(options)
  proxies.push(started)
  return started
}

const tlsFixtures = path.join(import.meta.dirname, 'fixtures/tls')
/** The test CA's certificate for 127.0.0.1 and localhost. */
const testCaCertificate = () => ({
  cert: readFileSync(path.join(tlsFixtures, 'server.crt')),
  key: readFileSync(path.join(tlsFixtures, 'server.key')),
})

/**
 * An https:// proxy on `host`: TLS with the test CA's certificate in front of a CONNECT proxy, which records the
 * CONNECTs. The service trusts it given NODE_EXTRA_CA_CERTS; on another address than 127.0.0.1, its name is wrong.
 */
async function httpsProxy(host: string): Promise<{ url: string; behind: ConnectProxy }> {
  const behind = await proxy()
  const server = tls.createServer(testCaCertificate(), (client) => {
    const inner = net.connect(behind.port, '127.0.0.1')
    client.on('error', () => {}).pipe(inner)
    inner.on('error', () => {}).pipe(client)
  })
  // the service refusing the certificate ends the handshake with an alert: expected here
  server.on('tlsClientError', () => {})
  tlsServers.push(server)
  await new Promise<void>((resolve) => server.listen(0, host, resolve))
  return { url: `https://${host}:${(server.address() as net.AddressInfo).port}`, behind }
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
  const child = spawnCli(['serve'], env)
  running.push(child)
  let output = ''
  child.stdout!.on('data', (chunk: Buffer) => {
    output += chunk
  })
  await waitForLogLine(child, 'service listening')
  const platformHost = local ? `127.0.0.1:${sandboxPort}` : new URL(platformUrl).host
  return { child, env, platformHost, stdout: () => output }
}

/** A new order and a trade for it, each command run from a second process (inside the service). */
async function openTrade(service: Service, reference: string) {
  const created = await runCli(['orders', 'create', '--external-reference', reference], service.env)
  expect(created.stderr).toBe('')
  expect(created.code).toBe(0)
  return runCli(
    ['trades', 'open', reference, '--title', 'T', '--amount', '10', '--currency', 'EUR', '--seller', 's-1'],
    service.env,
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

  it('sends the trade through an https:// proxy whose CA it was given (NODE_EXTRA_CA_CERTS)', async () => {
    const through = await httpsProxy('127.0.0.1')
    const service = await startService({ HTTP_PROXY: through.url, NODE_EXTRA_CA_CERTS: path.join(tlsFixtures, 'ca.crt') })
    const opened = await openTrade(service, 'https-proxy-1')
    expect(opened.stderr).toBe('')
    expect(opened.code).toBe(0)
    expect(through.behind.requests).toEqual([{ method: 'CONNECT', target: service.platformHost, proxyAuthorization: undefined }])
  })

  // undici wraps this refusal (ERR_TLS_CERT_ALTNAME_INVALID) in an error of its own, which read as the
  // platform's certificate, refused beyond a proxy that had let the call through
  it('fails the command naming the proxy’s certificate when it is for another host: not sent, check the proxy settings', async () => {
    const elsewhere = await httpsProxy('127.0.0.2')
    const service = await startService({ HTTP_PROXY: elsewhere.url, NODE_EXTRA_CA_CERTS: path.join(tlsFixtures, 'ca.crt') })
    const opened = await openTrade(service, 'https-proxy-2')
    expect(opened.code).toBe(1)
    expect(opened.stderr).toContain(
      `through the proxy ${elsewhere.url}: the TLS certificate of the proxy ${elsewhere.url} was not accepted ` +
        '(ERR_TLS_CERT_ALTNAME_INVALID); give the proxy URL a host its certificate names.',
    )
    expect(opened.stderr).toContain('check HTTPS_PROXY / HTTP_PROXY and NO_PROXY. [not_sent]')
    expect(opened.stderr).not.toContain("the platform's TLS certificate")
    expect(elsewhere.behind.requests).toEqual([])
  })

  it('still names the platform’s certificate when that one is for another host, through an https:// proxy it trusts', async () => {
    const through = await httpsProxy('127.0.0.1')
    // the platform's certificate, of the same CA, is for 127.0.0.1 and localhost
    const platform = tls.createServer(testCaCertificate(), (socket) => socket.end())
    platform.on('tlsClientError', () => {})
    tlsServers.push(platform)
    await new Promise<void>((resolve) => platform.listen(0, '127.0.0.2', resolve))
    const platformUrl = `https://127.0.0.2:${(platform.address() as net.AddressInfo).port}`
    const service = await startService({
      HTTPS_PROXY: through.url,
      NODE_EXTRA_CA_CERTS: path.join(tlsFixtures, 'ca.crt'),
      PARTNER_API_BASE_URL: platformUrl,
    })
    const opened = await openTrade(service, 'https-proxy-3')
    expect(opened.code).toBe(1)
    expect(opened.stderr).toContain(
      `Could not reach the platform at ${platformUrl} through the proxy ${through.url}: the platform's TLS certificate ` +
        `was not accepted (ERR_TLS_CERT_ALTNAME_INVALID); `,
    )
    expect(opened.stderr).toContain('the proxy let the call through: check PARTNER_API_BASE_URL. [not_sent]')
    expect(through.behind.requests.map((request) => request.target)).toEqual([new URL(platformUrl).host])
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
    const after = await runCli(['migrate', '--json'], service.env)
    expect(after.code).toBe(0)
  })
})
