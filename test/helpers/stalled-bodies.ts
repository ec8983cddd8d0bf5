// Clients that send a webhook's headers and part of its body, then stall: the unauthenticated memory
// hold of a slowloris-style attack. Each socket reports how the server answered it, if it did.
import net from 'node:net'

export interface StalledClient {
  readonly socket: net.Socket
  /** The status line's code once an answer arrived (503 when refused before its body was read). */
  status: number | undefined
  closed: boolean
}

export async function openStalledBodies({
  port,
  connections,
  contentLength,
  sentBytes,
  path = '/webhooks/partner',
}: {
  port: number
  connections: number
  contentLength: number
  sentBytes: number
  path?: string
}): Promise<StalledClient[]> {
  const part = Buffer.alloc(sentBytes, 'a')
  return Promise.all(
    Array.from({ length: connections }, (_, index) => {
      const socket = net.connect(port, '127.0.0.1')
      const client: StalledClient = { socket, status: undefined, closed: false }
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
      return new Promise<StalledClient>((resolve) => {
        socket.once('connect', () => {
          socket.write(
            `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n` +
              `Content-Length: ${contentLength}\r\nX-Partner-Delivery-Id: stall-${index}\r\n` +
              `X-Partner-Signature: sha256=${'0'.repeat(64)}\r\n\r\n`,
          )
          // resolved once the part is handed to the kernel, or the server closed the socket on it
          socket.write(part, () => resolve(client))
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
