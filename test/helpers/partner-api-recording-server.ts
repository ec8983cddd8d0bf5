// A local HTTP server standing in for the platform: it records every request exactly as received and
// checks its signature by recomputing the spec's formula over the raw bytes that arrived, independently
// of src/partner-api/sign-request.ts.
import { createHmac, timingSafeEqual } from 'node:crypto'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import { rememberSecret } from './log-sink.js'
import { recordForPath } from './partner-api-fixtures.js'

export interface RecordedRequest {
  method: string
  /** The request target as received (path, percent-encoding untouched). */
  path: string
  headers: IncomingHttpHeaders
  rawBody: Buffer
  /** True when X-Partner-Signature is the HMAC of `METHOD.path.timestamp.nonce.body` under the secret. */
  signatureValid: boolean
}

export interface PlannedAnswer {
  status: number
  body?: unknown
  /** The body's exact text instead, for one JSON.stringify cannot write (a key twice in one object). */
  text?: string
  headers?: Record<string, string>
}

export interface RecordingServer {
  readonly url: string
  readonly requests: RecordedRequest[]
  close(): Promise<void>
}

export function expectedSignature(
  secret: string,
  method: string,
  path: string,
  headers: IncomingHttpHeaders,
  raw: Buffer,
) {
  const payload = Buffer.concat([
    Buffer.from(`${method}.${path}.${headers['x-partner-timestamp']}.${headers['x-partner-nonce']}.`, 'utf8'),
    raw,
  ])
  return createHmac('sha256', secret).update(payload).digest('hex')
}

export async function startRecordingServer({
  secret,
  answer = (request) => ({ status: 200, body: recordForPath(request.path) }),
  port: wantedPort = 0,
}: {
  secret: string
  answer?: (request: RecordedRequest) => PlannedAnswer
  /** A fixed port, e.g. one a client already tried while nothing listened there. */
  port?: number
}): Promise<RecordingServer> {
  const requests: RecordedRequest[] = []
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      const rawBody = Buffer.concat(chunks)
      const method = req.method ?? ''
      const path = req.url ?? ''
      const given = String(req.headers['x-partner-signature'] ?? '')
      rememberSecret(given)
      const expected = Buffer.from(expectedSignature(secret, method, path, req.headers, rawBody))
      const signatureValid = given.length === expected.length && timingSafeEqual(Buffer.from(given), expected)
      const recorded: RecordedRequest = { method, path, headers: req.headers, rawBody, signatureValid }
      requests.push(recorded)
      const planned = answer(recorded)
      const text = planned.text ?? (planned.body === undefined ? '' : JSON.stringify(planned.body))
      res.writeHead(planned.status, { 'content-type': 'application/json', ...planned.headers })
      res.end(text)
    })
  })
  await new Promise<void>((resolve) => server.listen(wantedPort, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}
