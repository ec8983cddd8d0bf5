// An https:// proxy (HTTPS_PROXY=https://...): the client speaks TLS with the proxy before it asks for the tunnel,
// and TLS again with the platform inside it. A proxy certificate this machine refuses (self-signed here) is the
// proxy's failure: nothing was sent, and the message names the proxy, not the platform. A platform certificate
// refused inside the tunnel still reads as the platform's. The same with a proxy certificate for another host,
// which needs a CA the process trusts from its start: test/partner-api-proxy-process.test.ts.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import net from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import tls from 'node:tls'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { z } from 'zod'
import { systemClock } from '../src/clock.js'
import { isOutcomeUnknown, PartnerNotSentError } from '../src/partner-api/partner-api-error.js'
import { describeProxy, fetchThroughProxy } from '../src/partner-api/partner-api-proxy.js'
import { PartnerApiTransport } from '../src/partner-api/partner-api-transport.js'
import { type ConnectProxy, startConnectProxy } from './helpers/connect-proxy.js'
import { testLogger } from './helpers/log-sink.js'
import { TEST_API_SECRET } from './helpers/test-config.js'

const fixtures = path.join(import.meta.dirname, 'fixtures/tls')
const ownCaCertificate = { cert: readFileSync(path.join(fixtures, 'server.crt')), key: readFileSync(path.join(fixtures, 'server.key')) }

/** A self-signed certificate for 127.0.0.1, made by openssl for this run. */
function selfSignedCertificate(): { cert: Buffer; key: Buffer } {
  const directory = mkdtempSync(path.join(tmpdir(), 'proxy-tls-'))
  try {
    const [cert, key] = [path.join(directory, 'proxy.crt'), path.join(directory, 'proxy.key')]
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
      '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', key, '-out', cert,
    ], { stdio: 'ignore' })
    return { cert: readFileSync(cert), key: readFileSync(key) }
  } finally {
    rmSync(directory, { recursive: true, force: true })
  }
}

interface HttpsProxy {
  url: string
  /** TLS connections the proxy accepted: one per attempt. */
  connections: number
  server: tls.Server
}

/** An https:// proxy: TLS with `certificate` in front of a CONNECT proxy (helpers/connect-proxy.ts), which records the CONNECTs. */
async function startHttpsProxy(certificate: { cert: Buffer; key: Buffer }, behind: ConnectProxy): Promise<HttpsProxy> {
  const server = tls.createServer(certificate, (client) => {
    const inner = net.connect(behind.port, '127.0.0.1')
    client.on('error', () => {}).pipe(inner)
    inner.on('error', () => {}).pipe(client)
  })
  // the client refusing our certificate ends the handshake with an alert: expected here
  server.on('tlsClientError', () => {})
  const proxy: HttpsProxy = { url: '', connections: 0, server }
  server.on('connection', () => proxy.connections++)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  proxy.url = `https://127.0.0.1:${(server.address() as net.AddressInfo).port}`
  return proxy
}

let connectProxy: ConnectProxy
let selfSignedProxy: HttpsProxy
let platform: tls.Server
let platformUrl: string
let platformConnections = 0

beforeAll(async () => {
  connectProxy = await startConnectProxy()
  selfSignedProxy = await startHttpsProxy(selfSignedCertificate(), connectProxy)
  // a platform with a certificate of a CA this process was not given: reached, it would be refused too
  platform = tls.createServer(ownCaCertificate, (socket) => socket.end())
  platform.on('connection', () => platformConnections++)
  await new Promise<void>((resolve) => platform.listen(0, '127.0.0.1', resolve))
  platformUrl = `https://localhost:${(platform.address() as net.AddressInfo).port}`
})
afterAll(async () => {
  await connectProxy.close()
  for (const server of [selfSignedProxy.server, platform]) await new Promise<void>((resolve) => server.close(() => resolve()))
})

const transport = (proxyUrl: string) =>
  new PartnerApiTransport({
    fetch: fetchThroughProxy({ httpProxy: undefined, httpsProxy: proxyUrl, noProxy: undefined }),
    proxy: describeProxy(proxyUrl),
    baseUrl: platformUrl,
    keyId: 'pk_proxy_tls',
    secret: TEST_API_SECRET,
    timeoutMs: 10_000,
    clock: systemClock,
    logger: testLogger([TEST_API_SECRET]),
    // the default four attempts, with short waits between them
    retry: { baseDelayMs: 1, maxDelayMs: 1 },
  })

describe('the partner API client through an https:// proxy whose certificate it refuses', () => {
  it('says the proxy’s certificate was refused, naming the proxy: a POST was not sent, and not through to the platform', async () => {
    const failure = await transport(selfSignedProxy.url).call('POST', '/trades/', {}, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ proxy: selfSignedProxy.url, lasting: true, beyondProxy: false })
    const reason =
      `the TLS certificate of the proxy ${selfSignedProxy.url} was not accepted (DEPTH_ZERO_SELF_SIGNED_CERT); ` +
      'if a CA of your own signed it, give the service NODE_EXTRA_CA_CERTS=/path/to/ca.pem (read at start)'
    expect((failure as PartnerNotSentError).reason).toBe(reason)
    expect((failure as Error).message).toBe(`POST /api/partner/v1/trades/ was not sent: ${reason}`)
    expect(isOutcomeUnknown(failure)).toBe(false)
  })

  it('tries a GET once, as every attempt would be refused the same way, and never asks for the tunnel', async () => {
    const [proxyBefore, platformBefore] = [selfSignedProxy.connections, platformConnections]
    const failure = await transport(selfSignedProxy.url).call('GET', '/trades/tr_1/', undefined, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect((failure as PartnerNotSentError).reason).toMatch(/^the TLS certificate of the proxy /)
    expect(selfSignedProxy.connections - proxyBefore).toBe(1)
    expect(connectProxy.requests).toEqual([])
    expect(platformConnections - platformBefore).toBe(0)
  })
})

describe('the partner API client through a proxy, the platform’s certificate refused in the tunnel', () => {
  it('still names the platform’s certificate, through the proxy that let the call through', async () => {
    const failure = await transport(connectProxy.url()).call('POST', '/trades/', {}, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ proxy: connectProxy.url(), lasting: true, beyondProxy: true })
    expect((failure as PartnerNotSentError).reason).toBe(
      "the platform's TLS certificate was not accepted (UNABLE_TO_VERIFY_LEAF_SIGNATURE); " +
        'if a CA of your own signed it, give the service NODE_EXTRA_CA_CERTS=/path/to/ca.pem (read at start) ' +
        `(through the proxy ${connectProxy.url()})`,
    )
    expect(connectProxy.requests.map((request) => request.target)).toEqual([new URL(platformUrl).host])
  })
})
