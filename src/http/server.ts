// Listening and stopping. The timeouts cut off clients that send headers or bodies byte by byte;
// stop() refuses new connections, lets in-flight requests finish, then closes what is left.
import { once } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Express } from 'express'

export interface ServerTimeouts {
  headersTimeoutMs: number
  requestTimeoutMs: number
  keepAliveTimeoutMs: number
}

export const DEFAULT_TIMEOUTS: ServerTimeouts = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 30_000,
  keepAliveTimeoutMs: 5_000,
}

export interface RunningServer {
  readonly server: http.Server
  readonly url: string
  /** Stops accepting, waits for in-flight requests up to `graceMs`, then drops what is left. */
  stop(graceMs: number): Promise<void>
}

export async function listen(
  app: Express,
  { port, host, timeouts = DEFAULT_TIMEOUTS }: { port: number; host: string; timeouts?: ServerTimeouts },
): Promise<RunningServer> {
  const server = http.createServer(
    {
      headersTimeout: timeouts.headersTimeoutMs,
      requestTimeout: timeouts.requestTimeoutMs,
      keepAliveTimeout: timeouts.keepAliveTimeoutMs,
    },
    app,
  )
  server.listen(port, host)
  await once(server, 'listening')
  const address = server.address() as AddressInfo
  const shownHost = address.family === 'IPv6' ? `[${address.address}]` : address.address
  return {
    server,
    url: `http://${shownHost}:${address.port}`,
    stop: async (graceMs) => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()))
      server.closeIdleConnections()
      const timer = setTimeout(() => server.closeAllConnections(), graceMs)
      await closed
      clearTimeout(timer)
    },
  }
}
