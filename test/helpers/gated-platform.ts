// A platform stand-in for the trade commands' process tests: every request is recorded, then the test's `before`
// runs (cut the database's proxy, wait, take a lock), then the answer: a record for the request's path, made for the
// reference and trade the test names, or none at all (`hang`: a call that times out).
import { createServer, type IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import { disputeRecord, proposalRecord, respondResult, tradeRecord } from './partner-api-fixtures.js'

export interface GatedRequest {
  method: string
  path: string
  body: string
  at: number
}

export interface Gate {
  /** Runs before the answer is written (and before a hang begins). */
  before?: (request: GatedRequest) => void | Promise<void>
  /** Never answer. */
  hang?: boolean
  /** The trade id and the status the answer's trade record holds. */
  tradeId?: string
  status?: string
  /** The external reference of the answer's trade record (a create's: the one it was sent for). */
  externalReference?: string
}

export interface GatedPlatform {
  readonly url: string
  readonly requests: GatedRequest[]
  gate: Gate
  close(): Promise<void>
}

export async function startGatedPlatform(): Promise<GatedPlatform> {
  const requests: GatedRequest[] = []
  const platform: { gate: Gate } = { gate: {} }
  const read = (req: IncomingMessage) =>
    new Promise<string>((resolve) => {
      const chunks: Buffer[] = []
      req.on('data', (chunk: Buffer) => chunks.push(chunk)).on('end', () => resolve(Buffer.concat(chunks).toString('utf8')))
    })
  const server = createServer((req, res) => {
    void (async () => {
      const request = { method: req.method ?? '', path: req.url ?? '', body: await read(req), at: Date.now() }
      requests.push(request)
      const gate = platform.gate
      await gate.before?.(request)
      if (gate.hang) return
      const sent = request.body ? (JSON.parse(request.body) as { external_reference?: string }) : {}
      const trade = tradeRecord({
        trade_id: gate.tradeId ?? 'tr_1',
        status: gate.status ?? 'created',
        external_reference: sent.external_reference ?? gate.externalReference ?? 'order-1',
      })
      const tradeId = /\/trades\/([^/]+)\//.exec(request.path)?.[1] ?? trade.trade_id
      const body = request.path.endsWith('/proposals/')
        ? proposalRecord({ proposal_id: 'pr_3', trade_id: tradeId })
        : request.path.endsWith('/dispute/')
          ? disputeRecord({ trade_id: tradeId })
          : request.path.endsWith('/respond/')
            ? respondResult()
            : trade
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify(body))
    })()
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    get gate() {
      return platform.gate
    },
    set gate(gate: Gate) {
      platform.gate = gate
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}
