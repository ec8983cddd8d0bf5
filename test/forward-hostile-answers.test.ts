// The forwarder against receivers that answer in ways a well-behaved one does not: 410 Gone (the Standard
// Webhooks word for "stop sending"), something that is not HTTP at all (a raw TCP server writes it), and a
// Retry-After too long to say in seconds. Each through the forwarder alone, on its own pool and through an
// injected fetch, and through the dispatcher, where the job's state and last error are what an operator reads.
import { randomBytes } from 'node:crypto'
import net, { type AddressInfo } from 'node:net'
import { afterEach, describe, expect, it } from 'vitest'
import { printable } from '../src/printable.js'
import { createForwarder, ForwardError } from '../src/reactions/forwarder.js'
import type { HandlerContext, ReactionEvent } from '../src/reactions/reaction-event.js'
import { FakeClock } from './helpers/fake-clock.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { taggedLogger } from './helpers/log-sink.js'
import { forwarderUnderDispatcher } from './helpers/forwarder-under-dispatcher.js'
import { useTestDatabase } from './helpers/test-database.js'

const SECRET = `whsec_${randomBytes(32).toString('base64')}`
// the forwarders' own lines: another file's in the same worker are not theirs (log-sink.ts, taggedLogger)
const own = taggedLogger([SECRET.slice('whsec_'.length)])
const logger = own.logger

const event: ReactionEvent = {
  eventId: '7d1f0a52-3b9e-4c11-8f2a-6e5d4c3b2a10',
  type: 'trade.funded',
  orderId: 42,
  externalReference: 'order-ref-private-5678',
  tradeId: 'trd_hostile1',
  from: 'created',
  to: 'funded',
  source: 'webhook',
  sequence: 2,
  occurredAt: new Date('2026-11-23T01:02:03.456Z'),
}

const context = (): HandlerContext => ({ signal: new AbortController().signal, attempt: 1, logger })

const PATHS = [
  ['its own pool', undefined],
  ['an injected fetch', globalThis.fetch],
] as const

const stops: (() => Promise<void>)[] = []
afterEach(async () => {
  await Promise.all(stops.splice(0).map((stop) => stop()))
})

async function receiver(...args: Parameters<typeof startForwardReceiver>): Promise<ForwardReceiver> {
  const started = await startForwardReceiver(...args)
  stops.push(() => started.close())
  return started
}

/**
 * A raw TCP server in place of the receiver: it reads each request to the end of its body (by its
 * content-length), then writes `answer`'s bytes as they are and leaves the connection to the forwarder.
 * `answer` undefined: it closes the connection without a byte.
 */
async function rawReceiver(answer: string | Buffer | undefined): Promise<{ url: string; requests: () => number }> {
  let requests = 0
  const sockets = new Set<net.Socket>()
  const server = net.createServer((socket) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    // the forwarder closes the connection once it gave up on the answer
    socket.on('error', () => {})
    let read = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => {
      read = Buffer.concat([read, chunk])
      const headEnd = read.indexOf('\r\n\r\n')
      if (headEnd < 0) return
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(read.subarray(0, headEnd).toString('latin1'))?.[1] ?? 0)
      if (read.length < headEnd + 4 + length) return
      read = read.subarray(headEnd + 4 + length)
      requests += 1
      if (answer === undefined) socket.destroy()
      else socket.write(answer)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  stops.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy()
        server.close(() => resolve())
      }),
  )
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks/escrow`, requests: () => requests }
}

/** The error a forward attempt threw, failing the test when it did not throw a ForwardError. */
async function failureOf(attempt: Promise<void>): Promise<ForwardError> {
  const error = await attempt.then(
    () => undefined,
    (thrown: unknown) => thrown,
  )
  expect(error, 'the forward attempt throws').toBeInstanceOf(ForwardError)
  const forwardError = error as ForwardError
  for (const value of [SECRET.slice('whsec_'.length), event.externalReference, event.tradeId, 'v1,']) {
    expect(forwardError.message).not.toContain(value)
  }
  return forwardError
}

// what a receiver sends that is not HTTP: a terminal's escape (retitle the window), a bidirectional override, a marker
const NOT_HTTP_MARKER = 'hostile-receiver-text-0042'
// llhttp's reason, in the words of the undici at hand (the pool's and fetch's are not the same release)
const PARSER_REASON = /^Response does not match the HTTP\/1\.1 protocol \([A-Za-z ,/]+\)( \(HPE_[A-Z_]+\))?$/
const BAD_ANSWERS = [
  ['a status line whose status is no number (HTTP/1.1 2OO WAT)', 'HTTP/1.1 2OO WAT\r\ncontent-length: 0\r\n\r\n', PARSER_REASON],
  ['headers of 200 kB', `HTTP/1.1 200 OK\r\nx-padding: ${'a'.repeat(200_000)}\r\n\r\n`, 'its headers are longer than undici takes (UND_ERR_HEADERS_OVERFLOW)'],
  ['no HTTP at all', `\u001b]0;${NOT_HTTP_MARKER}\u0007 \u202egarbage\r\n\r\n`, PARSER_REASON],
  // found from outside: it was called unreachable, which counts the receiver as away
  // (in either wording: Node's own fetch goes through the process's global dispatcher, which the undici package sets
  // when none is set, and the two releases word it differently; which one answers depends on what the process loaded
  // before, the test files before this one in their shared worker among it: vitest.config.ts)
  [
    'a Content-Length beside Transfer-Encoding: chunked',
    'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
    /^(its body does not match its Content-Length \(UND_ERR_RES_CONTENT_LENGTH_MISMATCH\)|Response does not match the HTTP\/1\.1 protocol \(Content-Length can't be present with Transfer-Encoding\) \(HPE_UNEXPECTED_CONTENT_LENGTH\))$/,
  ],
] as const

describe.each(PATHS)('the forwarder, through %s', (_path, fetchImplementation) => {
  const forwarderAt = (url: string, clock?: FakeClock) =>
    createForwarder({ url, secret: SECRET, timeoutMs: 5_000, fetch: fetchImplementation, ...(clock ? { clock } : {}) })

  it('throws forward_gone, permanent, on a 410, and logs one warning naming the receiver by origin', async () => {
    const target = await receiver(() => 410)
    const url = new URL(target.url)
    url.search = '?token=a-token-in-the-query-0001'
    const before = own.entries().length

    const error = await failureOf(forwarderAt(url.toString())(event, context()))

    expect(error).toMatchObject({ code: 'forward_gone', status: 410, permanent: true })
    expect(error.message).toBe(`the forward receiver ${url.origin} answered 410 Gone: it asks for no more events, so the job is failed without retrying`)
    const warnings = own
      .entries()
      .slice(before)
      .filter((entry) => entry.level === 40)
    expect(warnings).toHaveLength(1)
    expect(warnings[0]).toMatchObject({ receiver: url.origin, status: 410 })
    expect(String(warnings[0]!.msg)).toContain('410 Gone')
    const line = JSON.stringify(warnings[0])
    for (const hidden of ['a-token-in-the-query', '/hooks/escrow', event.externalReference]) expect(line).not.toContain(hidden)
  })

  it('says each key once in its debug line, the event id and attempt coming from the handler\'s logger', async () => {
    const target = await receiver(() => 204)
    const linesBefore = own.lines().length
    const jobLogger = logger.child({ handler: 'forwarder', eventId: event.eventId, attempt: 1 })
    await forwarderAt(target.url)(event, { ...context(), logger: jobLogger })
    const lines = own.lines().slice(linesBefore).filter((line) => line.includes('"reaction forwarded"'))
    expect(lines).toHaveLength(1)
    for (const key of ['eventId', 'attempt', 'handler', 'type', 'receiver', 'status']) {
      expect(lines[0]!.split(`"${key}":`).length - 1, key).toBe(1)
    }
  })

  // a 500 and no answer at all were logged "reaction forwarded"
  it('logs an answer other than 2xx, and no answer, as "reaction forward failed"', async () => {
    const failing = await receiver(() => 500)
    const before = own.lines().length
    await failureOf(forwarderAt(failing.url)(event, context()))
    const closedPort = await new Promise<number>((resolve) => {
      const server = net.createServer().listen(0, '127.0.0.1', () => {
        const { port } = server.address() as AddressInfo
        server.close(() => resolve(port))
      })
    })
    await failureOf(forwarderAt(`http://127.0.0.1:${closedPort}/hook`)(event, context()))
    const lines = own
      .lines()
      .slice(before)
      .filter((line) => line.includes('"receiver":'))
      .map((line) => JSON.parse(line) as Record<string, unknown>)
    expect(lines).toEqual([
      expect.objectContaining({ msg: 'reaction forward failed', status: 500 }),
      expect.objectContaining({ msg: 'reaction forward failed', error: 'unreachable' }),
    ])
  })

  it.each(BAD_ANSWERS)('throws forward_bad_answer, not unreachable, for %s', async (_case, answer, reason) => {
    const target = await rawReceiver(answer)

    const error = await failureOf(forwarderAt(target.url)(event, context()))

    expect(error).toMatchObject({ code: 'forward_bad_answer', status: undefined, permanent: false })
    const said = `the forward receiver ${new URL(target.url).origin} answered with something that is not HTTP: `
    expect(error.message.startsWith(said), error.message).toBe(true)
    if (typeof reason === 'string') expect(error.message.slice(said.length)).toBe(reason)
    else expect(error.message.slice(said.length)).toMatch(reason)
    // none of the receiver's own bytes, and nothing a terminal would act on
    expect(error.message).not.toContain(NOT_HTTP_MARKER)
    expect(printable(error.message)).toBe(error.message)
    expect(target.requests()).toBe(1)
  })

  it('still throws forward_unreachable for a receiver that closes the connection without a byte', async () => {
    // beside the bad answers: the network's failure keeps its own code (and without one, nothing above fails)
    const bad = await rawReceiver('HTTP/1.1 2OO WAT\r\n\r\n')
    expect(await failureOf(forwarderAt(bad.url)(event, context()))).toMatchObject({ code: 'forward_bad_answer' })
    const target = await rawReceiver(undefined)
    const error = await failureOf(forwarderAt(target.url)(event, context()))
    expect(error.code).toBe('forward_unreachable')
    expect(error.message).toContain('is unreachable')
  })

  it.each([
    ['99999999999999999999999 seconds', '9'.repeat(23), ''],
    ['two days', String(2 * 24 * 3600), ', until 2026-11-30T20:00:00.000Z'],
  ])('says a Retry-After of %s is longer than a day, not in seconds', async (_case, value, until) => {
    const clock = new FakeClock(Date.parse('2026-11-28T20:00:00Z'))
    const target = await receiver(() => ({ status: 503, headers: { 'retry-after': value } }))

    const error = await failureOf(forwarderAt(target.url, clock)(event, context()))

    expect(error.retryAfterMs).toBe(Number(value) * 1000)
    expect(error.message).toBe(`the forward receiver ${new URL(target.url).origin} answered 503 and asked to wait longer than a day (Retry-After)${until}`)
  })
})

// The job as the dispatcher keeps it, read from the database. The clock is fake: run_at is exact, and a retry
// happens only when the test moves the clock to it.
describe('the forwarder’s hostile answers under the dispatcher', () => {
  const database = useTestDatabase()
  const forwarding = forwarderUnderDispatcher(database, { secret: SECRET, logger, referencePrefix: 'hostile' })
  const { settings, firstBackoffMs, forwardOneEvent, idle, jobState, jobAfter } = forwarding

  it('fails the job at its first attempt when the receiver answers 410, and calls it no more', async () => {
    const target = await receiver(() => 410)
    const orderId = await forwardOneEvent(target.url)

    const job = await jobAfter(orderId, 1, 'failed')

    expect(job.lastError).toBe(`ForwardError: the forward receiver ${new URL(target.url).origin} answered 410 Gone: it asks for no more events, so the job is failed without retrying`)
    // past every backoff the job would have waited: no second call
    await idle()
    await forwarding.clock.advance(settings.backoff.capS * 1000 * settings.maxAttempts)
    await idle()
    expect(target.received).toHaveLength(1)
    expect(await jobState(orderId)).toMatchObject({ state: 'failed', attempts: 1 })
  })

  it('fails a retried job at once when the receiver answers 410 on a later attempt', async () => {
    // REACTION_MAX_ATTEMPTS is 3 here: the 410 on the second attempt ends the job with one left
    const target = await receiver((_request, count) => (count === 1 ? 503 : 410))
    const startedAt = forwarding.clock.now()
    const orderId = await forwardOneEvent(target.url)
    const first = await jobAfter(orderId, 1, 'pending')
    expect(first.runAt).toBe(startedAt + firstBackoffMs)

    await idle()
    await forwarding.clock.advance(firstBackoffMs)
    const second = await jobAfter(orderId, 2, 'failed')

    expect(second.lastError).toContain('answered 410 Gone')
    await idle()
    await forwarding.clock.advance(settings.backoff.capS * 1000)
    await idle()
    expect(target.received).toHaveLength(2)
  })

  it('retries an answer that is not HTTP like any failure, its error saying so', async () => {
    const target = await rawReceiver('HTTP/1.1 2OO WAT\r\ncontent-length: 0\r\n\r\n')
    const startedAt = forwarding.clock.now()
    const orderId = await forwardOneEvent(target.url)

    const job = await jobAfter(orderId, 1, 'pending')

    expect(job.runAt).toBe(startedAt + firstBackoffMs)
    const said = `ForwardError: the forward receiver ${new URL(target.url).origin} answered with something that is not HTTP: `
    expect(job.lastError?.startsWith(said), job.lastError ?? '').toBe(true)
    expect(job.lastError!.slice(said.length)).toMatch(PARSER_REASON)
    await idle()
    await forwarding.clock.advance(firstBackoffMs)
    await jobAfter(orderId, 2, 'pending')
    expect(target.requests()).toBe(2)
  })

  it('says a Retry-After of 99999999999999999999999 seconds is longer than a day, and waits the cap', async () => {
    const target = await receiver(() => ({ status: 503, headers: { 'retry-after': '9'.repeat(23) } }))
    const startedAt = forwarding.clock.now()
    const orderId = await forwardOneEvent(target.url)

    const job = await jobAfter(orderId, 1, 'pending')

    expect(job.runAt).toBe(startedAt + settings.backoff.capS * 1000)
    expect(job.lastError).toBe(
      `ForwardError: the forward receiver ${new URL(target.url).origin} answered 503 and asked to wait longer than a day (Retry-After) (retried after 1000 s instead, the longest wait between attempts)`,
    )
  })
})
