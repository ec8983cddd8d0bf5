// Listening and stopping. The timeouts cut off clients that send headers or bodies byte by byte;
// stop() refuses new connections, lets in-flight requests finish, then closes what is left.
import { once } from 'node:events'
import http, { STATUS_CODES } from 'node:http'
import type { Duplex } from 'node:stream'
import type { AddressInfo } from 'node:net'
import { AppError, type ErrorCode, errorBody } from './app-error.js'
import { closeInAMoment, type ConnectionCapOptions, type OpenConnections, watchConnections } from './connection-cap.js'
import { checkContinue } from './expect-continue.js'
import { refuseAndClose } from './json-answer.js'
import { describeListenError } from '../listen-error.js'

export interface ServerTimeouts {
  headersTimeoutMs: number
  requestTimeoutMs: number
  keepAliveTimeoutMs: number
}

export const DEFAULT_TIMEOUTS: ServerTimeouts = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 30_000,
  keepAliveTimeoutMs: 5_000,
}

export interface RunningServer {
  readonly server: http.Server
  readonly url: string
  /** Stops accepting, waits for in-flight requests up to `graceMs`, then drops what is left. */
  stop(graceMs: number): Promise<void>
}

export async function listen(
  app: http.RequestListener,
  {
    port,
    host,
    timeouts = DEFAULT_TIMEOUTS,
    connectionCap,
    settings = { port: 'PORT', host: 'HOST' },
    onTimedOut,
    onBodyIncomplete,
  }: {
    port: number
    host: string
    timeouts?: ServerTimeouts
    /**
     * Open connections at once (each holds buffers and a parser), and room made past it for a new one by closing
     * one that held its place without using it (connection-cap.ts).
     */
    connectionCap?: ConnectionCapOptions
    /** The variables that chose the port and host, named when the listener cannot open (PORT, HOST). */
    settings?: { port: string; host: string }
    /** A request cut off at headersTimeout or requestTimeout, answered 408 (the public listener counts it). */
    onTimedOut?: () => void
    /** A request whose client's end came part-way through its body, refused 400 `body_incomplete` (counted likewise). */
    onBodyIncomplete?: () => void
  },
): Promise<RunningServer> {
  const server = http.createServer({
    headersTimeout: timeouts.headersTimeoutMs,
    requestTimeout: timeouts.requestTimeoutMs,
    keepAliveTimeout: timeouts.keepAliveTimeoutMs,
    // Node enforces the two timeouts above on this interval (30 s by default): check often enough
    // that a client trickling bytes is cut off close to its deadline
    connectionsCheckingInterval: Math.max(100, Math.min(1_000, timeouts.headersTimeoutMs / 2)),
    // checked by requiringHost instead, which answers in the error shape (Node's answer is an empty 400)
    requireHostHeader: false,
  })
  // every header a request has, within the 16 KB of headers Node reads: past Node's default count (2,000) the rest were
  // dropped unseen, and a second Host, an X-Partner-Signature or a Content-Encoding placed after 2,000 filler headers
  // escaped the checks made on them (an outside attack)
  server.maxHeadersCount = 0
  // A client that half-closes its side once its request is written (shutdown(SHUT_WR)) still reads the answer (RFC
  // 9112 9.6 lets it). Under Node's default the client's FIN aborted the request: a new delivery, answered after its
  // insert, was stored and its 200 never written, and the platform sent it again (an outside tester). Now the answer
  // goes out, then the connection is closed; one left idle or unanswered is cut by the timeouts above, as any is.
  // (Node's own switch for this, read by its HTTP server since Node 0.x but not in its documentation or types: the
  // test of it, test/request-framing.test.ts, runs on every Node CI runs.)
  ;(server as http.Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true
  // its connections and their requests: for the cap, and for a stop that can wait no longer (connection-cap.ts)
  const connections = watchConnections(server, connectionCap)
  const listener = wellFramedOnly(app, connections)
  server.on('request', listener)
  // a request with `Expect: 100-continue` reaches the app unanswered: it says continue when it reads the body
  server.on('checkContinue', checkContinue(listener))
  // any other expectation (Node's answer is an empty 417), once the request is one this listener reads at all
  server.on('checkExpectation', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const refusal = framingRefusal(req)
    if (refusal) refuseAndClose(res, ...refusal)
    else refuseAndClose(res, 417, 'expectation_failed', 'Expect: only 100-continue is understood')
  })
  server.on('clientError', (error: Error & { code?: string }, socket: Duplex) => {
    if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') onTimedOut?.()
    answerClientError(error, socket, connections, onBodyIncomplete)
  })
  // neither listener is a proxy (Node closed a CONNECT's connection without a word)
  server.on('connect', (_req: http.IncomingMessage, socket: Duplex) =>
    answerOnSocket(socket, 405, 'method_not_allowed', 'CONNECT is not accepted here: this service is no proxy'),
  )
  server.listen(port, host)
  try {
    await once(server, 'listening')
  } catch (error) {
    throw describeListenError(error, { portSetting: settings.port, hostSetting: settings.host, port, host })
  }
  const address = server.address() as AddressInfo
  const shownHost = address.family === 'IPv6' ? `[${address.address}]` : address.address
  return {
    server,
    url: `http://${shownHost}:${address.port}`,
    stop: async (graceMs) => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()))
      server.closeIdleConnections()
      const timer = setTimeout(() => {
        // A request still waiting for its answer (its statement held up by a database gone silent) is told to come
        // again before its connection is closed; it used to see the connection close with no answer at all
        for (const res of connections.unanswered()) {
          refuseAndClose(res, 503, 'not_ready', 'Shutting down: this request could not be answered in time; retry', { 'Retry-After': '1' })
        }
        server.closeAllConnections()
      }, graceMs)
      await closed
      clearTimeout(timer)
    },
  }
}

// Every request, `Expect: 100-continue` ones too, is noted among its connection's as it begins, and one whose
// framing or target Node's parser let through but that is not what HTTP/1.1 allows is refused before the app sees
// it, its connection closed (framingRefusal).
function wellFramedOnly(app: http.RequestListener, connections: OpenConnections): http.RequestListener {
  return (req, res) => {
    if (!connections.began(req, res)) return
    const refusal = framingRefusal(req)
    if (refusal) {
      refuseAndClose(res, ...refusal)
      return
    }
    app(req, res)
  }
}

/**
 * Why a request Node's parser took is refused (an outside tester found each answered as any other), or undefined.
 * Node's own Host check answered an empty 400 with no code; the others it did not make at all.
 */
function framingRefusal(req: http.IncomingMessage): [number, ErrorCode, string] | undefined {
  // Node takes HTTP/0.9 and HTTP/2.0 in a request line and parses the rest as HTTP/1.1
  if (req.httpVersionMajor !== 1) {
    return [505, 'http_version_not_supported', `HTTP/${req.httpVersion} is not spoken here: send HTTP/1.1 or HTTP/1.0`]
  }
  // RFC 9112 6.1: an HTTP/1.0 message with a Transfer-Encoding is faulty framing (Node read its body as chunked,
  // where an HTTP/1.0 proxy in front reads it up to the close: two readers, two bodies)
  if (req.httpVersionMinor === 0 && req.headers['transfer-encoding'] !== undefined) {
    return [400, 'invalid_payload', 'An HTTP/1.0 request cannot carry Transfer-Encoding: send a Content-Length, or HTTP/1.1']
  }
  // RFC 9112 3.2: which of two a proxy in front read is anyone's guess (Node keeps the first)
  const hosts = hostHeaders(req.rawHeaders)
  if (hosts > 1) return [400, 'duplicate_header', `A request carries one Host header; this one has ${hosts}`]
  if (req.httpVersionMinor === 1 && hosts === 0) return [400, 'invalid_payload', 'An HTTP/1.1 request needs a Host header']
  // RFC 9112 3.2: a client never sends a fragment; Node left it in the target, where it read as part of the path
  if (req.url?.includes('#') === true) {
    return [400, 'invalid_payload', 'A request target cannot hold a fragment (#): a client never sends one']
  }
  return undefined
}

/** How many Host headers a request has (Node's `headers` keeps the first; its `headersDistinct` builds every header's). */
function hostHeaders(rawHeaders: string[]): number {
  let count = 0
  for (let i = 0; i < rawHeaders.length; i += 2) if (rawHeaders[i]!.length === 4 && rawHeaders[i]!.toLowerCase() === 'host') count++
  return count
}

// Requests Node's parser refuses before the app sees them (headers over 16 KB, malformed HTTP, a client
// too slow to finish) still get the one error shape, then the connection is closed.
function answerClientError(
  error: Error & { code?: string },
  socket: Duplex,
  connections: OpenConnections,
  onBodyIncomplete: (() => void) | undefined,
): void {
  if (error.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy()
    return
  }
  // Bytes that cannot be parsed behind a request still being answered on the connection (pipelined after it, or sent
  // after its `Connection: close`): that request's answer goes out first, and the connection closes after it. The
  // refusal used to be written ahead of it, and a delivery stored was never answered 200.
  const answering = (socket as Duplex & { _httpMessage?: http.ServerResponse | null })._httpMessage
  // (the parser's refusals of bytes, and the end of a half-closed connection part-way through the next request, whose
  // client still reads: a delivery stored and answered after that end was never answered; not a request timed out)
  const unparseable = error.code?.startsWith('HPE_') === true
  if (unparseable && answering && !answering.writableFinished && answering.req.complete) {
    // after the answers of every request read whole: ended after the first, the connection lost a second pipelined
    // delivery's 200, that delivery stored (found from outside)
    const last = connections.lastDue(socket) ?? answering
    last.shouldKeepAlive = false
    last.once('finish', () => socket.end())
    // the request behind it whose body was arriving when the parser stopped (the client's end, or bytes it refused: a
    // chunk size that is no number) is refused now, its body's bytes given back
    const unfinished = connections.receiving(socket)
    if (unfinished === undefined) return
    if (error.code !== 'HPE_INVALID_EOF_STATE') endUnfinished(unfinished)
    else if (endIncomplete(unfinished)) onBodyIncomplete?.()
    return
  }
  // the client's end part-way through the body of the request being received, no answer ahead of it: it was only
  // unfinished, not HTTP that could not be read (it was answered 400 "The request is not valid HTTP")
  if (error.code === 'HPE_INVALID_EOF_STATE' && answering && !answering.headersSent && answering.req === connections.receiving(socket)) {
    onBodyIncomplete?.()
    refuseIncomplete(answering)
    return
  }
  // data after a `Connection: close` request whose answer went out: the connection is closing, and that is no error
  if (error.code === 'HPE_CLOSED_CONNECTION') {
    socket.destroy()
    return
  }
  const version = error.code === 'HPE_INVALID_VERSION' ? versionRefused(error) : undefined
  const [status, code, message]: [number, ErrorCode, string] =
    error.code === 'HPE_HEADER_OVERFLOW'
      ? [431, 'header_too_large', 'The request headers are larger than 16 KB']
      : error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? [408, 'request_timeout', 'The request was not received in time']
        : version !== undefined
          ? [505, 'http_version_not_supported', `HTTP/${version} is not spoken here: send HTTP/1.1 or HTTP/1.0`]
          : [400, 'invalid_payload', 'The request is not valid HTTP']
  answerOnSocket(socket, status, code, message)
}

/**
 * Ends the request whose body was still arriving when the parser refused bytes of its framing (a chunk size that is no
 * number) behind an answer still being made. Node ends such a request only when the connection closes, after that
 * answer, and until then its body reader held the body, and its bytes in the in-flight budget (test/limits.test.ts).
 * The reader listens for the request's errors while it reads: it stops at this one and gives them back now. Its
 * refusal waits behind that answer, never written.
 */
function endUnfinished(req: http.IncomingMessage): void {
  if (req.listenerCount('error') > 0) req.emit('error', new AppError(400, 'invalid_payload', 'The request body is not valid HTTP'))
}

/**
 * Ends the request whose client's end came part-way through its body, as Node does only once the connection closes:
 * its body reader (raw-body) stops at the request's 'aborted', gives back its bytes in the in-flight budget, and
 * refuses it 400 `body_incomplete` saying how much came (error-handler.ts). False when nothing reads the body.
 */
function endIncomplete(req: http.IncomingMessage): boolean {
  if (req.listenerCount('aborted') === 0) return false
  req.emit('aborted')
  return true
}

/**
 * Answers 400 `body_incomplete` the request whose client's end came part-way through its body: its body reader does
 * (endIncomplete), in the same turn; where none did, it is answered here without the count. Either answer closes the
 * connection: nothing more can come on it (a kept-alive one stayed open for the keep-alive timeout, 5 s, after it).
 */
function refuseIncomplete(res: http.ServerResponse): void {
  res.shouldKeepAlive = false
  endIncomplete(res.req)
  setImmediate(() => {
    if (res.headersSent || res.destroyed) return
    refuseAndClose(res, 400, 'body_incomplete', 'The request ended before its body did')
  })
}

/**
 * The version a request line names in digits (`HTTP/2.1`, `HTTP/3.0`, `HTTP/1.9`) that Node's parser refused, or
 * undefined when what it refused is no version at all (`HTTP/x`), which is no HTTP. The line is the one the parser
 * stopped in, within the bytes it was given (a request pipelined behind another starts part-way).
 */
function versionRefused(error: Error & { rawPacket?: unknown; bytesParsed?: unknown }): string | undefined {
  const { rawPacket, bytesParsed } = error
  if (!Buffer.isBuffer(rawPacket) || typeof bytesParsed !== 'number') return undefined
  const lineStart = bytesParsed > 0 ? rawPacket.lastIndexOf(0x0a /* \n */, bytesParsed - 1) + 1 : 0
  const requestLine = rawPacket.subarray(lineStart, lineStart + 16 * 1024).toString('latin1')
  const version = /^[!-~]+ [!-~]+ HTTP\/(\d{1,3}\.\d{1,3})\r?\n/.exec(requestLine)?.[1]
  return version === '1.1' || version === '1.0' ? undefined : version
}

/** An answer in the error shape written on the connection itself (no response object), which is then closed. */
function answerOnSocket(socket: Duplex, status: number, code: ErrorCode, message: string): void {
  const body = JSON.stringify(errorBody(code, message))
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  )
  // end() closes our side only: a client that never closes its own kept the connection, and a request cut off
  // 408 kept its body's reservation in the in-flight budget (it is given back when the connection closes), so
  // 64 silent connections refused every delivery 503 overloaded for as long as they stayed. A moment for the
  // answer to be read, then the connection is closed
  closeInAMoment(socket)
}
