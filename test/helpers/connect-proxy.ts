// A forward proxy as a company firewall has one, reduced to CONNECT: it reads `CONNECT host:port HTTP/1.1`,
// answers `200 Connection Established` and pipes both ways. It records every request it read (the CONNECT
// target, its Proxy-Authorization); with `credentials` set it answers 407 to a request without them, and
// with `refuse` it answers that status to every CONNECT (a proxy whose rules keep the host out), or, with
// 'hang-up', closes the connection without a word (an https:// proxy spoken to as http://). Any other
// request (an absolute-form GET http://...) is recorded and answered 400, so a test sees it was not tunnelled.
import net from 'node:net'

export interface ProxiedRequest {
  method: string
  /** host:port for a CONNECT, the request target otherwise */
  target: string
  proxyAuthorization: string | undefined
}

export interface ConnectProxy {
  readonly port: number
  /** http://127.0.0.1:<port>, with `user:password@` when given */
  url(credentials?: string): string
  readonly requests: ProxiedRequest[]
  close(): Promise<void>
}

export async function startConnectProxy({
  credentials,
  refuse,
}: { credentials?: string; refuse?: number | 'hang-up' } = {}): Promise<ConnectProxy> {
  const requests: ProxiedRequest[] = []
  const sockets = new Set<net.Socket>()
  const expected = credentials ? `Basic ${Buffer.from(credentials).toString('base64')}` : undefined
  const server = net.createServer((client) => {
    sockets.add(client)
    client.on('error', () => {}).on('close', () => sockets.delete(client))
    let head = Buffer.alloc(0)
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk])
      const end = head.indexOf('\r\n\r\n')
      if (end < 0) return
      client.off('data', onData)
      const lines = head.subarray(0, end).toString('latin1').split('\r\n')
      const rest = head.subarray(end + 4)
      const [method = '', target = ''] = lines[0]!.split(' ')
      const header = lines.slice(1).find((line) => /^proxy-authorization:/i.test(line))
      const proxyAuthorization = header?.slice(header.indexOf(':') + 1).trim()
      requests.push({ method, target, proxyAuthorization })
      if (method !== 'CONNECT') return answer(client, 400, 'Bad Request')
      if (expected && proxyAuthorization !== expected) {
        return answer(client, 407, 'Proxy Authentication Required', 'Proxy-Authenticate: Basic realm="test"\r\n')
      }
      if (refuse === 'hang-up') return client.destroy()
      if (refuse) return answer(client, refuse, 'Refused')
      const colon = target.lastIndexOf(':')
      const upstream = net.connect(Number(target.slice(colon + 1)), target.slice(0, colon))
      sockets.add(upstream)
      upstream.on('close', () => {
        sockets.delete(upstream)
        client.destroy()
      })
      upstream.on('error', () => answer(client, 502, 'Bad Gateway'))
      upstream.once('connect', () => {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n')
        if (rest.length > 0) upstream.write(rest)
        client.pipe(upstream)
        upstream.pipe(client)
      })
      client.on('close', () => upstream.destroy())
    }
    client.on('data', onData)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as net.AddressInfo).port
  return {
    port,
    url: (userinfo) => `http://${userinfo ? `${userinfo}@` : ''}127.0.0.1:${port}`,
    requests,
    close: async () => {
      for (const socket of sockets) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

function answer(client: net.Socket, status: number, text: string, headers = ''): void {
  if (client.writable) client.end(`HTTP/1.1 ${status} ${text}\r\n${headers}Content-Length: 0\r\nConnection: close\r\n\r\n`)
}
