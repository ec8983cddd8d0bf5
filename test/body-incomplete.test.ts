// A request whose client ends its side of the connection part-way through the body (Content-Length 1000, 10 bytes
// sent, then a half-close) was answered 400 invalid_payload "The request is not valid HTTP", though it was only
// unfinished. It is answered 400 body_incomplete, saying how much came where its body's reader knows, and its
// connection closed after the answer. (The webhook endpoint's answer and its count: test/limits.test.ts.)
import { once } from 'node:events'
import type http from 'node:http'
import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { listen, type RunningServer } from '../src/http/server.js'
import type { RunningService } from '../src/service.js'
import { testLogger } from './helpers/log-sink.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { startTestService } from './helpers/test-service.js'

const ADMIN_TOKEN = 'admin-token-0123456789abcdef0123456789'

/** Sends `head` and `sent` of the body, then ends the client's side; the answer, and how long the connection stayed after. */
async function cutShort(url: string, head: string, sent: string) {
  const socket = net.connect(Number(new URL(url).port), '127.0.0.1')
  let answer = ''
  socket.on('data', (chunk: Buffer) => (answer += chunk.toString('latin1')))
  socket.on('error', () => {})
  const closed = once(socket, 'close')
  await once(socket, 'connect')
  socket.write(`${head}\r\n${sent}`)
  // the body's bytes are read before the end comes
  await new Promise((resolve) => setTimeout(resolve, 200))
  const ended = performance.now()
  socket.end()
  await closed
  const [status = '', body = 'null'] = answer.split('\r\n\r\n')
  return { status: status.split('\r\n')[0], headers: status, body: JSON.parse(body) as unknown, closedAfterMs: performance.now() - ended }
}

describe('a request whose client ended its side part-way through the body', () => {
  let service: RunningService
  beforeAll(async () => {
    service = await startTestService({
      config: testConfig({ PORT: '0', POLL_ENABLED: 'false', ADMIN_TOKEN }),
      logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET, ADMIN_TOKEN]),
    })
    await service.ready
  })
  afterAll(() => service.stop())

  it('a console form: 400 body_incomplete, N of M bytes, and the connection closed after the answer', async () => {
    const host = new URL(service.adminUrl).host
    const answer = await cutShort(
      service.adminUrl,
      `POST /console/login HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n`,
      'token=0123',
    )
    expect(answer.status).toBe('HTTP/1.1 400 Bad Request')
    expect(answer.headers).toMatch(/\r\nConnection: close(\r\n|$)/i)
    expect(answer.body).toEqual({ error: { code: 'body_incomplete', message: 'The request ended before its body did: 10 of 1000 bytes' } })
    expect(answer.closedAfterMs).toBeLessThan(2_000)
  })
})

describe('a request nothing is reading the body of when its client ends its side', () => {
  let running: RunningServer | undefined
  afterAll(() => running?.stop(0))

  it('is answered 400 body_incomplete by the listener, and its connection closed', async () => {
    // an application that would answer only 3 s later, the body unread
    const waiting: http.RequestListener = (_req, res) => {
      setTimeout(() => {
        if (!res.headersSent) res.end('late')
      }, 3_000).unref()
    }
    running = await listen(waiting, { port: 0, host: '127.0.0.1' })
    const answer = await cutShort(running.url, 'POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n', '0123456789')
    expect(answer.status).toBe('HTTP/1.1 400 Bad Request')
    expect(answer.body).toEqual({ error: { code: 'body_incomplete', message: 'The request ended before its body did' } })
    expect(answer.closedAfterMs).toBeLessThan(2_000)
  })
})
