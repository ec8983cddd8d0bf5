// The compiled `serve` under 400 unauthenticated connections that each announce a 256 KB body: those past
// MAX_INFLIGHT_BODY_BYTES are answered 503 at their headers, and the rest send most of their body and
// stall. What the process holds is bounded by the budget, not by what the clients choose to send. The RSS
// growth is printed.
//
// The parts are sent once every refusal is answered. A refused client that sends its part anyway has it
// read and dropped by Node until the socket closes: garbage, whose peak depends on when the collector
// runs (up to 56 MB of it on Node 24, against 20-30 on Node 20), not memory the process holds.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnCli, waitForLogLine, stopChild } from './helpers/cli-process.js'
import { openStalledHeads, residentBytes, type StalledClient, steadyResidentBytes } from './helpers/stalled-bodies.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'

const MB = 1024 * 1024
const BUDGET = 8 * MB
const CONTENT_LENGTH = 256 * 1024
const CONNECTIONS = 400
// sockets, parsers and the refused requests' answers: what the process may add besides the bodies
const PER_PROCESS_ALLOWANCE = 16 * MB

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
    await stopChild(service)
  })

  it('holds at most the in-flight body budget: the rest are answered 503 before their bodies are read', async () => {
    // settle: the first requests and scrapes allocate what every later one reuses, and the baseline is
    // taken once the process holds steady (the embedded database's start is collected before "listening")
    for (let i = 0; i < 3; i++) await (await fetch(`${adminUrl}/metrics`)).text()
    const baseline = await steadyResidentBytes(service.pid!)

    // the peak is sampled from the first connection on, while the bodies arrive and are held
    let peak = baseline
    const sampler = setInterval(() => {
      void residentBytes(service.pid!).then((bytes) => {
        peak = Math.max(peak, bytes)
      }, () => {})
    }, 100)
    const heads = await openStalledHeads({
      port: Number(url.port),
      connections: CONNECTIONS,
      contentLength: CONTENT_LENGTH,
      sentBytes: 200 * 1024,
    })
    clients = heads
    const admitted = Math.floor(BUDGET / CONTENT_LENGTH)
    const refused = async () =>
      Number(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m.exec(await (await fetch(`${adminUrl}/metrics`)).text())?.[1] ?? 0)
    const deadline = Date.now() + 60_000
    while ((await refused()) < CONNECTIONS - admitted && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    await Promise.all(heads.map((head) => head.sendPart()))
    // the admitted requests' bodies are being held: keep sampling for a while
    await new Promise((resolve) => setTimeout(resolve, 3_000))
    clearInterval(sampler)
    const refusedCount = await refused()
    const growth = peak - baseline
    // the held bodies (twice: raw-body's chunks and the joined buffer) and the rest
    const bound = 2 * BUDGET + PER_PROCESS_ALLOWANCE
    console.warn(
      `RSS growth under ${CONNECTIONS} stalled 256 KB bodies: ${(growth / MB).toFixed(1)} MB ` +
        `(baseline ${(baseline / MB).toFixed(1)} MB, budget ${BUDGET / MB} MB, bound ${(bound / MB).toFixed(1)} MB; ` +
        `${refusedCount} refused with 503 before their bodies were read)`,
    )
    expect(refusedCount).toBe(CONNECTIONS - admitted)
    expect(growth).toBeLessThan(bound)
    expect(clients.filter((client) => client.status === 503).length).toBeLessThanOrEqual(CONNECTIONS - admitted)
    // the admitted ones sent their part and are still held, unanswered
    expect(clients.filter((client) => client.status === undefined && !client.closed).length).toBe(admitted)
  }, 120_000)
})
