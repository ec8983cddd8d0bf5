// The transport's retry rules on their own (the client's tests cover them through the endpoints): what is
// retried, how long it waits, and what is never sent twice. Waits run on a FakeClock, so nothing sleeps.
import { describe, expect, it } from 'vitest'
import { z } from 'zod'
import { isOutcomeUnknown, PartnerApiError, PartnerNotSentError } from '../src/partner-api/partner-api-error.js'
import { PartnerApiTransport, type TransportOptions } from '../src/partner-api/partner-api-transport.js'
import { scriptedFetch as echoingFetch } from './helpers/partner-api-fake-fetch.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { type FetchStep, scriptedFetch, settleWithClock } from './helpers/partner-api-fake-fetch.js'

const TIMEOUT_MS = 9_999
const SECRET = 'apisec_transport_test_3e8a1f6c'
const record = z.looseObject({ id: z.string() })
const ok: FetchStep = { status: 200, body: { id: 'x' } }

function transport(script: FetchStep[], overrides: Partial<TransportOptions> = {}) {
  const clock = new FakeClock(Date.parse('2026-01-01T00:00:00Z'))
  const scripted = scriptedFetch(script)
  const sender = new PartnerApiTransport({
    baseUrl: 'http://platform.test',
    keyId: 'pk_transport',
    secret: SECRET,
    timeoutMs: TIMEOUT_MS,
    clock,
    logger: testLogger([SECRET]),
    random: () => 0.5,
    fetch: scripted.fetch,
    ...overrides,
  })
  const waits = () => clock.sleeps.filter((ms) => ms !== TIMEOUT_MS)
  return { sender, clock, calls: scripted.calls, waits }
}

describe('PartnerApiTransport retry rules', () => {
  it('gives a GET four attempts by default, then throws the last 5xx', async () => {
    const { sender, clock, calls, waits } = transport(Array(5).fill({ status: 503 }))
    const error = await settleWithClock(clock, sender.call('GET', '/x/', undefined, record), TIMEOUT_MS).catch(
      (e) => e,
    )
    expect(error).toBeInstanceOf(PartnerApiError)
    expect(error).toMatchObject({ status: 503, code: 'http_503' })
    expect(calls).toHaveLength(4)
    // 200 ms doubling, equal jitter at random 0.5: three quarters of each step
    expect(waits()).toEqual([150, 300, 600])
  })

  it.each([
    ['a 500', { status: 500 }],
    ['a 502 from a proxy', { status: 502, body: '<html>Bad gateway</html>' }],
    ['a 429 without Retry-After', { status: 429 }],
    ['a 503 with an unreadable Retry-After', { status: 503, headers: { 'retry-after': 'soon' } }],
    ['a 503 with a negative Retry-After', { status: 503, headers: { 'retry-after': '-5' } }],
    ['a 429 with a fractional Retry-After', { status: 429, headers: { 'retry-after': '1.5' } }],
    // a date the calendar does not have is garbage too: it was read as the day after (1 March 2025, past: at once)
    ['a 503 whose Retry-After is 29 February of a common year', { status: 503, headers: { 'retry-after': 'Sat, 29 Feb 2025 00:00:00 GMT' } }],
    ['a 503 whose Retry-After is 31 February', { status: 503, headers: { 'retry-after': 'Mon, 31 Feb 2025 00:00:00 GMT' } }],
    ['a reset connection', { networkError: 'ECONNRESET' }],
  ] as [string, FetchStep][])('retries a GET after %s on the backoff', async (_kind, first) => {
    const { sender, clock, calls, waits } = transport([first, ok])
    expect(await settleWithClock(clock, sender.call('GET', '/x/', undefined, record), TIMEOUT_MS)).toEqual({
      id: 'x',
    })
    expect(calls).toHaveLength(2)
    expect(waits()).toEqual([150])
  })

  it('waits out a Retry-After equal to its limit, and throws at once above it', async () => {
    const limit = { retry: { maxRetryAfterMs: 10_000 } }
    const within = transport([{ status: 429, headers: { 'retry-after': '10' } }, ok], limit)
    await settleWithClock(within.clock, within.sender.call('GET', '/x/', undefined, record), TIMEOUT_MS)
    expect(within.waits()).toEqual([10_000])

    const beyond = transport([{ status: 429, headers: { 'retry-after': '11' } }, ok], limit)
    const error = await beyond.sender.call('GET', '/x/', undefined, record).catch((e) => e)
    expect(error).toMatchObject({ status: 429 })
    expect(beyond.calls).toHaveLength(1)
    expect(beyond.waits()).toEqual([])
  })

  it.each([
    ['a 429 with Retry-After: 1', { status: 429, headers: { 'retry-after': '1' } }],
    ['a 500', { status: 500 }],
    ['a reset connection', { networkError: 'ECONNRESET' }],
  ] as [string, FetchStep][])('never sends a POST twice, even after %s', async (_kind, first) => {
    const { sender, calls, waits } = transport([first, ok])
    await expect(sender.call('POST', '/x/', {}, record)).rejects.toThrow()
    expect(calls).toHaveLength(1)
    expect(waits()).toEqual([])
  })

  it.each([400, 401, 403, 404, 409, 422])('does not retry a GET answered %i', async (status) => {
    const { sender, calls } = transport([{ status }, ok])
    await expect(sender.call('GET', '/x/', undefined, record)).rejects.toMatchObject({ status })
    expect(calls).toHaveLength(1)
  })
})


// found from outside: a gateway that quoted the request it refused put our signature, nonce, key id and signed body
// into the error's message, which the poller logs at warn level and the CLI prints
describe('an error answer that echoes the request', () => {
  it('keeps the signature, the nonce, the key id and the body out of the error, and the rest of the words in', async () => {
    const { fetch, calls } = echoingFetch(({ headers, body }) => ({
      status: 400,
      body: {
        error: {
          code: `E_${headers['X-Partner-Signature']}`,
          message: `sig=sha256=${headers['X-Partner-Signature']} key=${headers['X-Partner-Key-Id']} nonce=${headers['X-Partner-Nonce']} body=${body} earlier=${'ab'.repeat(32)} amount too small`,
        },
      },
    }))
    const { sender } = transport([], { fetch })
    const error = (await sender.call('POST', '/trades/', { title: 'A title of the trade', amount: '1.00' }, record).catch((e) => e)) as PartnerApiError
    expect(error).toBeInstanceOf(PartnerApiError)
    const [{ headers, body }] = calls as [(typeof calls)[number]]
    for (const value of [headers['X-Partner-Signature']!, headers['X-Partner-Nonce']!, 'pk_transport', body!, 'A title of the trade']) {
      expect(error.message).not.toContain(value)
      expect(error.code).not.toContain(value)
    }
    expect(error.code).toBe('E_[from our request]')
    expect(error.message).toBe(
      'POST /api/partner/v1/trades/ answered 400 E_[from our request]: sig=sha256=[from our request] key=[from our request] nonce=[from our request] body=[from our request] earlier=[64 hex digits] amount too small',
    )
  })
})

describe("a Retry-After given as a date", () => {
  it("is read against the answer's Date: a platform 50 min ahead asking for 30 s is asked for 30 s", async () => {
    const { sender } = transport([
      { status: 429, headers: { date: 'Thu, 01 Jan 2026 00:50:00 GMT', 'retry-after': 'Thu, 01 Jan 2026 00:50:30 GMT' }, body: { error: { code: 'rate_limited', message: 'slow down' } } },
    ])
    const error = (await sender.call('POST', '/trades/', { title: 'x' }, record).catch((e) => e)) as PartnerApiError
    expect(error).toMatchObject({ status: 429, retryAfterMs: 30_000 })
  })
})

// found from outside: a key id with a character past U+00FF made every call fail in fetch before sending ("Cannot
// convert argument to a ByteString"), and the failure read as a request that may have gone out
describe('a header that cannot be sent', () => {
  it('fails the call as not sent, tried once, naming the header and the setting but not the value', async () => {
    for (const keyId of ['pk_€x', 'pk_\u{1F511}', 'pk_a\nb']) {
      const { sender } = transport([], { keyId, fetch: undefined, baseUrl: 'http://127.0.0.1:9' })
      const error = (await sender.call('POST', '/trades/', { title: 'A lamp' }, record).catch((e) => e)) as PartnerNotSentError
      expect(error, JSON.stringify(keyId)).toBeInstanceOf(PartnerNotSentError)
      expect(error).toMatchObject({ lasting: true })
      expect(error.message).toBe(
        'POST /api/partner/v1/trades/ was not sent: its X-Partner-Key-Id header (PARTNER_API_KEY_ID) holds a character a header cannot carry',
      )
      expect(isOutcomeUnknown(error)).toBe(false)
    }
  })
})
