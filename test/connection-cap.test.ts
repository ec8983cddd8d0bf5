// The public listener's cap on open connections (src/http/connection-cap.ts), on a listener of its own: past the
// cap, a connection that waited for a request or received one for the slow time is closed for the new one, the
// longest first; one whose request came whole and is being answered never is; with none to close, the new
// connection is dropped. Its clock is the test's, so no test waits for the slow time to pass.
import { once } from 'node:events'
import type http from 'node:http'
import net from 'node:net'
import { afterEach, describe, expect, it } from 'vitest'
import { listen } from '../src/http/server.js'

const SLOW_MS = 100

interface Client {
  socket: net.Socket
  /** Everything the server sent. */
  received: () => string
  closed: Promise<void>
}

describe('the cap on open connections', () => {
  const cleanups: (() => void)[] = []
  afterEach(() => {
    for (const cleanup of cleanups.splice(0)) cleanup()
  })

  async function cappedServer(maxConnections: number) {
    const counts = { dropped: 0, cut: 0 }
    const clock = { ms: 0 }
    // the paths of the requests the server was given
    const seen: string[] = []
    let answerHeld!: () => void
    const held = new Promise<void>((resolve) => (answerHeld = resolve))
    const app: http.RequestListener = (req, res) => {
      seen.push(req.url ?? '')
      // /held: received whole, answered once the test says so; anything else: its body read, then answered
      if (req.url === '/held') {
        req.resume()
        void held.then(() => res.end('held answer'))
        return
      }
      req.resume()
      req.on('end', () => res.end('answer'))
    }
    const running = await listen(app, {
      port: 0,
      host: '127.0.0.1',
      connectionCap: { maxConnections, slowMs: SLOW_MS, onDropped: () => counts.dropped++, onCut: () => counts.cut++, now: () => clock.ms },
    })
    cleanups.push(() => {
      running.server.closeAllConnections()
      running.server.close()
    })
    const port = Number(new URL(running.url).port)
    const connect = async (send = ''): Promise<Client> => {
      const socket = net.connect(port, '127.0.0.1')
      let text = ''
      socket.on('data', (chunk) => (text += chunk.toString('latin1')))
      socket.on('error', () => {})
      const closed = once(socket, 'close').then(() => undefined)
      await once(socket, 'connect')
      if (send) socket.write(send)
      cleanups.push(() => socket.destroy())
      return { socket, received: () => text, closed }
    }
    return { counts, clock, seen, connect, answerHeld }
  }
  const POST_HEAD = (path: string, length: number) => `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Length: ${length}\r\n\r\n`

  it('closes the connection waiting or receiving the longest for a new one, never one whose request is being answered', async () => {
    const { counts, clock, seen, connect, answerHeld } = await cappedServer(3)
    // answering: a request received whole, its answer held back
    const answering = await connect(`${POST_HEAD('/held', 2)}ok`)
    // waiting: connected, nothing sent
    const waiting = await connect()
    await expect.poll(() => seen).toContain('/held')
    // receiving, from a moment later: its headers and 1 of its 100 body bytes
    clock.ms = 10
    const receiving = await connect(`${POST_HEAD('/body', 100)}a`)
    await expect.poll(() => seen).toContain('/body')
    clock.ms = 10 + SLOW_MS

    // the first new connection takes the place of the one waiting the longest
    const first = await connect()
    await waiting.closed
    expect(counts.cut).toBe(1)
    // the next takes the receiving one's, which is told why before its connection closes
    const second = await connect()
    await receiving.closed
    expect(receiving.received()).toMatch(/^HTTP\/1\.1 503 [^\r]*\r\n/)
    expect(receiving.received()).toContain('"code":"overloaded"')
    expect(receiving.received()).toMatch(/\r\nconnection: close\r\n/i)
    expect(counts.cut).toBe(2)

    // now every place is the answering connection's or too young to close: the next one is dropped
    const third = await connect()
    await third.closed
    expect(counts).toEqual({ dropped: 1, cut: 2 })
    // the connection being answered kept its place and gets its answer
    answerHeld()
    await expect.poll(() => answering.received(), { timeout: 5_000 }).toContain('held answer')
    expect(answering.socket.destroyed).toBe(false)
    for (const client of [first, second]) expect(client.socket.destroyed).toBe(false)
  })

  it('closes a kept-alive connection with nothing in flight once the slow time passed since its latest request began, not before', async () => {
    const { counts, clock, connect } = await cappedServer(1)
    const kept = await connect(`${POST_HEAD('/body', 2)}ok`)
    await expect.poll(() => kept.received(), { timeout: 5_000 }).toContain('answer')
    // within the slow time of its latest request: the new connection is dropped
    clock.ms = SLOW_MS - 1
    const early = await connect()
    await early.closed
    expect(counts).toEqual({ dropped: 1, cut: 0 })
    clock.ms = SLOW_MS
    const late = await connect(`${POST_HEAD('/body', 2)}ok`)
    await kept.closed
    await expect.poll(() => late.received(), { timeout: 5_000 }).toContain('answer')
    expect(counts).toEqual({ dropped: 1, cut: 1 })
  })
})
