// A budget of request body bytes being read or held at once (MAX_INFLIGHT_BODY_BYTES). A request's body is
// counted as it arrives, chunk by chunk, and given back when its answer is sent, its read fails (the reader drops
// what it read) or its connection closes.
// A request whose announced length does not fit in what is free is answered 503 `overloaded` before its
// body is read; a chunk that does not fit ends its request the same way, its connection closed. So clients
// that open many requests and never finish their bodies hold at most the budget, not the process's memory,
// and holding it takes sending it: headers alone hold nothing. (Each request used to reserve its
// Content-Length, or the whole body limit when chunked, from its headers: 64 connections that sent a chunked
// request's headers and nothing else held the default budget, and every delivery was refused until they
// were cut off, 30 s later, again and again.)
//
// Nor can bodies sent slowly keep it: when a request does not fit, the body that has been arriving the longest is cut
// to make room (503 `overloaded` to it, its connection closed), and the next after it, for as long as the new one
// does not fit, while they have been arriving for SLOW_BODY_MS (1 s) or more. A delivery's body comes in
// milliseconds; one still arriving after a second is a slow link or a client holding the budget. Holding it used to
// take only sending it over the 30 s a request may last: 16 MB in 30 s, about 0.55 MB/s, refused every delivery.
// Now each held body must be replaced within SLOW_BODY_MS.
import { performance } from 'node:perf_hooks'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { Metrics } from '../metrics/metrics.js'
import { AppError } from './app-error.js'
import { refuseAndClose } from './json-answer.js'

/** A body being read, in the order they began: the first is the one arriving the longest. */
interface ArrivingBody {
  readonly since: number
  /** The bytes it holds now. */
  held(): number
  /** Ends the request with 503 and gives its bytes back at once. */
  cut(): void
}

export class InflightBodyBudget {
  private reserved = 0
  private readonly arriving = new Set<ArrivingBody>()

  constructor(
    readonly capacityBytes: number,
    /** How long a body may have been arriving before it is cut to make room for another (SLOW_BODY_MS). */
    readonly slowBodyMs = Number.POSITIVE_INFINITY,
  ) {}

  /**
   * Whether `bytes` fit, once the bodies arriving for slowBodyMs or more are cut, the longest arriving first, as
   * many as it takes and no more. When cutting every such body would not make room, none is cut.
   */
  makeRoom(bytes: number): boolean {
    if (this.fits(bytes)) return true
    const now = performance.now()
    const cut: ArrivingBody[] = []
    let freed = 0
    for (const body of this.arriving) {
      if (this.reserved - freed + bytes <= this.capacityBytes || now - body.since < this.slowBodyMs) break
      cut.push(body)
      freed += body.held()
    }
    if (this.reserved - freed + bytes > this.capacityBytes) return false
    for (const body of cut) {
      body.cut()
      this.arriving.delete(body)
    }
    return this.fits(bytes)
  }

  /** Counts a body among those arriving until the returned function is called (its read ended). */
  beginArriving(held: () => number, cut: () => void): () => void {
    const body: ArrivingBody = { since: performance.now(), held, cut }
    this.arriving.add(body)
    return () => this.arriving.delete(body)
  }

  fits(bytes: number): boolean {
    return this.reserved + bytes <= this.capacityBytes
  }

  /** Takes `bytes` from the budget; false (and nothing taken) when they do not fit. */
  tryReserve(bytes: number): boolean {
    if (!this.fits(bytes)) return false
    this.reserved += bytes
    return true
  }

  release(bytes: number): void {
    this.reserved -= bytes
  }

  get reservedBytes(): number {
    return this.reserved
  }
}

const SPENT_MESSAGE = 'Too many request bodies are being received at once; retry later'
const SLOW_MESSAGE = 'This body was still arriving when the bodies being received filled the budget, and was cut for a newer one; retry later'

/**
 * A body refused part-way: its next chunk did not fit in the budget, or it was cut for a newer request while it
 * arrived slowly (503 `overloaded`).
 */
export class BodyBudgetSpent extends AppError {
  constructor(slow = false) {
    super(503, 'overloaded', slow ? SLOW_MESSAGE : SPENT_MESSAGE)
  }
}

export interface BodyAdmission {
  /**
   * Runs `read` (which reads the request's body) with every chunk counted into the budget as it arrives.
   * Rejects with BodyBudgetSpent when a chunk does not fit, and the body reader stops.
   */
  read(read: () => Promise<Buffer>): Promise<Buffer>
}

interface BudgetDeps {
  budget: InflightBodyBudget
  bodyLimitBytes: number
  metrics?: Metrics | undefined
}

/**
 * Admits a request whose announced length (one byte when it announces none) fits in what the budget has free;
 * undefined when it does not: the request was answered 503 `overloaded`, its connection closed. Whatever its
 * body counts into the budget is given back when its answer is sent, its read fails or its connection closes.
 */
export function admitBody(req: IncomingMessage, res: ServerResponse, deps: BudgetDeps): BodyAdmission | undefined {
  const { budget, bodyLimitBytes, metrics } = deps
  const announced = req.headers['content-length']
  const length = announced === undefined ? undefined : Number(announced)
  // a malformed length, or one over the limit, is refused by the body reader (400, 413) without reading
  const readable = length === undefined || (Number.isSafeInteger(length) && length >= 0 && length <= bodyLimitBytes)
  if (readable && !budget.makeRoom(length ?? 1)) {
    metrics?.requestsRefused.inc({ reason: 'body_budget' })
    refuseAndClose(res, 503, 'overloaded', SPENT_MESSAGE, { 'Retry-After': '1' })
    return undefined
  }
  let held = 0
  let released = false
  const releases = heldOn(req.socket)
  const release = () => {
    if (!releases.delete(release)) return
    released = true
    budget.release(held)
    metrics?.inflightBodyBytes.dec(held)
  }
  releases.add(release)
  res.once('close', release)
  return {
    read: async (read) => {
      let spent = false
      const refuse = (slow: boolean) => {
        spent = true
        metrics?.requestsRefused.inc({ reason: slow ? 'slow_body' : 'body_budget' })
        // no more of it is read: the connection is closed once the answer is written
        req.socket.pause()
        // the body reader listens for the stream's errors while it reads, and stops on one
        if (req.listenerCount('error') > 0) req.emit('error', new BodyBudgetSpent(slow))
      }
      const count = (chunk: Buffer) => {
        if (released || spent) return
        // making room may cut this body itself, the one arriving longest: then its chunk is not taken
        const taken = budget.tryReserve(chunk.length) || (budget.makeRoom(chunk.length) && !spent && budget.tryReserve(chunk.length))
        if (taken) {
          held += chunk.length
          metrics?.inflightBodyBytes.inc(chunk.length)
          return
        }
        if (!spent) refuse(false)
      }
      // cut for a newer request: its bytes are given back at once, for that request to take
      const ended = budget.beginArriving(() => (released ? 0 : held), () => {
        if (released || spent) return
        refuse(true)
        release()
      })
      req.on('data', count)
      try {
        return await read()
      } catch (error) {
        // the reader dropped what it read: nothing is held, though its answer may wait behind another's (server.ts)
        release()
        throw error
      } finally {
        ended()
        req.removeListener('data', count)
      }
    },
  }
}

// The releases of each connection's requests not yet answered. An answer queued behind another on a
// pipelined connection gets the socket only when its turn comes, so when the client goes away first it
// never emits 'close' (nor 'finish'): its bytes are given back when the connection closes.
const heldByConnection = new WeakMap<Socket, Set<() => void>>()

function heldOn(socket: Socket): Set<() => void> {
  let releases = heldByConnection.get(socket)
  if (releases === undefined) {
    const created = new Set<() => void>()
    socket.once('close', () => {
      for (const release of created) release()
    })
    heldByConnection.set(socket, created)
    releases = created
  }
  return releases
}
