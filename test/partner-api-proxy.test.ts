// The partner API client behind a company's HTTP proxy (HTTPS_PROXY / HTTP_PROXY / NO_PROXY): the client as
// the service builds it from its environment, a local platform, and a CONNECT proxy between them.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { configSecrets, parseConfig } from '../src/config.js'
import { createPartnerApiClient } from '../src/partner-api/create-partner-api-client.js'
import { PartnerNotSentError } from '../src/partner-api/partner-api-error.js'
import { fetchThroughProxy, proxyFor } from '../src/partner-api/partner-api-proxy.js'
import { type ConnectProxy, startConnectProxy } from './helpers/connect-proxy.js'
import { logEntries, rememberSecret, testLogger } from './helpers/log-sink.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'

// the proxy's password: never given to the logger's censor, so a line that held it would fail setup.ts's check
const PROXY_PASSWORD = 'pr0xy-pass-wOrd'
rememberSecret(PROXY_PASSWORD)

let platform: RecordingServer
let platformHost: string
const proxies: ConnectProxy[] = []

beforeAll(async () => {
  platform = await startRecordingServer({ secret: TEST_API_SECRET })
  platformHost = new URL(platform.url).host
})
afterAll(async () => {
  await Promise.all(proxies.map((proxy) => proxy.close()))
  await platform.close()
})

async function proxy(options: Parameters<typeof startConnectProxy>[0] = {}): Promise<ConnectProxy> {
  const started = await startConnectProxy(options)
  proxies.push(started)
  return started
}

function client(env: Record<string, string>) {
  const config = testConfig({ PARTNER_API_BASE_URL: platform.url, ...env })
  return createPartnerApiClient(config, { logger: testLogger([TEST_API_SECRET]), clock: systemClock, retry: { maxAttempts: 1 } })
}

describe('the partner API client with HTTP_PROXY set', () => {
  it('tunnels each call through the proxy with CONNECT, the signed request inside the tunnel', async () => {
    const through = await proxy()
    const before = platform.requests.length
    const trade = await client({ HTTP_PROXY: through.url() }).getTrade('tr_proxied')
    expect(trade.trade_id).toBeTruthy()
    expect(through.requests).toEqual([{ method: 'CONNECT', target: platformHost, proxyAuthorization: undefined }])
    expect(platform.requests.slice(before).map((request) => request.signatureValid)).toEqual([true])
  })

  it('sends the credentials of the proxy URL as Proxy-Authorization, and logs the proxy without them', async () => {
    const guarded = await proxy({ credentials: `partner:${PROXY_PASSWORD}` })
    await client({ http_proxy: guarded.url(`partner:${PROXY_PASSWORD}`), NO_PROXY: 'internal.example' }).getTrade('tr_auth')
    expect(guarded.requests.map((request) => request.proxyAuthorization)).toEqual([
      `Basic ${Buffer.from(`partner:${PROXY_PASSWORD}`).toString('base64')}`,
    ])
    const ready = logEntries().filter((entry) => entry.msg === 'partner api client ready' && entry.proxy === guarded.url())
    expect(ready.at(-1)).toMatchObject({ proxy: `http://127.0.0.1:${guarded.port}`, noProxy: 'internal.example' })
  })

  it('goes directly when NO_PROXY names the platform’s host, and says so in the ready line', async () => {
    const bypassed = await proxy()
    await client({ HTTP_PROXY: bypassed.url(), NO_PROXY: 'localhost, 127.0.0.1' }).getTrade('tr_direct')
    expect(bypassed.requests).toEqual([])
    const ready = logEntries().filter((entry) => entry.msg === 'partner api client ready').at(-1)
    expect(ready).toMatchObject({ proxy: 'none', noProxy: 'localhost, 127.0.0.1' })
  })

  it('logs no proxy fields when no proxy is set', async () => {
    await client({}).getTrade('tr_plain')
    const ready = logEntries().filter((entry) => entry.msg === 'partner api client ready').at(-1)!
    expect(ready).not.toHaveProperty('proxy')
    expect(ready).not.toHaveProperty('noProxy')
  })
})

describe('a proxy that does not let the call through', () => {
  it('names the proxy (without credentials) when it answers 407 to CONNECT: not sent, no password in the message', async () => {
    const guarded = await proxy({ credentials: 'partner:the-right-one' })
    const error = await client({ HTTP_PROXY: guarded.url(`partner:${PROXY_PASSWORD}`) })
      .createTrade({ external_reference: 'ord-407', title: 'T', amount: '10.00', currency: 'EUR', seller_id: 's-1', buyer_name: 'B' })
      .catch((caught: unknown) => caught)
    expect(error).toBeInstanceOf(PartnerNotSentError)
    expect((error as PartnerNotSentError).proxy).toBe(`http://127.0.0.1:${guarded.port}`)
    expect((error as Error).message).toContain(`the proxy http://127.0.0.1:${guarded.port} answered 407 to CONNECT ${platformHost}`)
    expect(JSON.stringify({ message: (error as Error).message, proxy: (error as PartnerNotSentError).proxy })).not.toContain(PROXY_PASSWORD)
  })

  it('names the proxy and the reason when it refuses the tunnel with 403, pointing a loopback target to NO_PROXY', async () => {
    const strict = await proxy({ refuse: 403 })
    const error = await client({ HTTP_PROXY: strict.url() }).getTrade('tr_refused').catch((caught: unknown) => caught)
    expect(error).toBeInstanceOf(PartnerNotSentError)
    expect((error as Error).message).toContain(`answered 403 to CONNECT ${platformHost} (127.0.0.1 is this machine: add it to NO_PROXY)`)
  })

  it('fails at the first CONNECT the proxy hangs up on, rather than connecting again until the timeout', async () => {
    const mute = await proxy({ refuse: 'hang-up' })
    const error = await client({ HTTP_PROXY: mute.url() }).getTrade('tr_hung_up').catch((caught: unknown) => caught)
    expect(error).toBeInstanceOf(PartnerNotSentError)
    expect((error as Error).message).toContain(
      `the proxy http://127.0.0.1:${mute.port} closed the connection without answering CONNECT ${platformHost}`,
    )
    expect(mute.requests.length).toBe(1)
  })

  it('names the proxy when nothing listens at its address', async () => {
    const gone = await proxy()
    await gone.close()
    const error = await client({ HTTPS_PROXY: 'http://u:x@127.0.0.1:1', HTTP_PROXY: gone.url(`partner:${PROXY_PASSWORD}`) })
      .getTrade('tr_gone')
      .catch((caught: unknown) => caught)
    expect(error).toBeInstanceOf(PartnerNotSentError)
    expect((error as Error).message).toContain(`could not connect to the proxy http://127.0.0.1:${gone.port} (ECONNREFUSED)`)
    expect((error as Error).message).not.toContain(PROXY_PASSWORD)
  })
})

describe('the proxy variables', () => {
  it('prefers the lower-case name, takes host:port as http://, and refuses another scheme without echoing the value', () => {
    const config = testConfig({ HTTP_PROXY: 'http://upper:3128', http_proxy: 'lower:3128', NO_PROXY: 'a', no_proxy: 'b' })
    expect(config.partner.proxy).toEqual({ httpProxy: 'http://lower:3128', httpsProxy: undefined, noProxy: 'b' })
    expect(() => testConfig({ HTTPS_PROXY: `socks5://u:${PROXY_PASSWORD}@proxy:1080` })).toThrow(
      /HTTPS_PROXY: must be an http:\/\/ or https:\/\/ proxy URL/,
    )
    try {
      testConfig({ HTTPS_PROXY: `socks5://u:${PROXY_PASSWORD}@proxy:1080` })
    } catch (error) {
      expect((error as Error).message).not.toContain(PROXY_PASSWORD)
    }
    expect(testConfig({ NO_PROXY: 'x' }).partner.proxy).toBeUndefined()
  })

  it('are not read in local mode, whose platform is the sandbox it runs: not even a socks5:// one is refused', () => {
    const secrets = { webhookSecret: 'w'.repeat(32), apiKeyId: 'pk_local', apiSecret: 's'.repeat(32), sandboxControlToken: 'c'.repeat(32), adminToken: 'a'.repeat(32) }
    const local = parseConfig({ DATA_DIR: 'memory://', HTTPS_PROXY: 'socks5://proxy:1080', HTTP_PROXY: 'http://proxy:3128' }, () => secrets)
    expect(local.partner.mode).toBe('local')
    expect(local.partner.proxy).toBeUndefined()
  })

  it('counts the proxy password among the secrets the log censors, as written and decoded', () => {
    const config = testConfig({ HTTPS_PROXY: 'http://u:p%40ss-w0rd@proxy:3128' })
    expect(configSecrets(config)).toEqual(expect.arrayContaining(['p%40ss-w0rd', 'p@ss-w0rd']))
  })

  it('chooses the proxy as undici’s EnvHttpProxyAgent does, by the tunnels it opens', async () => {
    const watcher = await proxy()
    const target = new URL(platform.url)
    const port = Number(target.port)
    const cases = [
      '',
      '127.0.0.1',
      `127.0.0.1:${port}`,
      `127.0.0.1:${port + 1}`,
      '.0.0.1',
      '*',
      'example.com, 127.0.0.2',
      '*.127.0.0.1',
    ]
    for (const noProxy of cases) {
      const settings = { httpProxy: watcher.url(), httpsProxy: undefined, noProxy }
      const before = watcher.requests.length
      await fetchThroughProxy(settings)(new URL('/', platform.url)).then((response) => response.arrayBuffer())
      const tunnelled = watcher.requests.length > before
      expect({ noProxy, proxied: proxyFor(target, settings) !== undefined }).toEqual({ noProxy, proxied: tunnelled })
    }
    // an https:// target takes HTTPS_PROXY, else HTTP_PROXY; an http:// one HTTP_PROXY only
    const https = new URL('https://platform.example')
    expect(proxyFor(https, { httpProxy: 'http://h:1', httpsProxy: undefined, noProxy: undefined })).toBe('http://h:1')
    expect(proxyFor(https, { httpProxy: 'http://h:1', httpsProxy: 'http://s:1', noProxy: undefined })).toBe('http://s:1')
    expect(proxyFor(target, { httpProxy: undefined, httpsProxy: 'http://s:1', noProxy: undefined })).toBeUndefined()
    expect(proxyFor(https, { httpProxy: 'http://h:1', httpsProxy: undefined, noProxy: 'example:80' })).toBe('http://h:1')
    expect(proxyFor(https, { httpProxy: 'http://h:1', httpsProxy: undefined, noProxy: 'example:443' })).toBeUndefined()
  })
})
