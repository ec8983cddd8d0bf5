// The public listener's caps: a budget of in-flight body bytes, counted as bodies arrive (503 `overloaded`
// past it), and a cap on open connections, each counted in the operator listener's metrics.
import { once } from 'node:events'
import net from 'node:net'
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { RunningService } from '../src/service.js'
import { testLogger } from './helpers/log-sink.js'
import { openStalledBodies, openStalledHeads, type StalledClient } from './helpers/stalled-bodies.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { startTestService } from './helpers/test-service.js'
import { signBody } from './helpers/webhook-delivery.js'

const KB = 1024

/** A service of its own for one test, with a 256 KB body limit and `env` besides; `metric` reads its operator listener. */
/** Holds the embedded database's one connection in a transaction until the returned function lets it go. */
function holdDatabase(own: RunningService): () => Promise<void> {
  let letGo = () => {}
  const gate = new Promise<void>((resolve) => (letGo = resolve))
  const holding = own.database.db.transaction().execute(async (trx) => {
    await sql`select 1`.execute(trx)
    await gate
  })
  return async () => {
    letGo()
    await holding
  }
}

async function startOwnService(env: Record<string, string>) {
  const own = await startTestService({
    config: testConfig({ PORT: '0', POLL_ENABLED: 'false', WEBHOOK_BODY_LIMIT: '256kb', ...env }),
    logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
  })
  await own.ready
  const metric = async (line: RegExp) => Number(line.exec(await (await fetch(`${own.adminUrl}/metrics`)).text())?.[1] ?? 0)
  return { own, ownMetric: metric, ownPort: Number(new URL(own.url).port) }
}

describe('limits of the public listener', () => {
  let service: RunningService
  let port: number
  const held: net.Socket[] = []

  beforeAll(async () => {
    service = await startTestService({
      config: testConfig({
        PORT: '0',
        POLL_ENABLED: 'false',
        WEBHOOK_BODY_LIMIT: '256kb',
        MAX_INFLIGHT_BODY_BYTES: '512kb',
        // no body here is cut for a newer one, however long it has been arriving (the next tests' own services do)
        SLOW_BODY_MS: '600000',
      }),
      logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
    })
    await service.ready
    port = Number(new URL(service.url).port)
  })
  afterAll(async () => {
    for (const socket of held) socket.destroy()
    await service.stop()
  })

  const metric = async (line: RegExp) => {
    const scrape = await (await fetch(`${service.adminUrl}/metrics`)).text()
    return Number(line.exec(scrape)?.[1] ?? 0)
  }

  const delivery = (reference: string) => {
    const body = JSON.stringify({ event: 'trade.funded', trade_id: `tr_${reference}`, status: 'funded', external_reference: reference })
    return { body, headers: { 'content-type': 'application/json', 'x-partner-signature': signBody(body), 'x-partner-delivery-id': reference } }
  }
  const send = (reference: string) => {
    const { body, headers } = delivery(reference)
    return fetch(`${service.url}/webhooks/partner`, { method: 'POST', headers, body })
  }
  const sendChunked = (reference: string) => {
    const { body, headers } = delivery(reference)
    return fetch(`${service.url}/webhooks/partner`, {
      method: 'POST',
      headers,
      body: new Blob([body]).stream(),
      duplex: 'half',
    } as RequestInit)
  }

  it('counts bodies as they arrive: 503 overloaded at the headers for a length that does not fit, part-way for a chunk that does not fit', async () => {
    // two unfinished 256 KB bodies, each one byte short, take all but 2 bytes of the 512 KB budget
    const stalled: StalledClient[] = await openStalledBodies({ port, connections: 2, contentLength: 256 * KB, sentBytes: 256 * KB - 1 })
    held.push(...stalled.map((client) => client.socket))
    await expect.poll(() => metric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(512 * KB - 2)

    // a Content-Length that does not fit: refused from the headers
    const refused = await send('lim-1')
    expect(refused.status).toBe(503)
    expect(refused.headers.get('connection')).toBe('close')
    expect(refused.headers.get('retry-after')).toBe('1')
    expect(await refused.json()).toEqual({ error: { code: 'overloaded', message: expect.any(String) } })
    expect(await metric(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m)).toBe(1)

    // a chunked body announces nothing: admitted, then refused at its first chunk, which does not fit
    const chunked = await sendChunked('lim-2')
    expect(chunked.status).toBe(503)
    expect(chunked.headers.get('connection')).toBe('close')
    expect(chunked.headers.get('retry-after')).toBe('1')
    expect(await chunked.json()).toEqual({ error: { code: 'overloaded', message: expect.any(String) } })
    expect(await metric(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m)).toBe(2)
    // the refused chunk is not held
    expect(await metric(/^http_inflight_body_bytes (\d+)/m)).toBe(512 * KB - 2)

    // the held bodies end (their clients go away): the budget comes back
    for (const client of stalled) client.socket.destroy()
    await expect.poll(() => metric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(0)
    expect((await send('lim-3')).status).toBe(200)
    expect((await sendChunked('lim-4')).status).toBe(200)
  })

  it('holds nothing for headers alone: 70 requests that announce the largest body and send none of it refuse no delivery', async () => {
    // 70 × 256 KB announced, chunked or by length, is 35 times the budget; sent, nothing. Each request used to
    // reserve what it announced from its headers, so two such requests refused every delivery until they were
    // cut off (408, after REQUEST_TIMEOUT), and an unauthenticated client could repeat it without end
    const announcing = await openStalledHeads({ port, connections: 35, contentLength: 256 * KB, sentBytes: 0 })
    const chunkedHeads = await Promise.all(
      Array.from({ length: 35 }, async () => {
        const socket = net.connect(port, '127.0.0.1')
        socket.on('error', () => {})
        await once(socket, 'connect')
        socket.write(`POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n`)
        return socket
      }),
    )
    held.push(...announcing.map((client) => client.socket), ...chunkedHeads)
    const refusedBefore = await metric(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m)
    try {
      expect((await send('heads-1')).status).toBe(200)
      expect((await sendChunked('heads-2')).status).toBe(200)
      expect(await metric(/^http_inflight_body_bytes (\d+)/m)).toBe(0)
      expect(await metric(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m)).toBe(refusedBefore)
      // none of the 70 was answered: each still waits for its body
      expect(announcing.every((client) => client.status === undefined && !client.closed)).toBe(true)
    } finally {
      for (const client of announcing) client.socket.destroy()
      for (const socket of chunkedHeads) socket.destroy()
    }
  })

  it('cuts the body arriving the longest, once past SLOW_BODY_MS, for a delivery that does not fit', async () => {
    const { own, ownMetric, ownPort } = await startOwnService({ MAX_INFLIGHT_BODY_BYTES: '512kb', SLOW_BODY_MS: '200' })
    // two bodies, each one byte short of 256 KB, hold all but 2 bytes of the budget and go on arriving, slowly
    const stalled = await openStalledBodies({ port: ownPort, connections: 2, contentLength: 256 * KB, sentBytes: 256 * KB - 1 })
    try {
      await expect.poll(() => ownMetric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(512 * KB - 2)
      // past SLOW_BODY_MS, however long that takes here
      await new Promise((resolve) => setTimeout(resolve, 300))
      const { body, headers } = delivery('slow-1')
      const taken = await fetch(`${own.url}/webhooks/partner`, { method: 'POST', headers, body })
      // before, 503 overloaded for as long as the two went on sending (until the request timeout, 30 s)
      expect(taken.status).toBe(200)
      // one of the two made room, answered 503 and closed; the other is still held
      await expect.poll(() => stalled.filter((client) => client.status === 503).length, { timeout: 10_000 }).toBe(1)
      expect(stalled.filter((client) => client.status === undefined && !client.closed)).toHaveLength(1)
      expect(await ownMetric(/^http_requests_refused_total\{reason="slow_body"\} (\d+)/m)).toBe(1)
      expect(await ownMetric(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m)).toBe(0)
      await expect.poll(() => ownMetric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(256 * KB - 1)

      // the same for a chunked delivery, which announces nothing: cut at its first chunk, which does not fit
      stalled.push(...(await openStalledBodies({ port: ownPort, connections: 1, contentLength: 256 * KB, sentBytes: 256 * KB - 1 })))
      await expect.poll(() => ownMetric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(512 * KB - 2)
      await new Promise((resolve) => setTimeout(resolve, 300))
      const chunked = await fetch(`${own.url}/webhooks/partner`, {
        method: 'POST',
        headers: delivery('slow-2').headers,
        body: new Blob([delivery('slow-2').body]).stream(),
        duplex: 'half',
      } as RequestInit)
      expect(chunked.status).toBe(200)
      await expect.poll(() => stalled.filter((client) => client.status === 503).length, { timeout: 10_000 }).toBe(2)
      expect(await ownMetric(/^http_requests_refused_total\{reason="slow_body"\} (\d+)/m)).toBe(2)
      expect(await ownMetric(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m)).toBe(0)
    } finally {
      for (const client of stalled) client.socket.destroy()
      await own.stop()
    }
  })

  it('takes no chunk of a body that making room for it cut, and gives every byte back', async () => {
    // SLOW_BODY_MS 0: any body still arriving may be cut, the one arriving longest first
    const { own, ownMetric, ownPort } = await startOwnService({ MAX_INFLIGHT_BODY_BYTES: '512kb', SLOW_BODY_MS: '0' })
    const inflight = () => ownMetric(/^http_inflight_body_bytes (\d+)/m)
    const [first] = await openStalledHeads({ port: ownPort, connections: 1, contentLength: 256 * KB, sentBytes: 100 * KB })
    const clients: StalledClient[] = [first!]
    try {
      await first!.sendPart()
      await expect.poll(inflight, { timeout: 10_000 }).toBe(100 * KB)
      clients.push(...(await openStalledBodies({ port: ownPort, connections: 1, contentLength: 256 * KB, sentBytes: 256 * KB - 1 })))
      await expect.poll(inflight, { timeout: 10_000 }).toBe(356 * KB - 1)
      // announcing no more than is free, so its headers cut nothing
      clients.push(...(await openStalledBodies({ port: ownPort, connections: 1, contentLength: 151 * KB, sentBytes: 150 * KB })))
      await expect.poll(inflight, { timeout: 10_000 }).toBe(506 * KB - 1)
      // the first body's next 100 KB do not fit; it is the one arriving longest, so it is the one cut
      await first!.sendPart()
      await expect.poll(() => first!.status, { timeout: 10_000 }).toBe(503)
      await expect.poll(inflight, { timeout: 10_000 }).toBe(406 * KB - 1)
    } finally {
      for (const client of clients) client.socket.destroy()
    }
    try {
      // before, the cut body's chunk was taken after its bytes were given back, and stayed reserved for good
      await expect.poll(inflight, { timeout: 10_000 }).toBe(0)
    } finally {
      await own.stop()
    }
  })

  it('gives back the budget of a pipelined request whose connection closed before its turn to be answered', async () => {
    // a service of its own, whose budget is the body limit: bytes held for good would show in the gauge for good
    const { own, ownMetric, ownPort } = await startOwnService({ MAX_INFLIGHT_BODY_BYTES: '256kb' })
    const delivery = (reference: string) => {
      const body = JSON.stringify({ trade_id: `tr_${reference}`, status: 'funded', external_reference: reference })
      return { body, headers: { 'x-partner-signature': signBody(body), 'x-partner-delivery-id': reference } }
    }
    try {
      // the embedded database's one connection, held: the first request on the connection waits for it
      const letGo = holdDatabase(own)
      try {
        // a whole delivery, and pipelined behind it all but the last byte of a 200 KB one whose answer waits
        // for the first's; the client goes away with both unanswered
        const first = delivery('pipe-1')
        const socket = net.connect(ownPort, '127.0.0.1')
        socket.on('error', () => {})
        await once(socket, 'connect')
        socket.write(
          `POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Length: ${Buffer.byteLength(first.body)}\r\n` +
            `X-Partner-Signature: ${first.headers['x-partner-signature']}\r\nX-Partner-Delivery-Id: pipe-1\r\n\r\n${first.body}` +
            // (a signature header that could be right: one missing or malformed is refused from the headers)
            `POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Length: ${200 * KB}\r\n` +
            `X-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n${'a'.repeat(200 * KB - 1)}`,
        )
        await expect
          .poll(() => ownMetric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 })
          .toBe(Buffer.byteLength(first.body) + 200 * KB - 1)
        socket.destroy()
        // the service saw the close: the unfinished body was refused
        await expect.poll(() => ownMetric(/^webhook_deliveries_total\{outcome="rejected"\} (\d+)/m), { timeout: 10_000 }).toBe(1)
      } finally {
        await letGo()
      }
      // both requests are done: their bytes are back, and a chunked delivery is taken
      await expect.poll(() => ownMetric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(0)
      const next = delivery('pipe-2')
      const chunked = await fetch(`${own.url}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...next.headers },
        body: new Blob([next.body]).stream(),
        duplex: 'half',
      } as RequestInit)
      expect(chunked.status).toBe(200)
    } finally {
      await own.stop()
    }
  })

  /**
   * A whole delivery, and pipelined behind it the start of another request (`behind`, `held` bytes of its body sent),
   * while the embedded database's one connection is held, so the answer ahead waits for it; `cut` then ends the
   * second part-way. The unfinished body must be refused and its bytes given back while that answer still waits
   * (they were held until it went out), and the delivery ahead answered 200, alone.
   */
  async function refusedBehindHeldDelivery(
    reference: string,
    behind: string,
    held: number,
    cut: (socket: net.Socket, ownMetric: (pattern: RegExp) => Promise<number>) => Promise<void>,
  ) {
    const { own, ownMetric, ownPort } = await startOwnService({ MAX_INFLIGHT_BODY_BYTES: '256kb' })
    const inflight = () => ownMetric(/^http_inflight_body_bytes (\d+)/m)
    const body = JSON.stringify({ trade_id: `tr_${reference}`, status: 'funded', external_reference: reference })
    try {
      const letGo = holdDatabase(own)
      const socket = net.connect(ownPort, '127.0.0.1')
      let received = ''
      socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')))
      socket.on('error', () => {})
      const closed = once(socket, 'close')
      try {
        await once(socket, 'connect')
        socket.write(
          `POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
            `X-Partner-Signature: ${signBody(body)}\r\nX-Partner-Delivery-Id: ${reference}\r\n\r\n${body}${behind}`,
        )
        await expect.poll(inflight, { timeout: 10_000 }).toBe(Buffer.byteLength(body) + held)
        await cut(socket, ownMetric)
        await expect.poll(() => ownMetric(/^webhook_deliveries_total\{outcome="rejected"\} (\d+)/m), { timeout: 10_000 }).toBe(1)
        await expect.poll(inflight, { timeout: 10_000 }).toBe(Buffer.byteLength(body))
      } finally {
        await letGo()
      }
      // the delivery ahead is answered 200, alone, and the connection closed (the client's side too, in a moment)
      await closed
      expect(received.match(/HTTP\/1\.1 \d{3} /g), received).toHaveLength(1)
      expect(received).toMatch(/^HTTP\/1\.1 200 OK\r\n[^]*\r\n\r\n\{"received":true\}$/)
      await expect.poll(inflight, { timeout: 10_000 }).toBe(0)
    } finally {
      await own.stop()
    }
  }

  it('gives back at once the budget of a pipelined request whose client half-closed part-way through its body, and answers the one ahead', async () => {
    // all but the last byte of a 200 KB body; then the client's end comes (it still reads)
    const behind = `POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Length: ${200 * KB}\r\n` +
      `X-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n${'a'.repeat(200 * KB - 1)}`
    await refusedBehindHeldDelivery('half-1', behind, 200 * KB - 1, async (socket, ownMetric) => {
      socket.end()
      await expect.poll(() => ownMetric(/^http_requests_refused_total\{reason="body_incomplete"\} (\d+)/m), { timeout: 10_000 }).toBe(1)
    })
  })

  it('gives back at once the budget of a pipelined chunked request the parser refused part-way through its body, and answers the one ahead', async () => {
    // a chunked body's first 100 KB chunk; then a chunk size that is no number: the parser refuses the rest
    // (HPE_INVALID_CHUNK_SIZE)
    const behind = `POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n` +
      `X-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n${(100 * KB).toString(16)}\r\n${'a'.repeat(100 * KB)}\r\n`
    await refusedBehindHeldDelivery('chunk-1', behind, 100 * KB, async (socket) => {
      socket.write('zz\r\n')
    })
  })

  // it was answered 400 invalid_payload "The request is not valid HTTP", though it was only unfinished
  it('answers 400 body_incomplete, and counts, a request whose client ended its side part-way through the body', async () => {
    const counted = () => metric(/^http_requests_refused_total\{reason="body_incomplete"\} (\d+)$/m)
    const before = await counted()
    const cutShort = async (framing: string, sent: string) => {
      const socket = net.connect(port, '127.0.0.1')
      let answer = ''
      socket.on('data', (chunk: Buffer) => (answer += chunk.toString('latin1')))
      socket.on('error', () => {})
      const closed = once(socket, 'close')
      await once(socket, 'connect')
      socket.write(`POST /webhooks/partner HTTP/1.1\r\nHost: x\r\n${framing}\r\nX-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n${sent}`)
      // the body's bytes are in (counted in the budget) before the client's end comes
      await expect.poll(() => metric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBeGreaterThan(0)
      socket.end()
      await closed
      const [head = '', body] = answer.split('\r\n\r\n')
      return { head, body: JSON.parse(body ?? 'null') as unknown }
    }

    const announced = await cutShort('Content-Length: 1000', '0123456789')
    expect(announced.head).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/)
    expect(announced.head).toMatch(/\r\nConnection: close(\r\n|$)/i)
    expect(announced.body).toEqual({ error: { code: 'body_incomplete', message: 'The request ended before its body did: 10 of 1000 bytes' } })

    const chunked = await cutShort('Transfer-Encoding: chunked', 'a\r\n0123456789\r\n')
    expect(chunked.head).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/)
    expect(chunked.body).toEqual({
      error: { code: 'body_incomplete', message: 'The request ended before its body did: 10 bytes of a chunked body, and not its last chunk' },
    })

    expect(await counted()).toBe(before + 2)
    await expect.poll(() => metric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(0)
  })

  // found from outside: README said the 408s were counted, and nothing counted them
  it('counts a request cut off 408 at the headers timeout', async () => {
    const before = await metric(/^http_requests_refused_total\{reason="request_timeout"\} (\d+)$/m)
    const socket = net.connect(port, '127.0.0.1')
    let answer = ''
    socket.on('data', (chunk) => (answer += chunk))
    socket.on('error', () => {})
    // headers that never end: the listener answers 408 once headersTimeout (10 s) has passed
    socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n')
    await once(socket, 'close')
    expect(answer).toMatch(/^HTTP\/1\.1 408 /)
    expect(await metric(/^http_requests_refused_total\{reason="request_timeout"\} (\d+)$/m)).toBe(before + 1)
  })

  it('drops connections past MAX_CONNECTIONS and counts them', async () => {
    // a service of its own: no earlier keep-alive connection counts against the cap; and no open connection
    // here is ever old enough to be closed for a new one (the next test's are)
    const capped = await startTestService({
      config: testConfig({ PORT: '0', POLL_ENABLED: 'false', MAX_CONNECTIONS: '8', SLOW_BODY_MS: '600000' }),
      logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
    })
    await capped.ready
    try {
      const cappedPort = Number(new URL(capped.url).port)
      const sockets = await Promise.all(
        Array.from({ length: 8 }, async () => {
          const socket = net.connect(cappedPort, '127.0.0.1')
          await once(socket, 'connect')
          return socket
        }),
      )
      const extra = net.connect(cappedPort, '127.0.0.1')
      extra.on('error', () => {})
      await once(extra, 'close')
      const scrape = await (await fetch(`${capped.adminUrl}/metrics`)).text()
      expect(scrape).toMatch(/^http_requests_refused_total\{reason="max_connections"\} 1$/m)
      for (const socket of sockets) socket.destroy()
      // with room again, requests are served
      await expect.poll(async () => (await fetch(`${capped.url}/healthz`)).status, { timeout: 10_000 }).toBe(200)
    } finally {
      await capped.stop()
    }
  })

  it('closes connections that hold their place past MAX_CONNECTIONS for a delivery, slow bodies with a signature first', async () => {
    // every connection the listener takes holds a request whose body is arriving slowly, with a signature
    // header that is well-formed (it cannot be checked before the body is whole)
    const { own, ownMetric, ownPort } = await startOwnService({ MAX_CONNECTIONS: '8', SLOW_BODY_MS: '200' })
    try {
      const stalled = await openStalledBodies({ port: ownPort, connections: 8, contentLength: 1000, sentBytes: 1 })
      held.push(...stalled.map((client) => client.socket))
      // a delivery gets in once a stalled one has held its place for SLOW_BODY_MS (before, every connection
      // attempt was dropped for as long as the bodies kept coming)
      const { body, headers } = delivery('room-for-a-delivery')
      await expect
        .poll(async () => (await fetch(`${own.url}/webhooks/partner`, { method: 'POST', headers, body }).catch(() => undefined))?.status, {
          timeout: 10_000,
          interval: 100,
        })
        .toBe(200)
      expect(await ownMetric(/^http_requests_refused_total\{reason="slow_connection"\} (\d+)/m)).toBeGreaterThanOrEqual(1)
      // the one closed for it was told why
      const cut = stalled.filter((client) => client.closed)
      expect(cut.length).toBeGreaterThanOrEqual(1)
      expect(cut.every((client) => client.status === 503)).toBe(true)
    } finally {
      await own.stop()
    }
  })

  it('refuses a delivery without a well-formed X-Partner-Signature from its headers, without reading its body', async () => {
    const socket = net.connect(port, '127.0.0.1')
    held.push(socket)
    await once(socket, 'connect')
    let answer = ''
    socket.on('data', (chunk) => (answer += chunk.toString('latin1')))
    const closed = once(socket, 'close')
    // the headers and 1 byte of a 1,000-byte body, then nothing: only the headers can have been judged
    socket.write('POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nX-Partner-Delivery-Id: unsigned-slow\r\n\r\n{')
    await closed
    expect(answer).toMatch(/^HTTP\/1\.1 401 /)
    expect(answer).toContain('"code":"invalid_signature"')
    expect(answer).toMatch(/\r\nconnection: close\r\n/i)
  })

})
