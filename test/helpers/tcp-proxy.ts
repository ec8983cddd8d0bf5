// A TCP proxy in front of Postgres or RabbitMQ that a test can cut: `cut()` drops every open connection
// (with a FIN, or an RST when asked) and refuses new ones until `restore()`. It stands for a database or a
// broker that goes away and comes back; started with `open: false` it stands for one that is not there yet.
import net from 'node:net'

export interface TcpProxy {
  readonly port: number
  /** The target URL rewritten to go through the proxy. */
  rewrite(url: string): string
  cut(options?: { reset?: boolean }): void
  restore(): void
  /**
   * The open connections go silent: no byte passes either way, and no RST or FIN either, as when a peer
   * or a network path dies without a word. New connections pass.
   */
  stall(): void
  /**
   * The path drops every packet: the open connections go silent as with stall(), and new ones are taken and never
   * answered (neither refused nor forwarded). restore() drops what it held and forwards again.
   */
  silence(): void
  close(): Promise<void>
}

export async function startTcpProxy(
  target: { host: string; port: number },
  { open: openAtStart = true } = {},
): Promise<TcpProxy> {
  const sockets = new Set<net.Socket>()
  // taken while silenced, never forwarded
  const held = new Set<net.Socket>()
  let open = openAtStart
  let silent = false
  const server = net.createServer((client) => {
    if (!open) {
      client.destroy()
      return
    }
    if (silent) {
      held.add(client)
      client.on('error', () => {}).on('close', () => held.delete(client))
      return
    }
    const upstream = net.connect(target.port, target.host)
    sockets.add(client)
    sockets.add(upstream)
    const drop = () => {
      client.destroy()
      upstream.destroy()
      sockets.delete(client)
      sockets.delete(upstream)
    }
    client.on('error', drop).on('close', drop)
    upstream.on('error', drop).on('close', drop)
    client.pipe(upstream)
    upstream.pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as net.AddressInfo).port
  return {
    port,
    rewrite: (url) => throughPort(url, port),
    cut: ({ reset = false } = {}) => {
      open = false
      for (const socket of sockets) {
        if (reset) socket.resetAndDestroy()
        else socket.destroy()
      }
      sockets.clear()
    },
    restore: () => {
      open = true
      if (!silent) return
      silent = false
      for (const socket of [...sockets, ...held]) socket.destroy()
    },
    stall: () => {
      for (const socket of sockets) socket.pause()
    },
    silence: () => {
      silent = true
      for (const socket of sockets) socket.pause()
    },
    close: async () => {
      open = false
      for (const socket of [...sockets, ...held]) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

/** `url` (a database URL) pointed at a proxy's port on 127.0.0.1, the rest of it as it was. */
export function throughPort(url: string, port: number): string {
  const parsed = new URL(url)
  parsed.hostname = '127.0.0.1'
  parsed.port = String(port)
  return parsed.toString()
}
