// The compiled `serve` under 400 unauthenticated connections that each announce a 256 KB body, send
// most of it and stall: what the process holds is bounded by MAX_INFLIGHT_BODY_BYTES, not by what
// the clients choose to send. The RSS growth is printed.
import { once } from 'node:events'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { openStalledBodies, residentBytes, type StalledClient } from './helpers/stalled-bodies.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'

const MB = 1024 * 1024
const BUDGET = 8 * MB
const CONTENT_LENGTH = 256 * 1024
const CONNECTIONS = 400
// sockets, parsers and the refused requests' answers: what the process may add besides the bodies
const PER_PROCESS_ALLOWANCE = 16 * MB
// before a refused request is answered Node has read one socket read of it (64 KB at most), garbage
// that a busy machine may not have collected yet when the peak is sampled
const READ_PER_REFUSED = 64 * 1024

describe('memory under 400 stalled bodies, with the built CLI', () => {
  let service: ReturnType<typeof spawnCli>
  let url: URL
  let adminUrl: string
  let clients: StalledClient[] = []

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
        MAX_INFLIGHT_BODY_BYTES: process.env.STALL_BUDGET ?? String(BUDGET),
      },
      { built: true },
    )
    const listening = await waitForLogLine(service, 'service listening', 60_000)
    service.stdout!.resume()
    service.stderr!.resume()
    url = new URL(String(listening.url))
    adminUrl = String(listening.adminUrl)
  }, 120_000)

  afterAll(async () => {
    for (const client of clients) client.socket.destroy()
    service.kill('SIGTERM')
    await once(service, 'exit')
  })

  it('holds at most the in-flight body budget: the rest are answered 503 before their bodies are read', async () => {
    // settle: the first requests and scrapes allocate what every later one reuses
    for (let i = 0; i < 3; i++) await (await fetch(`${adminUrl}/metrics`)).text()
    const baseline = Math.max(await residentBytes(service.pid!), await residentBytes(service.pid!))

    // the peak is sampled from the first connection on, while the bodies arrive and are held
    let peak = baseline
    const sampler = setInterval(() => {
      void residentBytes(service.pid!).then((bytes) => {
        peak = Math.max(peak, bytes)
      }, () => {})
    }, 100)
    clients = await openStalledBodies({
      port: Number(url.port),
      connections: CONNECTIONS,
      contentLength: CONTENT_LENGTH,
      sentBytes: 200 * 1024,
    })
    const admitted = Math.floor(BUDGET / CONTENT_LENGTH)
    const refused = async () =>
      Number(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m.exec(await (await fetch(`${adminUrl}/metrics`)).text())?.[1] ?? 0)
    const deadline = Date.now() + 60_000
    while ((await refused()) < CONNECTIONS - admitted && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    // the admitted requests' bodies are being held: keep sampling for a while
    await new Promise((resolve) => setTimeout(resolve, 3_000))
    clearInterval(sampler)
    const refusedCount = await refused()
    const growth = peak - baseline
    // the held bodies (twice: raw-body's chunks and the joined buffer), the refused requests' first reads, and the rest
    const bound = 2 * BUDGET + (CONNECTIONS - admitted) * READ_PER_REFUSED + PER_PROCESS_ALLOWANCE
    console.warn(
      `RSS growth under ${CONNECTIONS} stalled 256 KB bodies: ${(growth / MB).toFixed(1)} MB ` +
        `(baseline ${(baseline / MB).toFixed(1)} MB, budget ${BUDGET / MB} MB, bound ${(bound / MB).toFixed(1)} MB; ` +
        `${refusedCount} refused with 503 before their bodies were read)`,
    )
    expect(refusedCount).toBe(CONNECTIONS - admitted)
    expect(growth).toBeLessThan(bound)
    expect(clients.filter((client) => client.status === 503).length).toBeLessThanOrEqual(CONNECTIONS - admitted)
  }, 120_000)
})
