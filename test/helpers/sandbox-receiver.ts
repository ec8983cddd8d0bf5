// A tiny webhook receiver for sandbox tests: verifies each delivery's sha256 signature with node:crypto
// on its own, records it, and answers with whatever status the test scripts.
import { createHmac, timingSafeEqual } from 'node:crypto'
import http from 'node:http'
import type { AddressInfo } from 'node:net'

export interface ReceivedWebhook {
  deliveryId: string
  body: Record<string, unknown>
  rawBody: string
  signatureValid: boolean
}

export async function startRecordingReceiver(secret: string, answer: (count: number) => number = () => 200) {
  const received: ReceivedWebhook[] = []
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      const raw = Buffer.concat(chunks)
      const expected = createHmac('sha256', secret).update(raw).digest()
      const header = String(req.headers['x-partner-signature'] ?? '')
      const presented = Buffer.from(header.replace(/^sha256=/, ''), 'hex')
      received.push({
        deliveryId: String(req.headers['x-partner-delivery-id']),
        body: JSON.parse(raw.toString('utf8')),
        rawBody: raw.toString('utf8'),
        signatureValid: header.startsWith('sha256=') && presented.length === 32 && timingSafeEqual(expected, presented),
      })
      res.writeHead(answer(received.length)).end()
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`,
    received,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}
