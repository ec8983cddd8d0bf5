// The built-in forwarder against a real local HTTP receiver, its requests verified with the
// `standardwebhooks` package (the specification's reference library for JavaScript, not our code).
import { randomBytes } from 'node:crypto'
import diagnosticsChannel from 'node:diagnostics_channel'
import { getEventListeners } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { Webhook, WebhookVerificationError } from 'standardwebhooks'
import { afterEach, describe, expect, it, vi } from 'vitest'
import {
  createForwarder,
  decodeWebhookSecret,
  ForwardError,
  MAX_DRAINED_BYTES,
  signStandardWebhook,
} from '../src/reactions/forwarder.js'
import { forwardedPayload, type HandlerContext, type ReactionEvent } from '../src/reactions/reaction-event.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { MiB } from './helpers/endless-answer.js'
import { FakeClock } from './helpers/fake-clock.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { PACKAGE_VERSION } from './helpers/package-version.js'
import { eventually } from './helpers/reconcile-poller.js'
import { forwarderUnderDispatcher } from './helpers/forwarder-under-dispatcher.js'
import { useTestDatabase } from './helpers/test-database.js'

const SECRET = `whsec_${randomBytes(32).toString('base64')}`
const OTHER_SECRET = `whsec_${randomBytes(32).toString('base64')}`
rememberSecret(SECRET.slice('whsec_'.length), OTHER_SECRET.slice('whsec_'.length))

const logger = testLogger([SECRET.slice('whsec_'.length)])

const event: ReactionEvent = {
  eventId: '0b7e7c1e-4c8a-4a51-9d0e-5a3c2f1d9e01',
  type: 'trade.funded',
  orderId: 42,
  externalReference: 'order-ref-private-1234',
  tradeId: 'trd_abc123',
  from: 'created',
  to: 'funded',
  source: 'webhook',
  sequence: 2,
  occurredAt: new Date('2026-11-23T01:02:03.456Z'),
}

function context(overrides: Partial<HandlerContext> = {}): HandlerContext {
  return { signal: new AbortController().signal, attempt: 1, logger, ...overrides }
}

const receivers: ForwardReceiver[] = []
async function receiver(...args: Parameters<typeof startForwardReceiver>): Promise<ForwardReceiver> {
  const started = await startForwardReceiver(...args)
  receivers.push(started)
  return started
}
afterEach(async () => {
  await Promise.all(receivers.splice(0).map((r) => r.close()))
})

/** The error a forward attempt threw, failing the test when it did not throw. */
async function failureOf(attempt: Promise<void>): Promise<ForwardError> {
  const error = await attempt.then(
    () => undefined,
    (thrown: unknown) => thrown,
  )
  expect(error, 'the forward attempt throws').toBeInstanceOf(ForwardError)
  const forwardError = error as ForwardError
  // no body, secret or signature in what the dispatcher stores and logs
  for (const value of [SECRET.slice('whsec_'.length), event.externalReference, event.tradeId, 'v1,']) {
    expect(forwardError.message).not.toContain(value)
  }
  return forwardError
}

describe('signStandardWebhook', () => {
  it('matches the specification libraries’ test vector', () => {
    expect(
      signStandardWebhook(
        'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
        'msg_p5jXN8AQM9LWM0D4loKWxJek',
        1614265330,
        '{"test": 2432232314}',
      ),
    ).toBe('v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=')
  })

  it('accepts only whsec_ and the padded base64 of at least 24 bytes', () => {
    expect(decodeWebhookSecret(`whsec_${Buffer.alloc(24, 7).toString('base64')}`)).toHaveLength(24)
    expect(decodeWebhookSecret(`whsec_${Buffer.alloc(23, 7).toString('base64')}`)).toBeUndefined()
    expect(decodeWebhookSecret(Buffer.alloc(32, 7).toString('base64'))).toBeUndefined()
    expect(decodeWebhookSecret('whsec_not base64 at all, but long enough!!')).toBeUndefined()
    expect(decodeWebhookSecret(`whsec_${Buffer.alloc(32, 7).toString('base64').replace(/=+$/, '')}`)).toBeUndefined()
    expect(() => signStandardWebhook('whsec_short', 'id', 1, '{}')).toThrow(/whsec_/)
  })
})

describe('the forwarder', () => {
  it('POSTs the event as a Standard Webhooks payload that the standardwebhooks library verifies', async () => {
    const target = await receiver()
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })

    await forward(event, context())

    expect(target.received).toHaveLength(1)
    const [request] = target.received
    expect(request!.method).toBe('POST')
    expect(request!.url).toBe('/hooks/escrow')
    expect(request!.headers['content-type']).toBe('application/json')
    expect(request!.headers['user-agent']).toBe(`partner-escrow/${PACKAGE_VERSION}`)
    expect(request!.headers['webhook-id']).toBe(event.eventId)
    expect(request!.headers['webhook-signature']).toMatch(/^v1,[A-Za-z0-9+/]{43}=$/)
    rememberSecret(request!.headers['webhook-signature']!.slice(3))
    const sentAt = Number(request!.headers['webhook-timestamp'])
    expect(Math.abs(sentAt - Date.now() / 1000)).toBeLessThan(300)

    // verify() checks the signature and the timestamp window, and returns the parsed body
    const verified = new Webhook(SECRET).verify(request!.rawBody, request!.headers)
    expect(verified).toEqual({
      type: 'trade.funded',
      timestamp: '2026-11-23T01:02:03.456Z',
      data: {
        event_id: event.eventId,
        order_id: 42,
        external_reference: 'order-ref-private-1234',
        trade_id: 'trd_abc123',
        from: 'created',
        to: 'funded',
        source: 'webhook',
        sequence: 2,
        occurred_at: '2026-11-23T01:02:03.456Z',
      },
    })
    expect(JSON.parse(request!.rawBody)).toEqual(forwardedPayload(event))
  })

  it('sends the same signed request through an injected fetch, headers and body as through its own pool', async () => {
    const target = await receiver()
    const seen: { redirect: RequestInit['redirect'] }[] = []
    const throughFetch: typeof fetch = (input, init) => {
      seen.push({ redirect: init?.redirect })
      return fetch(input, init)
    }
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000, fetch: throughFetch })

    await forward({ ...event, externalReference: 'order-ref-ünïcode-€' }, context())

    expect(seen).toHaveLength(1)
    expect(seen[0]!.redirect).toBe('manual')
    const [request] = target.received
    expect(request!.headers['webhook-id']).toBe(event.eventId)
    expect(request!.headers['content-type']).toBe('application/json')
    expect(Number(request!.headers['content-length'])).toBe(Buffer.byteLength(request!.rawBody))
    rememberSecret(request!.headers['webhook-signature']!.slice(3))
    const verified = new Webhook(SECRET).verify(request!.rawBody, request!.headers) as { data: { external_reference: string } }
    expect(verified.data.external_reference).toBe('order-ref-ünïcode-€')
  })

  // Standard Webhooks' rotation: several signatures, space-separated, any of which a receiver checks. With one
  // secret only, moving the receiver to a new one had a gap in which every event failed its check
  it('signs with each of several secrets (a rotation): a receiver on either one verifies every request', async () => {
    const target = await receiver()
    const third = `whsec_${randomBytes(32).toString('base64')}`
    rememberSecret(third.slice('whsec_'.length))
    await createForwarder({ url: target.url, secret: `${SECRET} ${OTHER_SECRET}`, timeoutMs: 5_000 })(event, context())
    await createForwarder({ url: target.url, secret: `${OTHER_SECRET},${SECRET}`, timeoutMs: 5_000 })(event, context())
    for (const request of target.received) {
      const signatures = request.headers['webhook-signature']!.split(' ')
      expect(signatures).toHaveLength(2)
      for (const signature of signatures) rememberSecret(signature.slice(3))
      expect(new Webhook(SECRET).verify(request.rawBody, request.headers)).toEqual(forwardedPayload(event))
      expect(new Webhook(OTHER_SECRET).verify(request.rawBody, request.headers)).toEqual(forwardedPayload(event))
      expect(() => new Webhook(third).verify(request.rawBody, request.headers)).toThrow(WebhookVerificationError)
    }
    expect(() => createForwarder({ url: target.url, secret: `${SECRET} whsec_short`, timeoutMs: 5_000 })).toThrow(/whsec_/)
  })

  it('sends requests that fail verification under another secret or with a changed body', async () => {
    const target = await receiver()
    await createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })(event, context())
    const [request] = target.received

    expect(() => new Webhook(OTHER_SECRET).verify(request!.rawBody, request!.headers)).toThrow(
      WebhookVerificationError,
    )
    const tampered = request!.rawBody.replace('"sequence":2', '"sequence":3')
    expect(tampered).not.toBe(request!.rawBody)
    expect(() => new Webhook(SECRET).verify(tampered, request!.headers)).toThrow(WebhookVerificationError)
  })

  it('signs the body as the UTF-8 bytes it sends, whatever characters the event holds', async () => {
    const target = await receiver()
    const foreign = { ...event, externalReference: 'Bestellung-Müller-東京-😀', tradeId: 'trd_ñ' }
    await createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })(foreign, context())

    const [request] = target.received
    expect(Number(request!.headers['content-length'])).toBe(Buffer.byteLength(request!.rawBody))
    expect(Buffer.byteLength(request!.rawBody)).toBeGreaterThan(request!.rawBody.length)
    const verified = new Webhook(SECRET).verify(request!.rawBody, request!.headers) as { data: { external_reference: string } }
    expect(verified.data.external_reference).toBe('Bestellung-Müller-東京-😀')
  })

  it('keeps the webhook-id of an event on every attempt and signs each attempt with a fresh timestamp', async () => {
    const clock = new FakeClock(Date.now())
    const target = await receiver((_request, count) => (count === 1 ? 503 : 200))
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000, clock })

    const first = await failureOf(forward(event, context({ attempt: 1 })))
    expect(first).toMatchObject({ code: 'forward_failed', status: 503 })
    await clock.advance(90_000)
    await forward(event, context({ attempt: 2 }))

    const [one, two] = target.received
    expect(two!.headers['webhook-id']).toBe(one!.headers['webhook-id'])
    expect(Number(two!.headers['webhook-timestamp']) - Number(one!.headers['webhook-timestamp'])).toBe(90)
    expect(two!.headers['webhook-signature']).not.toBe(one!.headers['webhook-signature'])
    expect(two!.rawBody).toBe(one!.rawBody)
    for (const request of [one!, two!]) {
      expect(() => new Webhook(SECRET).verify(request.rawBody, request.headers)).not.toThrow()
    }
  })

  it('gives each event its own webhook-id', async () => {
    const target = await receiver()
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })
    const next = { ...event, eventId: '5f0c6b3a-1d2e-4f60-8a7b-9c0d1e2f3a4b', sequence: 3, to: 'delivered' }
    await forward(event, context())
    await forward({ ...next, type: 'trade.delivered' }, context())
    expect(target.received.map((request) => request.headers['webhook-id'])).toEqual([event.eventId, next.eventId])
  })

  it('throws forward_failed with the status when the receiver answers 500', async () => {
    const target = await receiver(() => 500)
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })
    const error = await failureOf(forward(event, context()))
    expect(error).toMatchObject({ code: 'forward_failed', status: 500 })
    expect(error.message).toContain('answered 500')
  })

  describe.each([
    ['its own pool', undefined],
    ['an injected fetch', globalThis.fetch],
  ])('Retry-After, through %s', (_path, fetchImplementation) => {
    // a whole second, so that an HTTP-date names the same instant
    const start = Date.parse('2026-11-28T20:00:00Z')
    const forwarderAt = (url: string) => createForwarder({ url, secret: SECRET, timeoutMs: 5_000, clock: new FakeClock(start), fetch: fetchImplementation })

    it('carries a 429’s wait in seconds on the error, and says until when', async () => {
      const target = await receiver(() => ({ status: 429, headers: { 'retry-after': '120' } }))
      const error = await failureOf(forwarderAt(target.url)(event, context()))
      expect(error).toMatchObject({ code: 'forward_failed', status: 429, retryAfterMs: 120_000 })
      expect(error.message).toBe(`the forward receiver ${new URL(target.url).origin} answered 429 and asked to wait 120 s (Retry-After), until 2026-11-28T20:02:00.000Z`)
    })

    it('reads a 503’s HTTP-date as the wait until it', async () => {
      const target = await receiver(() => ({ status: 503, headers: { 'retry-after': 'Sat, 28 Nov 2026 20:10:00 GMT' } }))
      const error = await failureOf(forwarderAt(target.url)(event, context()))
      expect(error).toMatchObject({ status: 503, retryAfterMs: 600_000 })
      expect(error.message).toContain('answered 503 and asked to wait 600 s (Retry-After), until 2026-11-28T20:10:00.000Z')
    })

    it('honours it on any failed answer, a 500 too: the answer is retried, and the receiver asked for a wait', async () => {
      const target = await receiver(() => ({ status: 500, headers: { 'retry-after': '30' } }))
      expect(await failureOf(forwarderAt(target.url)(event, context()))).toMatchObject({ status: 500, retryAfterMs: 30_000 })
    })

    it.each([['-5'], ['1.5'], ['soon'], ['2026-11-28T20:10:00Z'], [['60', '120']]])(
      'ignores %j, neither whole seconds nor an HTTP-date, and says so without repeating it',
      async (value) => {
        const target = await receiver(() => ({ status: 429, headers: { 'retry-after': value } }))
        const error = await failureOf(forwarderAt(target.url)(event, context()))
        expect(error).toMatchObject({ status: 429, retryAfterMs: undefined })
        expect(error.message).toBe(`the forward receiver ${new URL(target.url).origin} answered 429; its Retry-After is neither whole seconds nor an HTTP-date, and is ignored`)
      },
    )

    it("names the receiver's clock when it refuses an event and its Date is more than a minute from this machine's", async () => {
      // this machine's clock 600 s ahead of the receiver's: its webhook-timestamp is stale to the receiver (a Date's
      // whole second is read as its middle: 601 s before this machine's time reads 600 s)
      const behind = new Date(start - 601_000).toUTCString()
      const refusing = await receiver(() => ({ status: 400, headers: { date: behind } }))
      const error = await failureOf(forwarderAt(refusing.url)(event, context()))
      expect(error).toMatchObject({ code: 'forward_failed', status: 400 })
      expect(error.message).toBe(
        `the forward receiver ${new URL(refusing.url).origin} answered 400; the receiver's clock is 600 s behind this machine's (its Date header): ` +
          "each event's webhook-timestamp is this machine's time, which receivers refuse when it is more than 5 minutes off: check this machine's clock (NTP), or the receiver's",
      )
      // a Date within a minute, an answer that is not a refusal, or no readable Date: nothing said of clocks
      for (const [status, date] of [[401, new Date(start + 30_000).toUTCString()], [500, behind], [403, 'yesterday']] as const) {
        const other = await receiver(() => ({ status, headers: { date } }))
        expect((await failureOf(forwarderAt(other.url)(event, context()))).message).not.toContain('clock')
      }
    })

    it('says a wait too long for a date as longer than a day, without one', async () => {
      const target = await receiver(() => ({ status: 429, headers: { 'retry-after': '9'.repeat(20) } }))
      const error = await failureOf(forwarderAt(target.url)(event, context()))
      expect(error.retryAfterMs).toBe(1e23)
      expect(error.message).toMatch(/answered 429 and asked to wait longer than a day \(Retry-After\)$/)
    })
  })

  it('sends the user and password of the URL as Basic authorization, and names the receiver without them', async () => {
    // a receiver behind Basic authentication, as an internal endpoint often is
    const expected = `Basic ${Buffer.from('escrow:p@ss word:1').toString('base64')}`
    const target = await receiver((request) => (request.headers.authorization === expected ? 204 : 401))
    const url = new URL(target.url)
    url.username = 'escrow'
    url.password = 'p@ss word:1'
    const forward = createForwarder({ url: url.toString(), secret: SECRET, timeoutMs: 5_000 })

    await forward(event, context())

    expect(target.received).toHaveLength(1)
    expect(target.received[0]!.headers.authorization).toBe(expected)
    expect(target.received[0]!.url).toBe('/hooks/escrow')
    const unauthorized = await receiver(() => 401)
    const refused = new URL(unauthorized.url)
    refused.username = 'escrow'
    refused.password = 'p@ss word:1'
    const error = await failureOf(createForwarder({ url: refused.toString(), secret: SECRET, timeoutMs: 5_000 })(event, context()))
    expect(error.message).toContain(`answered 401`)
    expect(error.message).not.toContain('escrow:')
    expect(error.message).not.toContain('ss%20word')
  })

  it('takes a 2xx as the answer however long its body: drained up to 1 MiB, then its connection closed', async () => {
    const target = await receiver(() => ({ status: 200, bodyBytes: 256 * MiB }))
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 60_000 })

    await forward(event, context())

    expect(target.received).toHaveLength(1)
    // what was written is the little drained plus what the two sockets' kernel buffers hold
    await expect.poll(() => target.bodyBytesWritten.length).toBe(1)
    expect(target.bodyBytesWritten[0]).toBeLessThan(32 * MiB)
    // a body of up to the bound is drained to its end and the connection kept for the next events (undici's
    // pool opens a second one on the second request, then takes turns)
    const short = await receiver(() => ({ status: 200, bodyBytes: MAX_DRAINED_BYTES }))
    const keeps = createForwarder({ url: short.url, secret: SECRET, timeoutMs: 60_000 })
    for (let sequence = 1; sequence <= 6; sequence++) await keeps({ ...event, sequence }, context())
    expect(short.connections).toBeLessThanOrEqual(2)
  })

  it('takes the status of an answer whose body is still coming at the deadline: 2xx done, 500 failed, not timed out', async () => {
    const clock = new FakeClock(Date.now())
    for (const [status, outcome] of [
      [200, undefined],
      [500, 'forward_failed'],
    ] as const) {
      const target = await receiver(() => ({ status, bodyStalls: true }))
      const headersReceived = new Promise<void>((resolve) => {
        const onHeaders = () => {
          diagnosticsChannel.unsubscribe('undici:request:headers', onHeaders)
          resolve()
        }
        diagnosticsChannel.subscribe('undici:request:headers', onHeaders)
      })
      const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 10_000, clock })
      const attempt = forward(event, context()).then(
        () => undefined,
        (error: unknown) => (error as ForwardError).code,
      )
      // the deadline passes once the forwarder has the answer's head (undici reports it on this channel)
      await headersReceived
      await clock.advance(10_000)
      expect(await attempt, `answered ${status}`).toBe(outcome)
      expect(clock.pendingSleepers).toBe(0)
    }
  })

  it('treats a 302 as a failure and never follows it', async () => {
    const elsewhere = await receiver()
    const target = await receiver(() => ({ status: 302, location: elsewhere.url }))
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })

    const error = await failureOf(forward(event, context()))

    expect(error).toMatchObject({ code: 'forward_failed', status: 302 })
    expect(error.message).toContain('redirects are not followed')
    expect(target.received).toHaveLength(1)
    expect(elsewhere.received).toHaveLength(0)
  })

  it('takes the final answer after an interim 1xx, and no final answer as unreachable, never the 103 as a status', async () => {
    const answered = await receiver(() => ({ earlyHintsThen: 204 }))
    await createForwarder({ url: answered.url, secret: SECRET, timeoutMs: 5_000 })(event, context())

    const cut = await receiver(() => ({ earlyHintsThen: 'close' }))
    const error = await failureOf(createForwarder({ url: cut.url, secret: SECRET, timeoutMs: 5_000 })(event, context()))
    expect(error.code).toBe('forward_unreachable')
    expect(error.status).toBeUndefined()
    // the message names the receiver, whose port may hold the digits 103
    expect(error.message.replace(new URL(cut.url).origin, '<receiver>')).not.toMatch(/\b103\b/)
  })

  it('throws forward_timeout when the receiver does not answer within the timeout', async () => {
    const clock = new FakeClock(Date.now())
    const target = await receiver(() => 'hang')
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 10_000, clock })

    // failureOf listens at once: the attempt rejects while the clock advances
    const failure = failureOf(forward(event, context()))
    await target.waitFor(1)
    await clock.advance(10_000)

    expect(await failure).toMatchObject({ code: 'forward_timeout' })
  })

  it('times out each of several attempts at its own deadline, and leaves no timer once none is waiting', async () => {
    const clock = new FakeClock(Date.now())
    const target = await receiver(() => 'hang')
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 10_000, clock })

    const first = failureOf(forward(event, context()))
    await target.waitFor(1)
    await clock.advance(4_000)
    let secondEnded = false
    const second = failureOf(forward({ ...event, sequence: 3 }, context())).finally(() => (secondEnded = true))
    await target.waitFor(2)

    await clock.advance(6_000)
    expect(await first).toMatchObject({ code: 'forward_timeout' })
    expect(secondEnded, 'the second attempt has 4 s left').toBe(false)
    await clock.advance(4_000)
    expect(await second).toMatchObject({ code: 'forward_timeout' })
    expect(clock.pendingSleepers).toBe(0)
  })

  it('leaves no timer once its attempts are answered', async () => {
    const clock = new FakeClock(Date.now())
    const target = await receiver(() => 204)
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 10_000, clock })

    await Promise.all([1, 2, 3].map((sequence) => forward({ ...event, sequence }, context())))

    expect(target.received).toHaveLength(3)
    expect(clock.pendingSleepers).toBe(0)
  })

  it('sends nothing when the handler’s signal is aborted before the attempt', async () => {
    const target = await receiver(() => 204)
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })
    const controller = new AbortController()
    controller.abort(new Error('shutting down'))

    expect(await failureOf(forward(event, context({ signal: controller.signal })))).toMatchObject({ code: 'forward_aborted' })
    await forward({ ...event, eventId: 'the-next-event' }, context())
    expect(target.received.map((request) => request.headers['webhook-id'])).toEqual(['the-next-event'])
  })

  it('times out on the real clock too', async () => {
    const target = await receiver(() => 'hang')
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 200 })
    const error = await failureOf(forward(event, context()))
    expect(error).toMatchObject({ code: 'forward_timeout' })
    expect(error.message).toContain('200 ms')
  })

  // found by an outside review: with the deadlines on the wall clock, a clock stepped back 120 s while two calls
  // waited on a hung receiver made them time out after 130 s instead of 10 s
  it('times out at its deadline when the wall clock is stepped back during the attempts', async () => {
    const target = await receiver(() => 'hang')
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 1_000 })
    const started = performance.now()
    const attempts = [1, 2].map((sequence) => failureOf(forward({ ...event, sequence }, context())))
    await target.waitFor(2)
    const realNow = Date.now.bind(Date)
    const stepped = vi.spyOn(Date, 'now').mockImplementation(() => realNow() - 120_000)
    try {
      const outcome = await Promise.race([
        Promise.all(attempts),
        new Promise<'still waiting'>((resolve) => setTimeout(() => resolve('still waiting'), 5_000)),
      ])
      expect(outcome, 'both attempts time out within their 1 s, not 121 s').not.toBe('still waiting')
      for (const error of outcome as ForwardError[]) expect(error).toMatchObject({ code: 'forward_timeout' })
      expect(performance.now() - started).toBeLessThan(5_000)
    } finally {
      stepped.mockRestore()
    }
  })

  it('stops when the handler’s signal is aborted (lease ended, shutdown)', async () => {
    const target = await receiver(() => 'hang')
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 60_000 })
    const controller = new AbortController()

    const failure = failureOf(forward(event, context({ signal: controller.signal })))
    await target.waitFor(1)
    controller.abort(new Error('shutting down'))

    expect(await failure).toMatchObject({ code: 'forward_aborted' })
  })

  it('stops every attempt on its way when their shared signal is aborted, and leaves nothing listening on it', async () => {
    const target = await receiver(() => 'hang')
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 60_000 })
    const controller = new AbortController()
    const other = new AbortController()

    const stopped = [1, 2, 3].map((sequence) => failureOf(forward({ ...event, sequence }, context({ signal: controller.signal }))))
    const going = forward({ ...event, sequence: 4 }, context({ signal: other.signal })).then(
      () => 'answered',
      (error: unknown) => (error as ForwardError).code,
    )
    await target.waitFor(4)
    controller.abort(new Error('shutting down'))

    for (const failure of await Promise.all(stopped)) expect(failure).toMatchObject({ code: 'forward_aborted' })
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0)
    // the attempt under another signal runs on until its own signal stops it
    expect(getEventListeners(other.signal, 'abort')).toHaveLength(1)
    other.abort(new Error('lease ended'))
    expect(await going).toBe('forward_aborted')
    expect(getEventListeners(other.signal, 'abort')).toHaveLength(0)
  })

  it('ends every attempt: nothing left listening on the handler’s signal, connections kept alive', async () => {
    // every third answer a 500 with a body of 100 kB, which the forwarder drains and does not read
    const target = await receiver((_request, count) => (count % 3 === 0 ? { status: 500, body: 'x'.repeat(100_000) } : 204))
    const forward = createForwarder({ url: target.url, secret: SECRET, timeoutMs: 5_000 })
    const signal = new AbortController().signal
    for (let sequence = 1; sequence <= 12; sequence++) {
      await forward({ ...event, sequence }, context({ signal })).catch((error: unknown) => {
        expect(error).toMatchObject({ code: 'forward_failed', status: 500 })
      })
    }
    expect(target.received).toHaveLength(12)
    expect(getEventListeners(signal, 'abort')).toHaveLength(0)
    // an attempt's end aborts its own request's signal, after the answer is drained: the connections stay open
    // (undici's pool opens a second one on the second request, then takes turns)
    expect(target.connections).toBeLessThanOrEqual(2)
  })

  it('throws forward_unreachable when nothing listens, naming the receiver by origin only', async () => {
    const closed = http.createServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
    const { port } = closed.address() as AddressInfo
    await new Promise<void>((resolve) => closed.close(() => resolve()))
    const url = `http://127.0.0.1:${port}/hooks/escrow?token=a-token-in-the-query-0001`
    const forward = createForwarder({ url, secret: SECRET, timeoutMs: 5_000 })

    const error = await failureOf(forward(event, context()))

    expect(error).toMatchObject({ code: 'forward_unreachable' })
    expect(error.message).toContain(`http://127.0.0.1:${port}`)
    expect(error.message).toContain('ECONNREFUSED')
    expect(error.message).not.toContain('a-token-in-the-query')
  })

  it('refuses a secret that is not whsec_<base64 of 24+ bytes> and a URL that is not http(s)', () => {
    const plain = 'plain-secret-of-enough-length-000'
    expect(() => createForwarder({ url: 'http://127.0.0.1/', secret: plain, timeoutMs: 1 })).toThrow(/whsec_/)
    expect(() => createForwarder({ url: 'ftp://127.0.0.1/', secret: SECRET, timeoutMs: 1 })).toThrow(/http/)
  })

  // A fork's second target (createForwarder in partner-handlers.ts) is set up in code, past config.ts's checks of
  // FORWARD_*: its own refusals say what is wrong with a code, as the start-up's line, and quote neither value.
  it('refuses its settings with a code, quoting neither the URL nor the secret', () => {
    const refusals: [string, () => unknown][] = [
      ['forward_url_invalid', () => createForwarder({ url: 'ftp://127.0.0.1/', secret: SECRET, timeoutMs: 1 })],
      ['forward_url_invalid', () => createForwarder({ url: 'erp.internal/hook?token=t0ken-in-the-url', secret: SECRET, timeoutMs: 1 })],
      ['forward_secret_invalid', () => createForwarder({ url: 'http://127.0.0.1/', secret: 'plain-secret-of-enough-length-000', timeoutMs: 1 })],
      ['forward_secret_invalid', () => createForwarder({ url: 'http://127.0.0.1/', secret: '', timeoutMs: 1 })],
      ['forward_timeout_invalid', () => createForwarder({ url: 'http://127.0.0.1/', secret: SECRET, timeoutMs: 0 })],
      ['forward_timeout_invalid', () => createForwarder({ url: 'http://127.0.0.1/', secret: SECRET, timeoutMs: Number.NaN })],
    ]
    for (const [code, refused] of refusals) {
      expect(refused).toThrow(expect.objectContaining({ name: 'ReactionSetupError', code, message: expect.stringMatching(new RegExp(` \\[${code}\\]$`)) }))
      expect(refused).not.toThrow(/t0ken-in-the-url|plain-secret/)
    }
  })

  it('is registered with its own timeout, FORWARD_TIMEOUT_MS or the one it was made with', () => {
    const forward = createForwarder({ url: 'http://127.0.0.1/', secret: SECRET, timeoutMs: 7_000 })
    expect(createReactionRegistry().on('trade.*', 'erp-forwarder', forward).timeoutOf('erp-forwarder')).toBe(7_000)
    expect(createReactionRegistry().on('trade.*', 'erp-forwarder', forward, { timeoutMs: 2_000 }).timeoutOf('erp-forwarder')).toBe(2_000)
  })
})

// The wait a receiver asks for, as the dispatcher keeps it: the job's run_at and last error, read from the
// database. The clock is fake: run_at is exact, and nothing depends on the machine's speed.
describe('the forwarder’s retries under the dispatcher', () => {
  const database = useTestDatabase()
  const forwarding = forwarderUnderDispatcher(database, { secret: SECRET, logger, referencePrefix: 'retry-after' })
  const { settings, firstBackoffMs, idle, jobState } = forwarding

  /** A dispatcher running the forwarder to `answer`'s receiver, and an order moved to created: its one event. */
  const forwardOneEvent = async (answer: Parameters<typeof startForwardReceiver>[0]) => {
    const target = await receiver(answer)
    return { target, orderId: await forwarding.forwardOneEvent(target.url) }
  }
  /** The order's forwarder job once it has `attempts` attempts and waits for the next. */
  const waitingJob = (orderId: number, attempts: number) => forwarding.jobAfter(orderId, attempts, 'pending')

  it('waits out a 429’s Retry-After in seconds, then a 503’s HTTP-date, each attempt counted', async () => {
    const startedAt = forwarding.clock.now()
    const secondAt = startedAt + 120_000
    const asked = new Date(secondAt + 600_000)
    const { target, orderId } = await forwardOneEvent((_request, count) =>
      count === 1
        ? { status: 429, headers: { 'retry-after': '120' } }
        : { status: 503, headers: { 'retry-after': asked.toUTCString() } },
    )

    // the first attempt (the stream's): not before the 120 s asked for, though the backoff was 7.5 s
    const first = await waitingJob(orderId, 1)
    expect(first.runAt).toBe(startedAt + 120_000)
    expect(first.lastError).toContain(`answered 429 and asked to wait 120 s (Retry-After), until ${new Date(startedAt + 120_000).toISOString()}`)

    // just before it the job is not due; at it, the job loop's attempt is answered 503 until the date
    await idle()
    await forwarding.clock.advance(119_000)
    await idle()
    expect(target.received).toHaveLength(1)
    await forwarding.clock.advance(1_000)
    const second = await waitingJob(orderId, 2)
    expect(target.received).toHaveLength(2)
    expect(second.runAt).toBe(asked.getTime())
    expect(second.lastError).toContain(`answered 503 and asked to wait 600 s (Retry-After), until ${asked.toISOString()}`)

    // a wait asked for is still an attempt: the third (REACTION_MAX_ATTEMPTS here) answered so is the last
    await idle()
    await forwarding.clock.advance(600_000)
    await eventually(async () => (await jobState(orderId))?.state === 'failed', 'the job is failed after its last attempt')
    expect(await jobState(orderId)).toMatchObject({ state: 'failed', attempts: settings.maxAttempts })
    expect(target.received).toHaveLength(3)
  })

  it.each([
    ['garbage', 'soon'],
    ['a negative number', '-5'],
    ['a wait shorter than the backoff', '1'],
  ])('retries after the backoff when the Retry-After is %s', async (_case, value) => {
    const startedAt = forwarding.clock.now()
    const { orderId } = await forwardOneEvent(() => ({ status: 429, headers: { 'retry-after': value } }))
    const job = await waitingJob(orderId, 1)
    expect(job.runAt).toBe(startedAt + firstBackoffMs)
  })

  it.each([
    ['99999999999 seconds', '99999999999'],
    ['a date in the year 9999', 'Fri, 31 Dec 9999 23:59:59 GMT'],
    ['more seconds than a date holds', '9'.repeat(30)],
  ])('waits at most the backoff’s cap when the Retry-After asks for %s, and says so', async (_case, value) => {
    const startedAt = forwarding.clock.now()
    const { orderId } = await forwardOneEvent(() => ({ status: 503, headers: { 'retry-after': value } }))
    const job = await waitingJob(orderId, 1)
    expect(job.runAt).toBe(startedAt + settings.backoff.capS * 1000)
    expect(job.lastError).toContain('asked to wait')
    expect(job.lastError).toMatch(/\(retried after 1000 s instead, the longest wait between attempts\)$/)
  })
})
