// Bad input and bad clients: every answer is one of the contract's, nothing unsigned is stored, and a
// slow or huge client is cut off without the process holding what it sends.
import net from 'node:net'
import { Readable } from 'node:stream'
import fc from 'fast-check'
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { listen, type RunningServer } from '../src/http/server.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { signBody } from './helpers/webhook-delivery.js'

const config = testConfig()
// the contract's answers, plus 431 from the HTTP parser for headers over 16 KB (in the same shape)
// 405: another method than POST on the webhook path; 415 is a Content-Encoding, which none of these requests sends
const CONTRACT_STATUSES = new Set([200, 400, 401, 404, 405, 413, 431])
// a well-formed signature header, checked only once the body is whole (and wrong): a request with none, or a
// malformed one, is refused from its headers before its body is read
const UNCHECKED_SIGNATURE = `sha256=${'0'.repeat(64)}`

describe('arbitrary requests against the webhook route', () => {
  let database: TestDatabase
  let running: RunningServer
  let app: string
  beforeAll(async () => {
    database = await createTestDatabase()
    const express = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
    running = await listen(express, { port: 0, host: '127.0.0.1' })
    app = running.url
  })
  afterAll(async () => {
    await running.stop(100)
    await database.close()
  })

  const stored = async () =>
    Number((await database.db.selectFrom('webhookDeliveries').select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow()).n)

  const header = fc.oneof(
    fc.constant(undefined),
    fc.string({ maxLength: 80 }),
    fc.string({ unit: 'binary', maxLength: 40 }),
    fc.constant(`sha256=${'a'.repeat(64)}`),
    fc.constant('x'.repeat(9_000)),
  )

  it('answers only contract codes, in the error shape, and stores nothing unsigned', async () => {
    const before = await stored()
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom('POST', 'GET', 'PUT', 'DELETE', 'PATCH'),
        fc.constantFrom('/webhooks/partner', '/webhooks/partner/', '/webhooks/partner/x', '/webhooks', '/%E0%A4%A'),
        fc.oneof(fc.string({ maxLength: 300 }), fc.json(), fc.uint8Array({ maxLength: 300 }).map((bytes) => Buffer.from(bytes))),
        header,
        header,
        async (method, path, body, signature, deliveryId) => {
          let call = request(app)[method.toLowerCase() as 'post'](path).set('Content-Type', 'application/octet-stream')
          // Node refuses to send header values with control characters; those never reach a server
          const safe = (value: string | undefined) => value !== undefined && /^[\t\x20-\x7e]*$/.test(value)
          if (safe(signature)) call = call.set('X-Partner-Signature', signature!)
          if (safe(deliveryId)) call = call.set('X-Partner-Delivery-Id', deliveryId!)
          const response = await call.send(typeof body === 'string' ? Buffer.from(body) : body)
          expect(CONTRACT_STATUSES.has(response.status), `${method} ${path} → ${response.status}`).toBe(true)
          if (response.status !== 200) {
            expect(response.body.error.code).toMatch(/^[a-z_]+$/)
            expect(typeof response.body.error.message).toBe('string')
          }
        },
      ),
      { numRuns: 150, seed: 20261122 },
    )
    // none of those bodies carried a valid signature, so nothing was stored
    expect(await stored()).toBe(before)
    expect((await request(app).get('/healthz')).status).toBe(200)
  })

  it('answers a request target whose path cannot be read with 404 in the error shape', async () => {
    // an absolute-form target that is no URL: Express's router finds no path in it
    const socket = net.connect(Number(new URL(app).port), '127.0.0.1')
    let answer = ''
    socket.on('data', (chunk) => (answer += chunk))
    socket.end('POST http://[::1/webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}')
    await new Promise((resolve) => socket.on('close', resolve))
    const [head = '', body = ''] = answer.split('\r\n\r\n')
    expect(head).toMatch(/^HTTP\/1\.1 404 /)
    expect(head).toMatch(/^content-type: application\/json/im)
    expect(JSON.parse(body)).toEqual({ error: { code: 'not_found', message: expect.any(String) } })
  })

  it('stores a delivery only when its signature verified, whatever the body', async () => {
    await fc.assert(
      fc.asyncProperty(fc.json({ maxDepth: 2 }), fc.boolean(), async (body, signed) => {
        const before = await stored()
        const response = await request(app)
          .post('/webhooks/partner')
          .set('Content-Type', 'application/json')
          .set('X-Partner-Delivery-Id', `prop-${Math.random()}`)
          .set('X-Partner-Signature', signed ? signBody(body) : signBody(`${body} `))
          .send(body)
        const after = await stored()
        if (!signed) {
          expect(response.status).toBe(401)
          expect(after).toBe(before)
        } else {
          expect([200, 400]).toContain(response.status)
          expect(after).toBe(response.status === 200 ? before + 1 : before)
        }
      }),
      { numRuns: 60, seed: 7 },
    )
  })
})

describe('slow and huge clients', () => {
  let database: TestDatabase
  let server: RunningServer
  let port: number
  beforeAll(async () => {
    database = await createTestDatabase()
    const app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
    server = await listen(app, {
      port: 0,
      host: '127.0.0.1',
      timeouts: { headersTimeoutMs: 500, requestTimeoutMs: 1_000, keepAliveTimeoutMs: 500 },
    })
    port = Number(new URL(server.url).port)
  })
  afterAll(async () => {
    await server.stop(100)
    await database.close()
  })

  // writes `text` one byte at a time every `everyMs`; resolves with what the server answered and how many bytes
  // were still to send when it closed the connection (the server's timers and these writes share one event loop:
  // on a loaded machine both are late, so the count, not the time, says whether the server cut it off)
  function trickle(text: string, everyMs: number): Promise<{ answer: string; unsent: number }> {
    return new Promise((resolve) => {
      const socket = net.connect(port, '127.0.0.1')
      let answer = ''
      let index = 0
      const timer = setInterval(() => {
        if (index < text.length && !socket.destroyed) socket.write(text[index++]!)
      }, everyMs)
      socket.on('data', (chunk) => {
        answer += chunk
      })
      socket.on('error', () => {})
      socket.on('close', () => {
        clearInterval(timer)
        resolve({ answer, unsent: text.length - index })
      })
    })
  }

  it('cuts off a client that sends its headers byte by byte', async () => {
    const { answer, unsent } = await trickle(`POST /webhooks/partner HTTP/1.1\r\nHost: x\r\n${'X-Pad: y\r\n'.repeat(50)}\r\n`, 20)
    // cut off at the 500 ms headers timeout, long before the 11 s the trickle would take: most of it unsent
    expect(unsent).toBeGreaterThan(0)
    expect(answer === '' || answer.startsWith('HTTP/1.1 408')).toBe(true)
  })

  it('cuts off a client that trickles its body', async () => {
    const head = 'POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n'
    // cut off at the 1 s request timeout, before the 2.5 s the trickle would take
    const { unsent } = await trickle(head + 'x'.repeat(400), 5)
    expect(unsent).toBeGreaterThan(0)
  })

  it('gives back the body budget of a request cut off 408 whose client keeps its connection open and silent', async () => {
    // a listener of its own whose budget is one 1 KB body: the cut-off request held the part it sent as long as
    // its client kept the connection, and every delivery after it was refused 503 overloaded, on the unsigned
    // word of one connection that sent a request's headers, most of a body and then nothing
    const tight = testConfig({ WEBHOOK_BODY_LIMIT: '1kb', MAX_INFLIGHT_BODY_BYTES: '1kb' })
    const own = await listen(createApp({ config: tight, db: database.db, logger: testLogger(tight.webhook.secrets), clock: systemClock }), {
      port: 0,
      host: '127.0.0.1',
      timeouts: { headersTimeoutMs: 500, requestTimeoutMs: 1_000, keepAliveTimeoutMs: 500 },
    })
    // allowHalfOpen: the server's end of the connection does not end the client's
    const silent = net.connect({ port: Number(new URL(own.url).port), host: '127.0.0.1', allowHalfOpen: true })
    silent.on('error', () => {})
    let answer = ''
    silent.on('data', (chunk) => (answer += chunk))
    try {
      // one chunk of 1,000 bytes (0x3e8), and no end
      silent.write(
        `POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Partner-Signature: ${UNCHECKED_SIGNATURE}\r\n\r\n` +
          `3e8\r\n${'a'.repeat(1000)}\r\n`,
      )
      await expect.poll(() => answer, { timeout: 10_000 }).toMatch(/^HTTP\/1\.1 408 /)
      const body = JSON.stringify({ event: 'seller.verified', seller_id: 's-after-408' })
      const deliver = async () =>
        (
          await fetch(`${own.url}/webhooks/partner`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-partner-signature': signBody(body), 'x-partner-delivery-id': 'after-408' },
            body,
          })
        ).status
      await expect.poll(deliver, { timeout: 10_000, interval: 500 }).toBe(200)
    } finally {
      silent.destroy()
      await own.stop(100)
    }
  })

  it('refuses a 50 MB body with 413, with or without Content-Length, without holding it', async () => {
    const size = 50 * 1024 * 1024
    const chunk = Buffer.alloc(64 * 1024, 0x61)
    global.gc?.()
    const before = process.memoryUsage()
    const declared = await fetch(`${server.url}/webhooks/partner`, {
      method: 'POST',
      // a signature header that could be right (one missing or malformed is refused 401 from the headers)
      headers: { 'content-type': 'application/json', 'content-length': String(size), 'x-partner-signature': UNCHECKED_SIGNATURE },
      body: Readable.toWeb(Readable.from((function* () { for (let sent = 0; sent < size; sent += chunk.length) yield chunk })())) as ReadableStream,
      duplex: 'half',
    } as RequestInit).catch((error: Error) => error)
    const streamed = await fetch(`${server.url}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-signature': UNCHECKED_SIGNATURE },
      body: Readable.toWeb(Readable.from((function* () { for (let sent = 0; sent < size; sent += chunk.length) yield chunk })())) as ReadableStream,
      duplex: 'half',
    } as RequestInit).catch((error: Error) => error)
    for (const response of [declared, streamed]) {
      // the server answers 413 and closes; a client still sending may see the reset instead
      if (response instanceof Response) expect(response.status).toBe(413)
      else expect(String(response.cause ?? response)).toMatch(/reset|closed|EPIPE|other side|terminated/i)
    }
    const after = process.memoryUsage()
    expect((after.arrayBuffers - before.arrayBuffers) / 1024 / 1024).toBeLessThan(20)
    expect((after.rss - before.rss) / 1024 / 1024).toBeLessThan(40)
  })
})
