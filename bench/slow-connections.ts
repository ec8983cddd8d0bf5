// How long a signed delivery waits while every connection the public listener takes is held by a client that
// sends a request's headers, with a signature header that could be right, and then its body a byte every 2 s
// (`npx tsx bench/slow-connections.ts dist [dist ...]`, one compiled tree after another, on BENCH_DATABASE_URL).
// Each tree's `serve` (MAX_CONNECTIONS=1000) gets 1,000 such connections, then five deliveries one after the other,
// each tried again every 200 ms while its connection is refused, for 40 s at most.
import net from 'node:net'
import path from 'node:path'
import { createBenchSchema } from './ab-rounds.js'
import { deliveryHeaders } from './bench-secrets.js'
import { startService, stopService } from './service-process.js'

const SLOW_CONNECTIONS = 1_000
const dists = process.argv.slice(2)
if (dists.length === 0) throw new Error('usage: slow-connections.ts dist [dist ...]')

for (const dist of dists) {
  const bench = await createBenchSchema('slow')
  const { child, port } = await startService(bench.url, { orders: 10, seen: 0 }, { MAX_CONNECTIONS: String(SLOW_CONNECTIONS) }, path.resolve(dist))
  const sockets: net.Socket[] = []
  for (let index = 0; index < SLOW_CONNECTIONS; index++) {
    const socket = net.connect(port, '127.0.0.1').on('error', () => {})
    socket.write(
      `POST /webhooks/partner HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nX-Partner-Delivery-Id: slow-${index}\r\n` +
        `X-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n`,
    )
    sockets.push(socket)
  }
  const trickle = setInterval(() => {
    for (const socket of sockets) if (!socket.destroyed) socket.write('a')
  }, 2_000)
  await new Promise((resolve) => setTimeout(resolve, 3_000))
  const waits: string[] = []
  for (let n = 0; n < 5; n++) {
    const body = JSON.stringify({ trade_id: 'trd-1', reference: 'R-1', status: 'funded', external_reference: 'bench-1' })
    const startedAt = Date.now()
    let outcome = 'no answer in 40 s'
    while (Date.now() - startedAt < 40_000) {
      try {
        const response = await fetch(`http://127.0.0.1:${port}/webhooks/partner`, {
          method: 'POST',
          headers: deliveryHeaders(body, `delivery-${n}-${startedAt}`),
          body,
          signal: AbortSignal.timeout(40_000),
        })
        outcome = String(response.status)
        break
      } catch {
        await new Promise((resolve) => setTimeout(resolve, 200))
      }
    }
    waits.push(`${outcome} after ${Date.now() - startedAt} ms`)
  }
  clearInterval(trickle)
  console.log(`${dist}: ${waits.join('; ')}`)
  for (const socket of sockets) socket.destroy()
  await stopService(child)
  await bench.drop()
}
