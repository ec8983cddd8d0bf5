// What the compiled `serve` answers before its application would otherwise have a say: a request that waits
// for `100 Continue` (Node used to write it for every such request, so a client was told to send a body the
// service then refused), a request target Express cannot read on the operator listener (it answered with
// its own HTML page), and a target Node's legacy URL parser warns about (the warning quoted the outsider's
// target on the process's stderr).
import { gzipSync } from 'node:zlib'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { receiverEnv, spawnCli, waitForLogLine, stopChild } from './helpers/cli-process.js'
import { connect, exchange, finalAnswer } from './helpers/raw-http-client.js'
import { signBody } from './helpers/webhook-delivery.js'

const BODY_LIMIT = 256 * 1024
const ADMIN_TOKEN = 'admin_token_0123456789abcdef0123456789'
const WELL_FORMED_SIGNATURE = `sha256=${'0'.repeat(64)}`

/** The public listener's body bytes being received or answered now, from the operator listener's metrics. */
async function inflightBodyBytes(adminPort: number): Promise<number> {
  const scrape = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text()
  return Number(/^http_inflight_body_bytes (\d+)/m.exec(scrape)?.[1])
}

function webhookHead(port: number, headers: Record<string, string | number>): string {
  const lines = Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`)
  return `POST /webhooks/partner HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n${lines.join('')}\r\n`
}

describe('the compiled service before its application answers', () => {
  let service: ReturnType<typeof spawnCli>
  let port: number
  let adminPort: number
  let stderr = ''

  beforeAll(async () => {
    service = spawnCli(
      ['serve'],
      {
        ...receiverEnv('memory://'),
        ADMIN_TOKEN,
        WEBHOOK_BODY_LIMIT: String(BODY_LIMIT),
        // one largest body at a time: a request that sends all but the last byte of one and stalls spends the budget
        MAX_INFLIGHT_BODY_BYTES: String(BODY_LIMIT),
        // and it stays held: after SLOW_BODY_MS (1 s by default) a newer request may cut it to make room, which a
        // loaded machine's pause between the two requests reached (the late one was then read, not refused)
        SLOW_BODY_MS: '600000',
      },
    )
    service.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
    const listening = await waitForLogLine(service, 'service listening')
    service.stdout!.resume()
    port = Number(new URL(String(listening.url)).port)
    adminPort = Number(new URL(String(listening.adminUrl)).port)
  })

  afterAll(async () => {
    await stopChild(service)
  })

  describe('a webhook that waits for 100 Continue', () => {
    it('is refused 413 payload_too_large, without 100 Continue, when its announced length is past the limit', async () => {
      const received = await exchange(
        port,
        webhookHead(port, {
          'Content-Length': 10 * 1024 * 1024,
          'X-Partner-Delivery-Id': 'big-1',
          'X-Partner-Signature': WELL_FORMED_SIGNATURE,
          Expect: '100-continue',
        }),
      )
      expect(received).not.toContain('100 Continue')
      const answer = finalAnswer(received)
      expect(answer.status).toBe(413)
      expect(JSON.parse(answer.body)).toEqual({ error: { code: 'payload_too_large', message: expect.any(String) } })
    })

    it.each([
      ['no signature header', {}],
      ['a malformed signature header', { 'X-Partner-Signature': 'sha256=not-hex' }],
    ])('is refused 401 invalid_signature, without 100 Continue, with %s', async (_case, signature) => {
      const received = await exchange(
        port,
        webhookHead(port, { 'Content-Length': 2, 'X-Partner-Delivery-Id': 'unsigned-1', ...signature, Expect: '100-continue' }),
      )
      expect(received).not.toContain('100 Continue')
      const answer = finalAnswer(received)
      expect(answer.status).toBe(401)
      expect(JSON.parse(answer.body)).toEqual({ error: { code: 'invalid_signature', message: expect.any(String) } })
    })

    it('is told to continue when it will be read, and its body is received', async () => {
      const body = JSON.stringify({ event: 'seller.verified', seller_id: 's-continue' })
      const client = await connect(port)
      client.write(
        webhookHead(port, {
          'Content-Length': Buffer.byteLength(body),
          'X-Partner-Delivery-Id': 'continue-1',
          'X-Partner-Signature': signBody(body),
          Expect: '100-continue',
          Connection: 'close',
        }),
      )
      // nothing of the body is sent before the service asks for it
      expect(await client.until((received) => received.length > 0)).toBe('HTTP/1.1 100 Continue\r\n\r\n')
      client.write(body)
      const answer = finalAnswer(await client.closed)
      expect(answer.status).toBe(200)
      expect(JSON.parse(answer.body)).toEqual({ received: true })
    })

    it('is refused 503 overloaded with Retry-After, without 100 Continue, while the body budget is spent', async () => {
      // sends all but the last byte of the largest body: the whole budget but one byte is held
      const holder = await connect(port)
      holder.write(webhookHead(port, { 'Content-Length': BODY_LIMIT, 'X-Partner-Delivery-Id': 'hold-1', 'X-Partner-Signature': WELL_FORMED_SIGNATURE }))
      holder.write('a'.repeat(BODY_LIMIT - 1))
      try {
        await expect.poll(() => inflightBodyBytes(adminPort), { timeout: 10_000 }).toBe(BODY_LIMIT - 1)
        const received = await exchange(
          port,
          webhookHead(port, { 'Content-Length': 2, 'X-Partner-Delivery-Id': 'late-1', 'X-Partner-Signature': WELL_FORMED_SIGNATURE, Expect: '100-continue' }),
        )
        expect(received).not.toContain('100 Continue')
        const answer = finalAnswer(received)
        expect(answer.status).toBe(503)
        expect(answer.headers['retry-after']).toBe('1')
        expect(JSON.parse(answer.body)).toEqual({ error: { code: 'overloaded', message: expect.any(String) } })
      } finally {
        holder.destroy()
      }
    })
  })

  describe('the operator listener', () => {
    it('answers a path with no route 404 without 100 Continue, and continues a console form it reads', async () => {
      const refused = await exchange(
        adminPort,
        `POST /nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n`,
      )
      expect(refused).not.toContain('100 Continue')
      expect(finalAnswer(refused).status).toBe(404)

      const form = 'token=wrong'
      const client = await connect(adminPort)
      client.write(
        `POST /console/login HTTP/1.1\r\nHost: 127.0.0.1:${adminPort}\r\nOrigin: http://127.0.0.1:${adminPort}\r\n` +
          `Content-Type: application/x-www-form-urlencoded\r\nContent-Length: ${form.length}\r\n` +
          `Expect: 100-continue\r\nConnection: close\r\n\r\n`,
      )
      expect(await client.until((received) => received.length > 0)).toBe('HTTP/1.1 100 Continue\r\n\r\n')
      client.write(form)
      expect(finalAnswer(await client.closed).status).toBe(401)
    })

    it.each(['POST http://[::1/anything', 'GET http://[::1/metrics', 'GET //%zz', 'GET http://host:port/metrics', 'OPTIONS *'])(
      'answers `%s` 404 not_found in the error shape, never HTML',
      async (line) => {
        const answer = finalAnswer(
          await exchange(adminPort, `${line} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`),
        )
        expect(answer.status).toBe(404)
        expect(answer.headers['content-type']).toMatch(/^application\/json/)
        expect(JSON.parse(answer.body)).toEqual({ error: { code: 'not_found', message: expect.any(String) } })
      },
    )

    it('escapes what it echoes of a target', async () => {
      const answer = finalAnswer(
        await exchange(adminPort, `GET /<script>alert(1)</script> HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`),
      )
      expect(answer.status).toBe(404)
      expect(answer.body).not.toContain('<')
      expect(JSON.parse(answer.body)).toEqual({ error: { code: 'not_found', message: expect.stringContaining('/<script>') } })
    })
  })

  describe('what Node answered with an empty body', () => {
    const errorOf = (answer: ReturnType<typeof finalAnswer>) => {
      expect(answer.headers['content-type']).toMatch(/^application\/json/)
      expect(answer.headers.connection).toBe('close')
      return JSON.parse(answer.body) as unknown
    }

    it.each([
      ['the webhook', () => port, 'POST /webhooks/partner'],
      ['the operator listener', () => adminPort, 'GET /metrics'],
    ])('answers an HTTP/1.1 request without Host on %s 400 invalid_payload in the error shape', async (_listener, listener, line) => {
      const answer = finalAnswer(await exchange(listener(), `${line} HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`))
      expect(answer.status).toBe(400)
      expect(errorOf(answer)).toEqual({ error: { code: 'invalid_payload', message: expect.stringContaining('Host') } })
      // HTTP/1.0 has no Host to require
      const old = finalAnswer(await exchange(port, 'GET /healthz HTTP/1.0\r\n\r\n'))
      expect(old.status).toBe(200)
    })

    it.each([
      ['the public listener', () => port],
      ['the operator listener', () => adminPort],
    ])('answers CONNECT on %s 405 method_not_allowed in the error shape (Node closed the connection without a word)', async (_listener, listener) => {
      const answer = finalAnswer(await exchange(listener(), 'CONNECT platform.example:443 HTTP/1.1\r\nHost: platform.example:443\r\n\r\n'))
      expect(answer.status).toBe(405)
      expect(errorOf(answer)).toEqual({ error: { code: 'method_not_allowed', message: expect.stringContaining('CONNECT') } })
    })

    it('answers an expectation other than 100-continue 417 expectation_failed in the error shape', async () => {
      const answer = finalAnswer(
        await exchange(port, webhookHead(port, { 'Content-Length': 2, 'X-Partner-Signature': WELL_FORMED_SIGNATURE, Expect: 'something-else', Connection: 'close' })),
      )
      expect(answer.status).toBe(417)
      expect(errorOf(answer)).toEqual({ error: { code: 'expectation_failed', message: expect.stringContaining('100-continue') } })
    })

    it('refuses a webhook sent with a transfer coding besides chunked 501, rather than verify its coded bytes', async () => {
      // the signature is over the body; a transfer coding (gzip here) is applied after, and Node does not undo it:
      // the coded bytes were read as the body and refused 401 invalid_signature, as if a secret were wrong
      const body = JSON.stringify({ event: 'seller.verified', seller_id: 's-coded' })
      const coded = gzipSync(body)
      const client = await connect(port)
      client.write(
        `POST /webhooks/partner HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n` +
          `Transfer-Encoding: gzip, chunked\r\nX-Partner-Delivery-Id: coded-1\r\nX-Partner-Signature: ${signBody(body)}\r\n\r\n`,
      )
      client.write(Buffer.concat([Buffer.from(`${coded.length.toString(16)}\r\n`), coded, Buffer.from('\r\n0\r\n\r\n')]))
      const answer = finalAnswer(await client.closed)
      expect(answer.status).toBe(501)
      expect(errorOf(answer)).toEqual({ error: { code: 'unsupported_transfer_coding', message: expect.stringContaining('Transfer-Encoding') } })
    })
  })

  it('writes nothing of a malformed request target to stderr, on either listener', async () => {
    for (const target of ['http://[::1/webhooks/partner', 'http://evil:x-secret-text/webhooks/partner']) {
      for (const listener of [port, adminPort]) {
        await exchange(listener, `POST ${target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`)
      }
    }
    // an absolute-form target that is a URL is still read as its path
    const health = finalAnswer(await exchange(port, 'GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'))
    expect(health.status).toBe(200)
    // a warning is written on the next tick: give it time to reach the pipe
    await new Promise((resolve) => setTimeout(resolve, 500))
    expect(stderr).not.toContain('DEP0170')
    expect(stderr).not.toContain('[::1')
    expect(stderr).not.toContain('x-secret-text')
  })
})
