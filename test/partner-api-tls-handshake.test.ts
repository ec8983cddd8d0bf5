// A TLS handshake with the platform that fails for a reason other than its certificate: an https:// base URL on a
// port that speaks plain HTTP, a server that offers only TLS 1.0 or 1.1, one that shares no cipher with this
// machine. Not one byte of the request went out, exactly as with a refused certificate (test/own-ca-refusals.test.ts):
// the call is `not_sent`, a create leaves the order as it was, and a GET is not sent again, as the next attempt
// would fail the same way. The same through a proxy, once the tunnel is up: the handshake is still the platform's.
// A connection reset during the handshake is not sent either, but may pass: a GET is asked again. Real servers on
// this machine play the platform.
import { readFileSync } from 'node:fs'
import { createServer as createHttpServer } from 'node:http'
import { type AddressInfo, createServer as createNetServer, type Server } from 'node:net'
import path from 'node:path'
import tls from 'node:tls'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { z } from 'zod'
import type { CliContext } from '../src/cli/cli-context.js'
import { systemClock } from '../src/clock.js'
import { isOutcomeUnknown, PartnerNetworkError, PartnerNotSentError } from '../src/partner-api/partner-api-error.js'
import { describeProxy, fetchThroughProxy } from '../src/partner-api/partner-api-proxy.js'
import { PartnerApiTransport } from '../src/partner-api/partner-api-transport.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { type ConnectProxy, startConnectProxy } from './helpers/connect-proxy.js'
import { testLogger } from './helpers/log-sink.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const fixtures = path.join(import.meta.dirname, 'fixtures/tls')
const certificate = { cert: readFileSync(path.join(fixtures, 'server.crt')), key: readFileSync(path.join(fixtures, 'server.key')) }
const logger = testLogger([TEST_API_SECRET])

interface Platform {
  server: Server
  /** TCP connections accepted: one per attempt. */
  connections: number
  url: string
}

async function listen(server: Server, host: string): Promise<Platform> {
  const platform: Platform = { server, connections: 0, url: '' }
  server.on('connection', () => platform.connections++)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  platform.url = `https://${host}:${(server.address() as AddressInfo).port}`
  return platform
}

let plainHttp: Platform
let oldTls: Platform
let noSharedCipher: Platform
let ownCa: Platform
let resetInHandshake: Platform
let resetAfterRequest: Platform
let proxy: ConnectProxy

beforeAll(async () => {
  // answers every request, had one come
  plainHttp = await listen(createHttpServer((_request, response) => response.end('{}')), '127.0.0.1')
  // TLS 1.0 and 1.1 only (OpenSSL 3 allows them at security level 0 alone)
  oldTls = await listen(tls.createServer({ ...certificate, minVersion: 'TLSv1', maxVersion: 'TLSv1.1', ciphers: 'DEFAULT:@SECLEVEL=0' }), 'localhost')
  // TLS 1.2 with one cipher suite that no client offers without a pre-shared key
  noSharedCipher = await listen(tls.createServer({ ...certificate, maxVersion: 'TLSv1.2', ciphers: 'PSK-AES128-CBC-SHA' }), 'localhost')
  // a certificate of a CA this process was not given
  ownCa = await listen(tls.createServer(certificate), 'localhost')
  // resets the connection when the client's first handshake message comes
  resetInHandshake = await listen(createNetServer((socket) => socket.once('data', () => socket.resetAndDestroy())), 'localhost')
  // plain HTTP, reset once the request has come: what a reset after the handshake looks like to the client
  resetAfterRequest = await listen(createNetServer((socket) => socket.once('data', () => socket.resetAndDestroy())), '127.0.0.1')
  resetAfterRequest.url = resetAfterRequest.url.replace('https:', 'http:')
  proxy = await startConnectProxy()
})
afterAll(async () => {
  await proxy.close()
  for (const { server } of [plainHttp, oldTls, noSharedCipher, ownCa, resetInHandshake, resetAfterRequest]) {
    await new Promise<void>((resolve) => server.close(() => resolve()))
  }
})

const transport = (baseUrl: string, through?: ConnectProxy) =>
  new PartnerApiTransport({
    ...(through && {
      fetch: fetchThroughProxy({ httpProxy: undefined, httpsProxy: through.url(), noProxy: undefined }),
      proxy: describeProxy(through.url()),
    }),
    baseUrl,
    keyId: 'pk_handshake',
    secret: TEST_API_SECRET,
    timeoutMs: 10_000,
    clock: systemClock,
    logger,
    // the default four attempts, with short waits between them
    retry: { baseDelayMs: 1, maxDelayMs: 1 },
  })

const NOT_TLS =
  "the platform answered without TLS (ERR_SSL_WRONG_VERSION_NUMBER): its port takes plain HTTP; give the base URL http://, or https:// with the platform's TLS port"
const noCommonTls = (code: string) =>
  `the TLS handshake with the platform failed (${code}): it shares no TLS version or cipher with this machine, which speaks TLS 1.2 to 1.3`

describe('the partner API client when the TLS handshake fails', () => {
  it.each([
    ['a port that speaks plain HTTP', () => plainHttp, NOT_TLS],
    ['a server that offers only TLS 1.0 and 1.1', () => oldTls, noCommonTls('ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION')],
    // the alert's code as the OpenSSL of Node 20 names it, or as that of Node 22 and 24 does
    ['a server that shares no cipher', () => noSharedCipher, noCommonTls('ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE'), noCommonTls('ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE')],
  ])('with %s: a POST was not sent, and says why', async (_kind, platform, ...reasons) => {
    const { url } = platform()
    const failure = await transport(url).call('POST', '/trades/', {}, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ url, lasting: true })
    const { reason } = failure as PartnerNotSentError
    expect(reasons).toContain(reason)
    expect((failure as Error).message).toBe(`POST /api/partner/v1/trades/ was not sent: ${reason}`)
    // nothing happened on the platform: the outcome is known
    expect(isOutcomeUnknown(failure)).toBe(false)
  })

  it.each([
    ['a port that speaks plain HTTP', () => plainHttp],
    ['a server that offers only TLS 1.0 and 1.1', () => oldTls],
    ['a server that shares no cipher', () => noSharedCipher],
    // the same rule: a refused certificate is refused again a moment later
    ['a certificate of a CA this machine was not given', () => ownCa],
  ])('with %s: a GET is tried once, as every attempt would fail the same way', async (_kind, platform) => {
    const before = platform().connections
    const failure = await transport(platform().url).call('GET', '/trades/tr_1/', undefined, z.looseObject({})).catch((error: unknown) => error)
    expect(platform().connections - before).toBe(1)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ lasting: true })
  })
})

describe('the partner API client when the TLS handshake with the platform fails through a proxy', () => {
  it.each([
    ['a server that offers only TLS 1.0 and 1.1', () => oldTls, noCommonTls('ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION')],
    ['a server that shares no cipher', () => noSharedCipher, noCommonTls('ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE'), noCommonTls('ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE')],
  ])('with %s: a POST was not sent, the handshake named as the platform’s, not the proxy’s', async (_kind, platform, ...reasons) => {
    const { url } = platform()
    const failure = await transport(url, proxy).call('POST', '/trades/', {}, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ url, lasting: true, proxy: `http://127.0.0.1:${proxy.port}` })
    const { reason } = failure as PartnerNotSentError
    expect(reasons.map((expected) => `${expected} (through the proxy http://127.0.0.1:${proxy.port})`)).toContain(reason)
    expect((failure as Error).message).toBe(`POST /api/partner/v1/trades/ was not sent: ${reason}`)
    expect(isOutcomeUnknown(failure)).toBe(false)
  })

  it('with a certificate of a CA this machine was not given: the platform’s certificate is named, not the proxy', async () => {
    const failure = await transport(ownCa.url, proxy).call('POST', '/trades/', {}, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ lasting: true })
    expect((failure as PartnerNotSentError).reason).toMatch(/^the platform's TLS certificate was not accepted \(/)
    expect((failure as PartnerNotSentError).reason).toMatch(new RegExp(`\\(through the proxy http://127\\.0\\.0\\.1:${proxy.port}\\)$`))
  })

  it.each([
    ['a server that shares no cipher', () => noSharedCipher],
    ['a certificate of a CA this machine was not given', () => ownCa],
  ])('with %s: a GET is tried once, as every attempt would fail the same way', async (_kind, platform) => {
    const before = platform().connections
    const failure = await transport(platform().url, proxy).call('GET', '/trades/tr_1/', undefined, z.looseObject({})).catch((error: unknown) => error)
    expect(platform().connections - before).toBe(1)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ lasting: true })
  })
})

describe('the partner API client when the connection is reset', () => {
  it('during the TLS handshake: a POST was not sent, and says so', async () => {
    const { url } = resetInHandshake
    const failure = await transport(url).call('POST', '/trades/', {}, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
    expect(failure).toMatchObject({ url, lasting: false, reason: 'the connection could not be set up (ECONNRESET)' })
    expect((failure as Error).message).toBe('POST /api/partner/v1/trades/ was not sent: the connection could not be set up (ECONNRESET)')
    // nothing happened on the platform: the create can be sent again as it is
    expect(isOutcomeUnknown(failure)).toBe(false)
  })

  it('during the TLS handshake: a GET is asked again, as after any network error that may pass', async () => {
    const before = resetInHandshake.connections
    const failure = await transport(resetInHandshake.url).call('GET', '/trades/tr_1/', undefined, z.looseObject({})).catch((error: unknown) => error)
    expect(resetInHandshake.connections - before).toBe(4)
    expect(failure).toBeInstanceOf(PartnerNotSentError)
  })

  it('after the request went out: a POST’s outcome is unknown, as before', async () => {
    const failure = await transport(resetAfterRequest.url).call('POST', '/trades/', {}, z.looseObject({})).catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerNetworkError)
    expect(failure).not.toBeInstanceOf(PartnerNotSentError)
    expect((failure as Error).message).toBe('POST /api/partner/v1/trades/ failed: ECONNRESET')
    expect(isOutcomeUnknown(failure)).toBe(true)
  })
})

describe('trades open and trades get against an https:// base URL on a plain HTTP port', () => {
  let database: TestDatabase
  let context: CliContext
  beforeAll(async () => {
    database = await createTestDatabase()
    context = { config: testConfig({ PARTNER_API_BASE_URL: plainHttp.url }), logger, db: database.db }
  })
  afterAll(() => database.close())

  it('trades open says nothing was sent, [not_sent], and leaves the order with no create in flight', async () => {
    const result = await runCommandWith(['trades', 'open', 'tls-1', '--title', 'T', '--amount', '10.00', '--currency', 'EUR', '--seller', 's1'], context)
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toContain(`Could not reach the platform at ${plainHttp.url} (${NOT_TLS}): nothing was sent`)
    expect(result.stderr).toMatch(/ \[not_sent\]\n$/)
    // not `unknown`: the same command sends the create once the base URL is put right, no --retry needed
    expect(await orderByReference(database.db, 'tls-1')).toMatchObject({ tradeCreateState: 'none', tradeId: null })
  })

  it('trades get asks once and says nothing was sent, [not_sent]', async () => {
    await insertOrders(database.db, [{ externalReference: 'tls-2', tradeStatus: 'created' }])
    const before = plainHttp.connections
    const result = await runCommandWith(['trades', 'get', 'tls-2'], context)
    expect(result.code).toBe(1)
    expect(result.stderr).toContain(`Could not reach the platform at ${plainHttp.url} (${NOT_TLS}): nothing was sent`)
    expect(result.stderr).toMatch(/ \[not_sent\]\n$/)
    expect(plainHttp.connections - before).toBe(1)
  })
})

describe('trades get through a proxy to a platform whose TLS handshake fails', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
    await insertOrders(database.db, [{ externalReference: 'tls-3', tradeStatus: 'created' }])
  })
  afterAll(() => database.close())

  it('points at the base URL, not at the proxy settings: the proxy let the call through', async () => {
    const context = { config: testConfig({ PARTNER_API_BASE_URL: oldTls.url, HTTPS_PROXY: proxy.url() }), logger, db: database.db }
    const result = await runCommandWith(['trades', 'get', 'tls-3'], context)
    expect(result.code).toBe(1)
    expect(result.stderr).toContain(`Could not reach the platform at ${oldTls.url} through the proxy http://127.0.0.1:${proxy.port}: ${noCommonTls('ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION')}`)
    expect(result.stderr).toContain('the proxy let the call through: check PARTNER_API_BASE_URL. [not_sent]')
    expect(result.stderr).not.toContain('HTTPS_PROXY')
  })

  it('still points at the proxy settings when the proxy itself cannot be reached', async () => {
    const context = { config: testConfig({ PARTNER_API_BASE_URL: oldTls.url, HTTPS_PROXY: 'http://127.0.0.1:1' }), logger, db: database.db }
    const result = await runCommandWith(['trades', 'get', 'tls-3'], context)
    expect(result.code).toBe(1)
    expect(result.stderr).toContain('could not connect to the proxy http://127.0.0.1:1')
    expect(result.stderr).toContain('check HTTPS_PROXY / HTTP_PROXY and NO_PROXY. [not_sent]')
  })
})
