// What the compiled `serve` answers before its application would otherwise have a say: a request target
// Express cannot read on the operator listener (it answered with its own HTML page), and a target Node's
// legacy URL parser warns about (the warning quoted the outsider's target on the process's stderr).
import { once } from 'node:events'
import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'

const ADMIN_TOKEN = 'admin_token_0123456789abcdef0123456789'

interface RawClient {
  write(text: string): void
  /** Everything received so far, as Latin-1 text. */
  readonly received: string
  /** Resolves once what was received passes `test`; fails, with what arrived, after 15 s. */
  until(test: (received: string) => boolean): Promise<string>
  /** Resolves with everything received once the server closed the connection. */
  closed: Promise<string>
  destroy(): void
}

async function connect(port: number): Promise<RawClient> {
  const socket = net.connect(port, '127.0.0.1')
  let received = ''
  socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')))
  socket.on('error', () => {}) // a refused client's late writes may meet a closed socket
  const closed = new Promise<string>((resolve) => socket.once('close', () => resolve(received)))
  await once(socket, 'connect')
  return {
    write: (text) => socket.write(text),
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
async function exchange(port: number, request: string): Promise<string> {
  const client = await connect(port)
  client.write(request)
  return client.closed
}

/** Status, lower-case headers and body of the first answer in `received` that is not `100 Continue`. */
function finalAnswer(received: string): { status: number; headers: Record<string, string>; body: string } {
  const text = received.replace(/^HTTP\/1\.1 100 Continue\r\n\r\n/, '')
  const end = text.indexOf('\r\n\r\n')
  const [statusLine = '', ...lines] = text.slice(0, end).split('\r\n')
  const headers = Object.fromEntries(
    lines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]),
  )
  return { status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1]), headers, body: text.slice(end + 4) }
}

describe('the compiled service before its application answers', () => {
  let service: ReturnType<typeof spawnCli>
  let port: number
  let adminPort: number
  let stderr = ''

  beforeAll(async () => {
    service = spawnCli(
      ['serve'],
      {
        PORT: '0',
        ADMIN_PORT: '0',
        DATA_DIR: 'memory://',
        POLL_ENABLED: 'false',
        PARTNER_API_BASE_URL: 'http://127.0.0.1:9',
        PARTNER_API_KEY_ID: TEST_API_KEY_ID,
        PARTNER_API_SECRET: TEST_API_SECRET,
        WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
        ADMIN_TOKEN,
      },
      { built: true },
    )
    service.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
    const listening = await waitForLogLine(service, 'service listening', 60_000)
    service.stdout!.resume()
    port = Number(new URL(String(listening.url)).port)
    adminPort = Number(new URL(String(listening.adminUrl)).port)
  }, 120_000)

  afterAll(async () => {
    service.kill('SIGTERM')
    await once(service, 'exit')
  })

  describe('the operator listener', () => {
    it.each(['POST http://[::1/anything', 'GET http://[::1/metrics', 'GET //%zz', 'GET http://host:port/metrics', 'OPTIONS *'])(
      'answers `%s` 404 not_found in the error shape, never HTML',
      async (line) => {
        const answer = finalAnswer(
          await exchange(adminPort, `${line} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`),
        )
        expect(answer.status).toBe(404)
        expect(answer.headers['content-type']).toMatch(/^application\/json/)
        expect(JSON.parse(answer.body)).toEqual({ error: { code: 'not_found', message: expect.any(String) } })
      },
    )

    it('escapes what it echoes of a target', async () => {
      const answer = finalAnswer(
        await exchange(adminPort, `GET /<script>alert(1)</script> HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`),
      )
      expect(answer.status).toBe(404)
      expect(answer.body).not.toContain('<')
      expect(JSON.parse(answer.body)).toEqual({ error: { code: 'not_found', message: expect.stringContaining('/<script>') } })
    })
  })

  it('writes nothing of a malformed request target to stderr, on either listener', async () => {
    for (const target of ['http://[::1/webhooks/partner', 'http://evil:x-secret-text/webhooks/partner']) {
      for (const listener of [port, adminPort]) {
        await exchange(listener, `POST ${target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`)
      }
    }
    // an absolute-form target that is a URL is still read as its path
    const health = finalAnswer(await exchange(port, 'GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'))
    expect(health.status).toBe(200)
    // a warning is written on the next tick: give it time to reach the pipe
    await new Promise((resolve) => setTimeout(resolve, 500))
    expect(stderr).not.toContain('DEP0170')
    expect(stderr).not.toContain('[::1')
    expect(stderr).not.toContain('x-secret-text')
  })
})
