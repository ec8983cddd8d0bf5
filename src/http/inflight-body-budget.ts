// A budget of request body bytes being read or held at once (MAX_INFLIGHT_BODY_BYTES). A request
// reserves its Content-Length, or the whole body limit when it announces none (chunked), before a byte
// of its body is read, and gives it back when its answer is sent or its connection closes. Past the
// budget it is answered 503 `overloaded` at once and its connection closed: clients that open many
// requests and never finish their bodies hold at most the budget, not the process's memory.
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { Metrics } from '../metrics/metrics.js'
import { errorBody } from './app-error.js'
import { writeJson } from './json-answer.js'

export class InflightBodyBudget {
  private reserved = 0

  constructor(readonly capacityBytes: number) {}

  /** Takes `bytes` from the budget; false (and nothing taken) when they do not fit. */
  tryReserve(bytes: number): boolean {
    if (this.reserved + bytes > this.capacityBytes) return false
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

/**
 * Reserves the request's body bytes before a byte is read; they are given back when its answer is sent or
 * its connection closes. False: the budget is spent, and the request was answered 503 `overloaded`.
 */
export function reserveBodyBytes(
  req: IncomingMessage,
  res: ServerResponse,
  { budget, bodyLimitBytes, metrics }: { budget: InflightBodyBudget; bodyLimitBytes: number; metrics?: Metrics | undefined },
): boolean {
  const announced = req.headers['content-length']
  const length = announced === undefined ? undefined : Number(announced)
  // a malformed length or one over the limit is refused by the body reader (400, 413) without reading
  if (length !== undefined && !(Number.isSafeInteger(length) && length >= 0 && length <= bodyLimitBytes)) return true
  const bytes = length ?? bodyLimitBytes
  if (!budget.tryReserve(bytes)) {
    metrics?.requestsRefused.inc({ reason: 'body_budget' })
    res.setHeader('Connection', 'close')
    res.setHeader('Retry-After', '1')
    writeJson(res, 503, errorBody('overloaded', 'Too many request bodies are being received at once; retry later'))
    return false
  }
  metrics?.inflightBodyBytes.inc(bytes)
  const releases = heldOn(req.socket)
  const release = () => {
    if (!releases.delete(release)) return
    budget.release(bytes)
    metrics?.inflightBodyBytes.dec(bytes)
  }
  releases.add(release)
  res.once('close', release)
  return true
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
