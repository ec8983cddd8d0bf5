// A client that pipelines requests and reads none of the answers (src/http/connection-cap.ts, MAX_PIPELINED): its
// connection is closed once that many answers wait to be written out to it, and the requests Node had parsed past
// that point are not served. Before, two to eight such clients sending `GET /healthz` 200,000 times made the service
// parse and answer their requests for as long as the buffers on both sides took more, and every other client waited
// 7 to 20 s for an answer (an outside attack): Node stops parsing a connection once 16 kB of answers wait for it,
// and starts again as soon as they are taken by the system's buffers, which hold megabytes.
import { once } from 'node:events'
import type http from 'node:http'
import net from 'node:net'
import { afterEach, describe, expect, it } from 'vitest'
import { MAX_PIPELINED } from '../src/http/connection-cap.js'
import { listen } from '../src/http/server.js'

const SENT = 20_000
// as small as /healthz's
const ANSWER = Buffer.from('{"status":"ok"}')

describe('a client that pipelines requests and reads no answer', () => {
  const cleanups: (() => void)[] = []
  afterEach(() => {
    for (const cleanup of cleanups.splice(0)) cleanup()
  })

  it('has its connection closed, is served no more, and others are answered meanwhile', async () => {
    let served = 0
    const app: http.RequestListener = (_req, res) => {
      served++
      res.end(ANSWER)
    }
    const running = await listen(app, { port: 0, host: '127.0.0.1', connectionCap: { maxConnections: 100, slowMs: 10_000 } })
    cleanups.push(() => {
      running.server.closeAllConnections()
      running.server.close()
    })
    const port = Number(new URL(running.url).port)

    const flood = net.connect(port, '127.0.0.1')
    flood.pause()
    flood.on('error', () => {})
    await once(flood, 'connect')
    const request = 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n'
    let written = 0
    const pump = () => {
      while (written < SENT && !flood.destroyed) {
        written += 500
        if (!flood.write(request.repeat(500))) {
          flood.once('drain', pump)
          return
        }
      }
    }
    pump()
    // the client reads nothing, so it does not see the close: the server's side is looked at
    const connections = () => new Promise<number>((resolve) => running.server.getConnections((_error, count) => resolve(count)))
    for (let waited = 0; (await connections()) > 0 && waited < 10_000; waited += 50) await new Promise((resolve) => setTimeout(resolve, 50))
    expect(await connections(), `closed by the server (served ${served} of ${written} sent)`).toBe(0)
    const servedWhenClosed = served
    // a chunk's worth at most, not the thousands the buffers would take
    expect(servedWhenClosed).toBeLessThanOrEqual(MAX_PIPELINED + 1)
    // and none after
    await new Promise((resolve) => setTimeout(resolve, 200))
    expect(served).toBe(servedWhenClosed)

    // another client is answered at once
    const probe = await fetch(`${running.url}/healthz`)
    expect(probe.status).toBe(200)
    expect((await probe.arrayBuffer()).byteLength).toBe(ANSWER.length)
  })
})
