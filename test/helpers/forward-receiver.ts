// A local HTTP receiver for forwarder tests: records every request as it arrived (headers and raw body)
// and answers with whatever the test scripts: a status, a redirect, or no answer at all. Over HTTPS when given a
// certificate and its key (then reached as https://localhost, the name the test certificate carries).
import http from 'node:http'
import https from 'node:https'
import type { AddressInfo } from 'node:net'
import { answerEndlessly } from './endless-answer.js'

export interface ReceivedRequest {
  method: string
  url: string
  headers: Record<string, string>
  rawBody: string
}

/**
 * A status, a status with headers (a Retry-After), a redirect to a location, a status with a body, a status with a body of `bodyBytes` written as fast
 * as it is read, a status whose body stalls after its first byte, or 'hang' (never answer: a timeout or an
 * abort must end it).
 */
export type ReceiverAnswer =
  | number
  | { status: number; headers: Record<string, string | string[]> }
  | { status: number; location: string }
  | { status: number; body: string }
  | { status: number; bodyBytes: number }
  | { status: number; bodyStalls: true }
  /** a status given `afterMs` after the request ended: a handler in flight meanwhile */
  | { status: number; afterMs: number }
  /** a status given once `when` resolves: a handler in flight until the test says */
  | { status: number; when: Promise<unknown> }
  /** a 103 Early Hints (an interim answer), then a final status, or the connection closed with no final answer */
  | { earlyHintsThen: number | 'close' }
  | 'hang'

export interface ForwardReceiver {
  url: string
  received: ReceivedRequest[]
  /** TCP connections the forwarder opened so far. */
  readonly connections: number
  /** For each `bodyBytes` answer that ended, or whose connection closed first: the bytes of its body written by then. */
  readonly bodyBytesWritten: number[]
  /** Resolves once `count` requests have arrived (body included). */
  waitFor(count: number): Promise<void>
  close(): Promise<void>
}

export async function startForwardReceiver(
  answer: (request: ReceivedRequest, count: number) => ReceiverAnswer = () => 204,
  tls?: { cert: Buffer; key: Buffer },
): Promise<ForwardReceiver> {
  const received: ReceivedRequest[] = []
  const bodyBytesWritten: number[] = []
  const waiters: { count: number; resolve: () => void }[] = []
  const onRequest: http.RequestListener = (req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      const request: ReceivedRequest = {
        method: req.method ?? '',
        url: req.url ?? '',
        headers: Object.fromEntries(Object.entries(req.headers).map(([name, value]) => [name, String(value)])),
        rawBody: Buffer.concat(chunks).toString('utf8'),
      }
      received.push(request)
      for (const waiter of waiters.filter((w) => w.count <= received.length)) waiter.resolve()
      const reply = answer(request, received.length)
      if (reply === 'hang') return
      if (typeof reply === 'number') res.writeHead(reply).end()
      else if ('headers' in reply) res.writeHead(reply.status, reply.headers).end()
      else if ('location' in reply) res.writeHead(reply.status, { location: reply.location }).end()
      else if ('afterMs' in reply) setTimeout(() => res.writeHead(reply.status).end(), reply.afterMs)
      else if ('when' in reply) void reply.when.then(() => res.writeHead(reply.status).end())
      else if ('bodyBytes' in reply) answerEndlessly(res, (written) => bodyBytesWritten.push(written), { size: reply.bodyBytes, status: reply.status })
      else if ('earlyHintsThen' in reply) {
        res.writeEarlyHints({ link: '</style.css>; rel=preload; as=style' })
        if (reply.earlyHintsThen === 'close') res.socket?.end()
        else res.writeHead(reply.earlyHintsThen).end()
      } else if ('bodyStalls' in reply) res.writeHead(reply.status, { 'content-length': 1024 }).write(' ')
      else res.writeHead(reply.status, { 'content-type': 'text/plain' }).end(reply.body)
    })
  }
  const server = tls ? https.createServer(tls, onRequest) : http.createServer(onRequest)
  let connections = 0
  server.on('connection', () => {
    connections += 1
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    get connections() {
      return connections
    },
    url: `${tls ? 'https://localhost' : 'http://127.0.0.1'}:${(server.address() as AddressInfo).port}/hooks/escrow`,
    received,
    bodyBytesWritten,
    waitFor: (count) =>
      received.length >= count ? Promise.resolve() : new Promise((resolve) => waiters.push({ count, resolve })),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}
