// The demo's stand-in for a partner's own system: the far end of the forwarder. It checks each request's
// Standard Webhooks signature (with the forwarder's signing function: the demo shows the round trip, the
// tests check the format against an independent library), deduplicates by webhook-id as a real receiver
// would, and counts what it got.
import { timingSafeEqual } from 'node:crypto'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { signStandardWebhook } from '../reactions/forwarder.js'
import type { ForwardedPayload } from '../reactions/reaction-event.js'

export interface ForwardReceiverStats {
  /** Requests that arrived, retries included. */
  requests: number
  /** Requests whose signature did not verify (answered 401, never counted as events). */
  invalid: number
  /** Verified requests whose webhook-id had been seen before (answered 2xx, not counted again). */
  duplicates: number
}

export interface DemoForwardReceiver {
  url: string
  /** The verified events, one per webhook-id, in arrival order. */
  readonly events: readonly ForwardedPayload[]
  readonly stats: ForwardReceiverStats
  close(): Promise<void>
}

// the specification's replay window: a signature older or newer than this is refused
const TOLERANCE_S = 300

export async function startForwardReceiver(secret: string): Promise<DemoForwardReceiver> {
  const seen = new Set<string>()
  const events: ForwardedPayload[] = []
  const stats: ForwardReceiverStats = { requests: 0, invalid: 0, duplicates: 0 }
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      stats.requests++
      const body = Buffer.concat(chunks).toString('utf8')
      const id = String(req.headers['webhook-id'] ?? '')
      const timestamp = Number(req.headers['webhook-timestamp'])
      if (!verifies(secret, id, timestamp, body, String(req.headers['webhook-signature'] ?? ''))) {
        stats.invalid++
        res.writeHead(401).end()
        return
      }
      if (seen.has(id)) stats.duplicates++
      else {
        seen.add(id)
        events.push(JSON.parse(body) as ForwardedPayload)
      }
      res.writeHead(204).end()
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/escrow-events`,
    events,
    stats,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}

function verifies(secret: string, id: string, timestamp: number, body: string, header: string): boolean {
  if (!id || !Number.isInteger(timestamp) || Math.abs(Date.now() / 1000 - timestamp) > TOLERANCE_S) return false
  const expected = Buffer.from(signStandardWebhook(secret, id, timestamp, body))
  // the header may list several space-separated signatures (a sender rotating its secret); one must match
  return header.split(' ').some((candidate) => {
    const presented = Buffer.from(candidate)
    return presented.length === expected.length && timingSafeEqual(presented, expected)
  })
}
