// Clients that send a webhook's headers and part of its body, then stall: the unauthenticated memory
// hold of a slowloris-style attack. Each socket reports how the server answered it, if it did.
import net from 'node:net'

export interface StalledClient {
  readonly socket: net.Socket
  /** The status line's code once an answer arrived (503 when refused before its body was read). */
  status: number | undefined
  closed: boolean
}

interface StalledOptions {
  port: number
  connections: number
  contentLength: number
  sentBytes: number
  path?: string
}

/** Each client sends a webhook's headers and `sentBytes` of its body at once, then stalls. */
export async function openStalledBodies(options: StalledOptions): Promise<StalledClient[]> {
  const heads = await openStalledHeads(options)
  return Promise.all(heads.map(async (head) => (await head.sendPart(), head)))
}

/**
 * Each client sends a webhook's headers only; `sendPart()` sends `sentBytes` of its body, unless the server
 * has answered (a request refused at its headers) or closed the socket. Resolves once every client is
 * connected and has written its headers.
 */
export async function openStalledHeads({
  port,
  connections,
  contentLength,
  sentBytes,
  path = '/webhooks/partner',
}: StalledOptions): Promise<(StalledClient & { sendPart(): Promise<void> })[]> {
  const part = Buffer.alloc(sentBytes, 'a')
  return Promise.all(
    Array.from({ length: connections }, (_, index) => {
      const socket = net.connect(port, '127.0.0.1')
      const client = {
        socket,
        status: undefined as number | undefined,
        closed: false,
        // resolved once the part is handed to the kernel, or the server closed the socket on it
        sendPart: () =>
          new Promise<void>((resolve) => {
            if (client.status !== undefined || client.closed) return resolve()
            socket.once('close', () => resolve())
            socket.write(part, () => resolve())
          }),
      }
      let head = ''
      socket.on('data', (chunk) => {
        head += chunk.toString('latin1')
        const match = /^HTTP\/1\.1 (\d{3})/.exec(head)
        if (match && client.status === undefined) client.status = Number(match[1])
      })
      socket.on('error', () => {}) // a refused client's writes meet a closed socket
      socket.on('close', () => {
        client.closed = true
      })
      return new Promise<typeof client>((resolve) => {
        socket.once('connect', () => {
          socket.write(
            `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n` +
              `Content-Length: ${contentLength}\r\nX-Partner-Delivery-Id: stall-${index}\r\n` +
              `X-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n`,
            () => resolve(client),
          )
        })
        socket.once('close', () => resolve(client))
      })
    }),
  )
}

/** Resident memory of a process now, in bytes (Linux /proc). */
export async function residentBytes(pid: number): Promise<number> {
  const { readFile } = await import('node:fs/promises')
  const status = await readFile(`/proc/${pid}/status`, 'utf8')
  return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? Number.NaN) * 1024
}

/**
 * Resident memory once it holds steady: two readings a second apart within 2 MB of each other (at most
 * 30 s), the larger of the two. A baseline taken while a start's garbage is still being freed would let
 * a later growth hide behind the fall.
 */
export async function steadyResidentBytes(pid: number): Promise<number> {
  const deadline = Date.now() + 30_000
  let before = await residentBytes(pid)
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 1_000))
    const now = await residentBytes(pid)
    if (Math.abs(now - before) <= 2 * 1024 * 1024) return Math.max(before, now)
    if (Date.now() > deadline) throw new Error(`resident memory did not settle: ${before} then ${now} bytes`)
    before = now
  }
}
