// A client that speaks HTTP/1.1 over a bare socket, for what a library's client hides: `Expect:
// 100-continue` and its interim answer, a body sent late or never, a request target no library would send.
import { once } from 'node:events'
import net from 'node:net'

export interface RawClient {
  write(data: string | Uint8Array): void
  /** Everything received so far, as Latin-1 text. */
  readonly received: string
  /** Resolves once what was received passes `test`; fails, with what arrived, after 15 s. */
  until(test: (received: string) => boolean): Promise<string>
  /** Resolves with everything received once the server closed the connection. */
  closed: Promise<string>
  destroy(): void
}

export async function connect(port: number): Promise<RawClient> {
  const socket = net.connect(port, '127.0.0.1')
  let received = ''
  socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')))
  socket.on('error', () => {}) // a refused client's late writes may meet a closed socket
  const closed = new Promise<string>((resolve) => socket.once('close', () => resolve(received)))
  await once(socket, 'connect')
  return {
    write: (data) => socket.write(data),
    get received() {
      return received
    },
    until: async (test) => {
      const deadline = Date.now() + 15_000
      while (!test(received)) {
        if (Date.now() > deadline) throw new Error(`not received in 15 s; so far: ${JSON.stringify(received)}`)
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      return received
    },
    closed,
    destroy: () => socket.destroy(),
  }
}

/** The answer to a request sent whole (Connection: close), once the server closed the connection. */
export async function exchange(port: number, request: string): Promise<string> {
  const client = await connect(port)
  client.write(request)
  return client.closed
}

/** Status, lower-case headers and body of the first answer in `received` that is not `100 Continue`. */
export function finalAnswer(received: string): { status: number; headers: Record<string, string>; body: string } {
  const text = received.replace(/^HTTP\/1\.1 100 Continue\r\n\r\n/, '')
  const end = text.indexOf('\r\n\r\n')
  const [statusLine = '', ...lines] = text.slice(0, end).split('\r\n')
  const headers = Object.fromEntries(
    lines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]),
  )
  return { status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1]), headers, body: text.slice(end + 4) }
}
