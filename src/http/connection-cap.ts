// At most MAX_CONNECTIONS open connections on the public listener, and room made for a new one when they are all
// open: a connection that has been waiting for a request, or receiving one's headers or body, for SLOW_BODY_MS or
// more is closed for it, the one waiting or receiving the longest first. A connection whose request was received
// whole and is being answered is never closed for another.
//
// Node's own cap (server.maxConnections) drops every new connection past it. A thousand connections that sent a
// request's headers and then its body a byte every few seconds took them all, and kept them for the 30 s a request
// may last; re-opened as they were cut off, they kept the platform's deliveries out for as long as their client
// liked (no signature needed: the body comes before it is verified). A delivery arrives whole in milliseconds on
// a connection of its own or on one kept alive, so only what holds a connection without using it is closed, and
// keeping the listener full now takes opening every connection afresh within SLOW_BODY_MS, which is a flood.
import type http from 'node:http'
import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'
import { errorBody } from './app-error.js'

/** How long a request cut for a new connection has to read its 503 before its connection is closed. */
const CUT_CLOSE_MS = 1_000

const CUT_MESSAGE =
  'Every connection the service takes was open; this one had been receiving its request for too long and was closed for a new one. Retry'

interface OpenConnection {
  /** When it last began waiting for a request (its start, its last answer) or receiving one. */
  since: number
  /** Its requests not answered yet (more than one when pipelined), with their responses. */
  readonly requests: Map<http.IncomingMessage, http.ServerResponse>
}

export interface ConnectionCapOptions {
  maxConnections: number
  /** SLOW_BODY_MS: how long a connection may wait or receive before it is closed for a new one. */
  slowMs: number
  /** A new connection dropped: every open one was answering a request, or had not been waiting or receiving that long. */
  onDropped?: (() => void) | undefined
  /** An open connection closed for a new one. */
  onCut?: (() => void) | undefined
  /** Milliseconds on a monotonic clock (a test's stand-in; performance.now by default). */
  now?: (() => number) | undefined
}

/** What the cap is told of each request (server.ts tells it, from the one listener it keeps per request). */
export interface RequestWatch {
  /** A request began on its connection (`request`, or `checkContinue` for one with `Expect: 100-continue`). */
  began(request: http.IncomingMessage, response: http.ServerResponse): void
  /** Its response closed: answered, or its connection gone. */
  ended(request: http.IncomingMessage): void
}

export function capConnections(
  server: http.Server,
  { maxConnections, slowMs, onDropped, onCut, now = () => performance.now() }: ConnectionCapOptions,
): RequestWatch {
  // in the order they opened
  const open = new Map<Socket, OpenConnection>()

  // the connection waiting or receiving the longest, once past slowMs; undefined when none may be closed
  const longestIdle = (at: number): [Socket, OpenConnection] | undefined => {
    let found: [Socket, OpenConnection] | undefined
    for (const entry of open) {
      const [, connection] = entry
      if (at - connection.since < slowMs || (found && found[1].since <= connection.since)) continue
      // a request received whole is being answered: its connection is in use
      if ([...connection.requests.keys()].some((request) => request.complete)) continue
      found = entry
    }
    return found
  }

  const cut = (socket: Socket, connection: OpenConnection) => {
    open.delete(socket)
    onCut?.()
    // a request still arriving is told why (the budget's cut of a slow body answers the same way)
    const answering = [...connection.requests.values()].find((response) => !response.headersSent && !response.writableEnded)
    if (!answering) {
      socket.destroy()
      return
    }
    const body = JSON.stringify(errorBody('overloaded', CUT_MESSAGE))
    answering.writeHead(503, {
      'Content-Type': 'application/json; charset=utf-8',
      'Content-Length': Buffer.byteLength(body),
      Connection: 'close',
      'Retry-After': '1',
    })
    answering.end(body)
    // no more of its body is read; a moment for the answer to be read, then the connection is closed
    socket.pause()
    const closing = setTimeout(() => socket.destroy(), CUT_CLOSE_MS).unref()
    socket.once('close', () => clearTimeout(closing))
  }

  server.on('connection', (socket: Socket) => {
    if (open.size >= maxConnections) {
      const idle = longestIdle(now())
      if (!idle) {
        socket.destroy()
        onDropped?.()
        return
      }
      cut(...idle)
    }
    const connection: OpenConnection = { since: now(), requests: new Map() }
    open.set(socket, connection)
    socket.once('close', () => open.delete(socket))
  })

  return {
    began(request, response) {
      const connection = open.get(request.socket)
      if (!connection) return
      if (connection.requests.size === 0) connection.since = now()
      connection.requests.set(request, response)
    },
    ended(request) {
      const connection = open.get(request.socket)
      if (!connection?.requests.delete(request)) return
      if (connection.requests.size === 0) connection.since = now()
    },
  }
}
