import { createServer, type AddressInfo } from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { PartnerApiClient, type PartnerApiClientOptions } from '../src/partner-api/partner-api.client.js'
import {
  isOutcomeUnknown,
  PartnerApiError,
  PartnerInvalidResponseError,
  PartnerNetworkError,
  PartnerNotSentError,
  PartnerTimeoutError,
} from '../src/partner-api/partner-api-error.js'
import { FakeClock, ZeroSleepFakeClock } from './helpers/fake-clock.js'
import { logLines, rememberSecret, taggedLogger, testLogger } from './helpers/log-sink.js'
import { scriptedFetch, settleWithClock } from './helpers/partner-api-fake-fetch.js'
import { PACKAGE_VERSION } from './helpers/package-version.js'
import { disputeRecord, proposalRecord, respondResult, tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'

const SECRET = 'apisec_client_test_5c8e1a7d3f9b2e4c6a0d'
const KEY_ID = 'pk_client_test'
const TIMEOUT_MS = 7_777
const logger = testLogger([SECRET])

function client(overrides: Partial<PartnerApiClientOptions> = {}): PartnerApiClient {
  return new PartnerApiClient({
    baseUrl: 'http://platform.test',
    keyId: KEY_ID,
    secret: SECRET,
    env: 'sandbox',
    kind: 'marketplace',
    timeoutMs: TIMEOUT_MS,
    clock: new FakeClock(),
    logger,
    random: () => 0.5,
    ...overrides,
  })
}

const createRequest = {
  title: 'Fahrrad – grün',
  amount: '120.00',
  currency: 'EUR',
  seller_id: 'seller_1',
  buyer_name: 'Zoë',
  buyer_phone: '+4915112345678',
  external_reference: 'order-1',
}

describe('PartnerApiClient against a local server that checks every signature', () => {
  let server: RecordingServer
  beforeAll(async () => {
    server = await startRecordingServer({ secret: SECRET })
  })
  afterAll(async () => {
    await server.close()
  })

  it('calls each of the eleven endpoints with the right method, path, body and a valid signature', async () => {
    const api = client({ baseUrl: server.url, clock: systemClock })
    const milestones = [
      { title: 'Frame', amount: '70.00' },
      { title: 'Wheels', amount: '50.00' },
    ]
    const calls: {
      run: () => Promise<unknown>
      method: string
      path: string
      body: unknown
      answer: unknown
    }[] = [
      {
        run: () => api.createTrade({ ...createRequest, milestones }),
        method: 'POST',
        path: '/api/partner/v1/trades/',
        body: { ...createRequest, milestones },
        answer: tradeRecord(),
      },
      {
        run: () => api.getTrade('tr_1'),
        method: 'GET',
        path: '/api/partner/v1/trades/tr_1/',
        body: undefined,
        answer: tradeRecord(),
      },
      {
        run: () => api.fundTrade('tr_1'),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/fund/',
        body: {},
        answer: tradeRecord(),
      },
      {
        run: () => api.deliverTrade('tr_1'),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/deliver/',
        body: {},
        answer: tradeRecord(),
      },
      {
        run: () => api.releaseTrade('tr_1'),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/release/',
        body: {},
        answer: tradeRecord(),
      },
      {
        run: () => api.cancelTrade('tr_1'),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/cancel/',
        body: {},
        answer: tradeRecord(),
      },
      {
        run: () => api.deliverMilestone('tr_1', 'ms_2'),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/milestones/ms_2/deliver/',
        body: {},
        // the server's trade record, said to be one
        answer: { record: 'trade', trade: tradeRecord() },
      },
      {
        run: () => api.releaseMilestone('tr_1', 'ms_2'),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/milestones/ms_2/release/',
        body: {},
        // the server's trade record, said to be one
        answer: { record: 'trade', trade: tradeRecord() },
      },
      {
        run: () =>
          api.openDispute('tr_1', {
            reason: 'The frame arrived bent and scratched',
            category: 'damaged',
            party: 'buyer',
          }),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/dispute/',
        body: { reason: 'The frame arrived bent and scratched', category: 'damaged', party: 'buyer' },
        answer: disputeRecord(),
      },
      {
        run: () => api.createProposal('tr_1', { outcome: 'split', split_buyer_pct: '40', party: 'seller' }),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/proposals/',
        body: { outcome: 'split', split_buyer_pct: '40', party: 'seller' },
        answer: proposalRecord(),
      },
      {
        run: () => api.respondToProposal('tr_1', 'pr_1', { accept: true, party: 'buyer' }),
        method: 'POST',
        path: '/api/partner/v1/trades/tr_1/proposals/pr_1/respond/',
        body: { accept: true, party: 'buyer' },
        answer: respondResult(),
      },
    ]

    const before = server.requests.length
    for (const call of calls) {
      const answered = await call.run()
      const received = server.requests.at(-1)!
      const label = `${call.method} ${call.path}`
      expect(received.method, label).toBe(call.method)
      expect(received.path, label).toBe(call.path)
      expect(received.signatureValid, label).toBe(true)
      expect(received.headers['x-partner-key-id'], label).toBe(KEY_ID)
      expect(received.headers['user-agent'], label).toBe(`partner-escrow/${PACKAGE_VERSION}`)
      expect(answered, label).toEqual(call.answer)
      if (call.body === undefined) {
        expect(received.rawBody.length, label).toBe(0)
        expect(received.headers['content-type'], label).toBeUndefined()
      } else {
        // the bytes received are the one serialization that was signed
        expect(received.rawBody.toString('utf8'), label).toBe(JSON.stringify(call.body))
        expect(received.headers['content-type'], label).toBe('application/json')
      }
    }
    expect(server.requests.length - before).toBe(11)
  })

  it('signs the full path as sent when the base URL has a path prefix', async () => {
    const api = client({ baseUrl: `${server.url}/gateway/`, clock: systemClock })
    await api.getTrade('tr_1')
    const received = server.requests.at(-1)!
    expect(received.path).toBe('/gateway/api/partner/v1/trades/tr_1/')
    expect(received.signatureValid).toBe(true)
  })

  it('percent-encodes path ids and signs the encoded path the server receives', async () => {
    const api = client({ baseUrl: server.url, clock: systemClock })
    await api.deliverMilestone('tr 1/x', 'm?s#1')
    const received = server.requests.at(-1)!
    expect(received.path).toBe('/api/partner/v1/trades/tr%201%2Fx/milestones/m%3Fs%231/deliver/')
    expect(received.signatureValid).toBe(true)
  })

  it('signs the UTF-8 bytes of a body with non-ASCII characters exactly as received', async () => {
    const api = client({ baseUrl: server.url, clock: systemClock })
    await api.createTrade({ ...createRequest, title: 'Vélo 山田 🚲' })
    const received = server.requests.at(-1)!
    expect(received.rawBody.toString('utf8')).toContain('Vélo 山田 🚲')
    expect(received.signatureValid).toBe(true)
  })

  it('uses the timestamp of the injected clock in Unix seconds', async () => {
    const clock = new FakeClock(Date.parse('2026-03-04T05:06:07.890Z'))
    const api = client({ baseUrl: server.url, clock })
    await api.getTrade('tr_1')
    expect(server.requests.at(-1)!.headers['x-partner-timestamp']).toBe(
      String(Date.parse('2026-03-04T05:06:07Z') / 1000),
    )
  })
})

describe('PartnerApiClient nonces', () => {
  it('never repeats a nonce over 10,000 calls', async () => {
    const { fetch, calls } = scriptedFetch(() => ({ status: 200, body: tradeRecord() }))
    const api = client({ fetch, logger: testLogger([SECRET]).child({}, { level: 'info' }) })
    for (let i = 0; i < 10_000; i++) await api.getTrade('tr_1')
    const nonces = new Set(calls.map((call) => call.headers['X-Partner-Nonce']))
    expect(calls).toHaveLength(10_000)
    expect(nonces.size).toBe(10_000)
  })
})

describe('PartnerApiClient retries', () => {
  it('succeeds after two retries when a GET is answered 503, 503, 200', async () => {
    const clock = new FakeClock()
    const { fetch, calls } = scriptedFetch([
      { status: 503 },
      { status: 503 },
      { status: 200, body: tradeRecord({ status: 'funded' }) },
    ])
    const api = client({ fetch, clock })
    const trade = await settleWithClock(clock, api.getTrade('tr_1'), TIMEOUT_MS)
    expect(trade.status).toBe('funded')
    expect(calls).toHaveLength(3)
    // equal jitter with random 0.5: three quarters of 200 ms, then of 400 ms
    expect(clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)).toEqual([150, 300])
    // every attempt is signed afresh
    expect(new Set(calls.map((call) => call.headers['X-Partner-Nonce'])).size).toBe(3)
  })

  it('waits two seconds of the injected clock when a 429 says Retry-After: 2', async () => {
    const clock = new FakeClock()
    const { fetch, calls } = scriptedFetch([
      {
        status: 429,
        headers: { 'retry-after': '2' },
        body: { error: { code: 'rate_limited', message: 'slow down' } },
      },
      { status: 200, body: tradeRecord() },
    ])
    const api = client({ fetch, clock })
    const started = clock.now()
    await settleWithClock(clock, api.getTrade('tr_1'), TIMEOUT_MS)
    expect(calls).toHaveLength(2)
    expect(clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)).toEqual([2000])
    expect(clock.now() - started).toBe(2000)
  })

  it('waits the backoff, not nothing, when a 429 says Retry-After: 0', async () => {
    const clock = new FakeClock()
    const { fetch, calls } = scriptedFetch([
      { status: 429, headers: { 'retry-after': '0' } },
      { status: 429, headers: { 'retry-after': '0' } },
      { status: 200, body: tradeRecord() },
    ])
    await settleWithClock(clock, client({ fetch, clock }).getTrade('tr_1'), TIMEOUT_MS)
    expect(calls).toHaveLength(3)
    // equal jitter with random 0.5: three quarters of 200 ms, then of 400 ms, as after a 429 without Retry-After
    expect(clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)).toEqual([150, 300])
  })

  it('does not retry a 429 that came while another call of the client waits out its own', async () => {
    // a sleep of 0 ms ends at once here, as on the system clock: a retry at once would be sent, not wait forever
    const clock = new ZeroSleepFakeClock()
    const { fetch, calls } = scriptedFetch(() => ({ status: 429, headers: { 'retry-after': '0' } }))
    const api = client({ fetch, clock })
    const first = api.getTrade('tr_1').catch((e) => e)
    // the first call met a 429 and waits its backoff (150 ms) before its next attempt
    while (!clock.sleeps.some((ms) => ms !== TIMEOUT_MS)) await new Promise((r) => setImmediate(r))
    const second = await api.getTrade('tr_2').catch((e) => e)
    expect(second).toBeInstanceOf(PartnerApiError)
    expect(second).toMatchObject({ status: 429, retryAfterMs: 0 })
    expect(calls.map((call) => call.url)).toEqual([expect.stringContaining('/tr_1/'), expect.stringContaining('/tr_2/')])
    // the first goes on with its retries once its wait is over, each after the backoff
    await clock.advance(150)
    await settleWithClock(clock, first, TIMEOUT_MS)
    expect(calls).toHaveLength(5)
    expect(clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)).toEqual([150, 300, 600])
  })

  it('honours a Retry-After given as an HTTP date', async () => {
    const clock = new FakeClock(Date.parse('2026-01-01T00:00:00Z'))
    const { fetch, calls } = scriptedFetch([
      { status: 503, headers: { 'retry-after': 'Thu, 01 Jan 2026 00:00:05 GMT' } },
      { status: 200, body: tradeRecord() },
    ])
    await settleWithClock(clock, client({ fetch, clock }).getTrade('tr_1'), TIMEOUT_MS)
    expect(calls).toHaveLength(2)
    expect(clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)).toEqual([5000])
  })

  it('gives up with the 429 when Retry-After asks for longer than it will wait inside a call', async () => {
    const clock = new FakeClock()
    const { fetch, calls } = scriptedFetch([{ status: 429, headers: { 'retry-after': '3600' } }])
    const error = await client({ fetch, clock })
      .getTrade('tr_1')
      .catch((e) => e)
    expect(error).toBeInstanceOf(PartnerApiError)
    // how long the platform asked for goes with the error, for the poller to wait it out
    expect(error).toMatchObject({ status: 429, code: 'http_429', retryAfterMs: 3_600_000 })
    expect(calls).toHaveLength(1)
  })

  it('does not retry a POST answered 503', async () => {
    const clock = new FakeClock()
    const { fetch, calls } = scriptedFetch([{ status: 503 }, { status: 200, body: tradeRecord() }])
    const error = await client({ fetch, clock })
      .fundTrade('tr_1')
      .catch((e) => e)
    expect(error).toBeInstanceOf(PartnerApiError)
    expect(error).toMatchObject({ status: 503, code: 'http_503' })
    expect(calls).toHaveLength(1)
    expect(clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)).toEqual([])
  })

  it('does not retry a POST whose connection failed', async () => {
    const { fetch, calls } = scriptedFetch([
      { networkError: 'ECONNRESET' },
      { status: 200, body: tradeRecord() },
    ])
    await expect(client({ fetch }).createTrade(createRequest)).rejects.toBeInstanceOf(PartnerNetworkError)
    expect(calls).toHaveLength(1)
  })

  it('retries a GET on network errors with capped exponential backoff, then gives up with PartnerNetworkError', async () => {
    const clock = new FakeClock()
    const { fetch, calls } = scriptedFetch(() => ({ networkError: 'ECONNREFUSED' }))
    const api = client({
      fetch,
      clock,
      random: () => 0.999,
      retry: { maxAttempts: 6, baseDelayMs: 1000, maxDelayMs: 5000 },
    })
    const error = await settleWithClock(clock, api.getTrade('tr_1'), TIMEOUT_MS).catch((e) => e)
    expect(error).toBeInstanceOf(PartnerNetworkError)
    expect(error.message).toContain('ECONNREFUSED')
    expect(calls).toHaveLength(6)
    // steps 1 s, 2 s, 4 s, then capped at 5 s; jitter adds up to half a step
    expect(clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)).toEqual([1000, 1999, 3998, 4998, 4998])
  })

  it('does not retry a GET answered 404, and reports the platform error code', async () => {
    const { fetch, calls } = scriptedFetch([
      { status: 404, body: { error: { code: 'trade_not_found', message: 'no trade tr_x' } } },
    ])
    const error = await client({ fetch })
      .getTrade('tr_x')
      .catch((e) => e)
    expect(error).toBeInstanceOf(PartnerApiError)
    expect(error).toMatchObject({
      status: 404,
      code: 'trade_not_found',
      body: { error: { code: 'trade_not_found', message: 'no trade tr_x' } },
    })
    expect(error.message).toContain('no trade tr_x')
    expect(calls).toHaveLength(1)
  })

  it('stops waiting when the caller aborts during a backoff', async () => {
    const clock = new FakeClock()
    const { fetch } = scriptedFetch(() => ({ status: 503 }))
    const controller = new AbortController()
    const call = client({ fetch, clock }).getTrade('tr_1', { signal: controller.signal })
    const failure = call.catch((e) => e)
    while (clock.sleeps.filter((ms) => ms !== TIMEOUT_MS).length === 0)
      await new Promise((r) => setImmediate(r))
    controller.abort(new Error('shutting down'))
    expect((await failure).message).toBe('shutting down')
  })
})

describe('PartnerApiClient errors', () => {
  it('answers PartnerTimeoutError when no answer comes within timeoutMs of the injected clock', async () => {
    const clock = new FakeClock()
    const { fetch } = scriptedFetch(['hang'])
    const failure = client({ fetch, clock })
      .createTrade(createRequest)
      .catch((e) => e)
    while (clock.pendingSleepers === 0) await new Promise((r) => setImmediate(r))
    await clock.advance(TIMEOUT_MS - 1)
    await clock.advance(1)
    const error = await failure
    expect(error).toBeInstanceOf(PartnerTimeoutError)
    expect(error.timeoutMs).toBe(TIMEOUT_MS)
    expect(isOutcomeUnknown(error)).toBe(true)
  })

  it('retries a GET that timed out and answers PartnerTimeoutError after the last attempt', async () => {
    const clock = new FakeClock()
    const { fetch, calls } = scriptedFetch(() => 'hang')
    const failure = client({ fetch, clock, retry: { maxAttempts: 2 } })
      .getTrade('tr_1')
      .catch((e) => e)
    for (let attempt = 0; attempt < 2; attempt++) {
      while (clock.pendingSleepers === 0 || clock.sleeps.at(-1) !== TIMEOUT_MS)
        await new Promise((r) => setImmediate(r))
      await clock.advance(TIMEOUT_MS)
      if (attempt === 0) {
        while (clock.sleeps.at(-1) === TIMEOUT_MS) await new Promise((r) => setImmediate(r))
        await clock.advance(clock.sleeps.at(-1)!)
      }
    }
    expect(await failure).toBeInstanceOf(PartnerTimeoutError)
    expect(calls).toHaveLength(2)
  })

  it('answers PartnerNotSentError when nothing listens at the base URL: the outcome is known, nothing happened', async () => {
    // a port that was just free: nothing listens there
    const probe = createServer()
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve))
    const { port } = probe.address() as AddressInfo
    await new Promise<void>((resolve) => probe.close(() => resolve()))
    const baseUrl = `http://127.0.0.1:${port}`
    const error = await client({ baseUrl, clock: systemClock })
      .fundTrade('tr_1')
      .catch((e) => e)
    expect(error).toBeInstanceOf(PartnerNotSentError)
    expect(error).toMatchObject({ reason: 'ECONNREFUSED', url: baseUrl })
    // still a network error for the GET retry rule
    expect(error).toBeInstanceOf(PartnerNetworkError)
    expect(isOutcomeUnknown(error)).toBe(false)
  })

  it('answers PartnerApiError with the platform code, status and field list of a 422', async () => {
    const body = {
      error: {
        code: 'validation_failed',
        message: 'invalid fields',
        fields: [{ field: 'currency', message: 'unknown' }],
      },
    }
    const { fetch } = scriptedFetch([{ status: 422, body }])
    const error = await client({ fetch })
      .createTrade(createRequest)
      .catch((e) => e)
    expect(error).toBeInstanceOf(PartnerApiError)
    expect(error).toMatchObject({ status: 422, code: 'validation_failed', body })
    expect(isOutcomeUnknown(error)).toBe(false)
  })

  it('answers http_<status> with the text body when the error body is not the platform format', async () => {
    const { fetch } = scriptedFetch([{ status: 502, body: '<html>Bad gateway</html>' }])
    const error = await client({ fetch })
      .cancelTrade('tr_1')
      .catch((e) => e)
    expect(error).toMatchObject({ status: 502, code: 'http_502', body: '<html>Bad gateway</html>' })
  })

  it('treats a success answer without the expected record as an unknown outcome', async () => {
    const { fetch } = scriptedFetch([
      { status: 201, body: 'not json' },
      { status: 200, body: { ok: true } },
    ])
    const api = client({ fetch })
    const first = await api.createTrade(createRequest).catch((e) => e)
    const second = await api.releaseTrade('tr_1').catch((e) => e)
    for (const error of [first, second]) {
      expect(error).toBeInstanceOf(PartnerInvalidResponseError)
      expect(isOutcomeUnknown(error)).toBe(true)
    }
  })

  it('does not follow a redirect with a signed body', async () => {
    const { fetch, calls } = scriptedFetch([{ status: 307, headers: { location: 'http://elsewhere.test/' } }])
    const error = await client({ fetch })
      .fundTrade('tr_1')
      .catch((e) => e)
    expect(error).toMatchObject({ status: 307, code: 'http_307' })
    expect(calls).toHaveLength(1)
  })

  it('refuses a base URL that is not http(s)', () => {
    expect(() => client({ baseUrl: 'ftp://platform.test' })).toThrow(/must be http/)
    expect(() => client({ baseUrl: 'not a url' })).toThrow(/not a URL/)
  })
})

describe('PartnerApiClient logging', () => {
  it('logs the environment and base URL once at construction, and one debug line per call without secrets', async () => {
    const server = await startRecordingServer({ secret: SECRET })
    try {
      const before = logLines.length
      // the client's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
      const own = taggedLogger([SECRET])
      const api = client({ baseUrl: server.url, env: 'live', clock: systemClock, logger: own.logger })
      await api.createTrade({ ...createRequest, buyer_phone: '+4917600000042', title: 'marker-title-xyz' })
      await api.getTrade('tr_1')
      const signatures = server.requests.map((request) => String(request.headers['x-partner-signature']))
      rememberSecret(...signatures)

      const written = logLines.slice(before).join('')
      const entries = own.entries()
      expect(entries).toHaveLength(3)
      expect(entries[0]).toMatchObject({
        level: 30,
        msg: 'partner api client ready',
        env: 'live',
        baseUrl: server.url,
      })
      expect(entries[1]).toMatchObject({
        level: 20,
        msg: 'partner api call',
        method: 'POST',
        path: '/api/partner/v1/trades/',
        status: 200,
        attempt: 1,
      })
      expect(entries[1]).toHaveProperty('durationMs')
      expect(entries[2]).toMatchObject({ method: 'GET', path: '/api/partner/v1/trades/tr_1/', status: 200 })
      for (const forbidden of [SECRET, ...signatures, 'marker-title-xyz', '+4917600000042']) {
        expect(written).not.toContain(forbidden)
      }
    } finally {
      await server.close()
    }
  })
})
