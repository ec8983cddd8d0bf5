// The connections of a listener and the requests on each: for a stop that can wait no longer (its requests not
// answered yet are told so, server.ts), and for the public listener's cap of MAX_CONNECTIONS.
//
// The cap makes room for a new connection when they are all open: a connection that has been waiting for a request,
// or receiving one's headers or body, for SLOW_BODY_MS or more is closed for it, the one waiting or receiving the
// longest first. A connection whose request was received whole and is being answered is never closed for another.
// Node's own cap (server.maxConnections) dropped every new connection past it. A thousand connections that sent a
// request's headers and then its body a byte every few seconds took them all, and kept them for the 30 s a request
// may last; re-opened as they were cut off, they kept the platform's deliveries out for as long as their client
// liked (no signature needed: the body comes before it is verified). A delivery arrives whole in milliseconds on
// a connection of its own or on one kept alive, so only what holds a connection without using it is closed, and
// keeping the listener full now takes opening every connection afresh within SLOW_BODY_MS, which is a flood.
//
// Each request is noted as it begins, by the listener's own request function, and nothing listens for its end:
// whether it was answered is read from its response when it matters (a new connection past the cap, a stop). A
// 'close' listener on every response, with a second 'request' listener, cost 14-48 µs of the service's CPU a
// request in four alternating pairs (bench/ab-cpu.ts).
import type http from 'node:http'
import type { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import { performance } from 'node:perf_hooks'
import { refuseAndClose } from './json-answer.js'

/** How long a client refused on its way (cut for a new connection, or by the parser: server.ts) has to read its answer. */
const CLOSE_AFTER_ANSWER_MS = 1_000

const CUT_MESSAGE =
  'Every connection the service takes was open; this one had been receiving its request for too long and was closed for a new one. Retry'

interface Exchange {
  request: http.IncomingMessage
  response: http.ServerResponse
}

interface OpenConnection {
  /** When its latest request began after none was in flight, or when it opened: since then it waits or receives. */
  since: number
  /**
   * Its requests, from the first whose answer was not yet written out to the client when the latest began (more than
   * one when pipelined, or when the client does not read its answers).
   */
  readonly exchanges: Exchange[]
}

// Requests on one connection whose answers are not yet written out to the client, at most: past it the client is
// not reading them, and the connection is closed. Node stops reading a connection whose answers back up only after
// the chunk it is parsing, and starts again as the client's side takes a few more bytes: two to eight clients
// pipelining `GET /healthz` 200,000 times without reading an answer made the service parse and answer requests for
// them until the buffers on both sides were full, and every other client waited 7 to 20 s for an answer, with the
// process at 550 MB (an outside attack). A client that reads its answers has one or two in flight.
export const MAX_PIPELINED = 64

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

export interface OpenConnections {
  /**
   * Called by the listener's request function as each request begins (`checkContinue` ones too). False when the
   * request is not to be served: its connection was closed, as one whose client reads none of its answers
   * (MAX_PIPELINED).
   */
  began(request: http.IncomingMessage, response: http.ServerResponse): boolean
  /** The responses not begun yet: of requests still arriving or being answered. */
  unanswered(): http.ServerResponse[]
  /** The request on `socket` whose headers were read and not all of its body (the latest; they are read in turn). */
  receiving(socket: Duplex): http.IncomingMessage | undefined
  /** The answer due last on `socket`: that of the latest request read whole whose answer is not all written yet. */
  lastDue(socket: Duplex): http.ServerResponse | undefined
}

const answered = (response: http.ServerResponse) => response.writableEnded || response.destroyed

/** Follows `server`'s connections and their requests, and caps them when `cap` is given. */
export function watchConnections(server: http.Server, cap?: ConnectionCapOptions): OpenConnections {
  const now = cap?.now ?? (() => performance.now())
  // in the order they opened
  const open = new Map<Socket, OpenConnection>()

  // the connection waiting or receiving the longest, once past slowMs; undefined when none may be closed
  const longestIdle = (at: number, slowMs: number): [Socket, OpenConnection] | undefined => {
    let found: [Socket, OpenConnection] | undefined
    for (const entry of open) {
      const [, connection] = entry
      if (at - connection.since < slowMs || (found && found[1].since <= connection.since)) continue
      // a request received whole and not answered is being worked on: its connection is in use
      if (connection.exchanges.some(({ request, response }) => request.complete && !answered(response))) continue
      found = entry
    }
    return found
  }

  const cut = (socket: Socket, connection: OpenConnection) => {
    open.delete(socket)
    cap?.onCut?.()
    // a request still arriving is told why (the budget's cut of a slow body answers the same way)
    const arriving = connection.exchanges.find(({ response }) => !response.headersSent && !answered(response))?.response
    if (!arriving) {
      socket.destroy()
      return
    }
    refuseAndClose(arriving, 503, 'overloaded', CUT_MESSAGE, { 'Retry-After': '1' })
    // no more of its body is read
    socket.pause()
    closeInAMoment(socket)
  }

  server.on('connection', (socket: Socket) => {
    if (cap && open.size >= cap.maxConnections) {
      const idle = longestIdle(now(), cap.slowMs)
      if (!idle) {
        socket.destroy()
        cap.onDropped?.()
        return
      }
      cut(...idle)
    }
    open.set(socket, { since: now(), exchanges: [] })
    socket.once('close', () => open.delete(socket))
  })

  return {
    began(request, response) {
      const { socket } = request
      // the rest of a chunk Node parsed before the connection below was closed
      if (socket.destroyed) return false
      const connection = open.get(socket)
      if (!connection) return true
      // the ones written out are let go here, in place, so a kept-alive connection holds its latest request at most
      const { exchanges } = connection
      let kept = 0
      let unansweredCount = 0
      for (const exchange of exchanges) {
        if (exchange.response.writableFinished || exchange.response.destroyed) continue
        exchanges[kept++] = exchange
        if (!answered(exchange.response)) unansweredCount++
      }
      exchanges.length = kept
      if (kept >= MAX_PIPELINED) {
        open.delete(socket)
        socket.destroy()
        return false
      }
      if (unansweredCount === 0) connection.since = now()
      exchanges.push({ request, response })
      return true
    },
    unanswered() {
      const waiting: http.ServerResponse[] = []
      for (const { exchanges } of open.values()) {
        for (const { response } of exchanges) if (!response.headersSent && !answered(response)) waiting.push(response)
      }
      return waiting
    },
    receiving(socket) {
      const latest = open.get(socket as Socket)?.exchanges.at(-1)?.request
      return latest?.complete === false ? latest : undefined
    },
    lastDue(socket) {
      const exchanges = open.get(socket as Socket)?.exchanges ?? []
      return exchanges.findLast(({ request, response }) => request.complete && !response.writableFinished)?.response
    },
  }
}

/** Closes `socket` once its client had a moment to read the answer written on it, unless it closed first. */
export function closeInAMoment(socket: Socket | Duplex): void {
  const closing = setTimeout(() => socket.destroy(), CLOSE_AFTER_ANSWER_MS).unref()
  socket.once('close', () => clearTimeout(closing))
}
