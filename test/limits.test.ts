// The public listener's caps: a budget of in-flight body bytes (503 `overloaded` before a body is read)
// and a cap on open connections, each counted in the operator listener's metrics.
import { once } from 'node:events'
import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type RunningService, startService } from '../src/service.js'
import { testLogger } from './helpers/log-sink.js'
import { openStalledBodies, type StalledClient } from './helpers/stalled-bodies.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { signBody } from './helpers/webhook-delivery.js'

const KB = 1024

describe('limits of the public listener', () => {
  let service: RunningService
  let port: number
  const held: net.Socket[] = []

  beforeAll(async () => {
    service = await startService({
      config: testConfig({
        PORT: '0',
        POLL_ENABLED: 'false',
        WEBHOOK_BODY_LIMIT: '256kb',
        MAX_INFLIGHT_BODY_BYTES: '512kb',
      }),
      logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
    })
    await service.ready
    port = Number(new URL(service.url).port)
  })
  afterAll(async () => {
    for (const socket of held) socket.destroy()
    await service.stop()
  })

  const metric = async (line: RegExp) => {
    const scrape = await (await fetch(`${service.adminUrl}/metrics`)).text()
    return Number(line.exec(scrape)?.[1] ?? 0)
  }

  it('answers 503 overloaded before reading a body that would pass the budget, and admits again once bodies are done', async () => {
    // two unfinished 256 KB bodies take the whole 512 KB budget
    const stalled: StalledClient[] = await openStalledBodies({ port, connections: 2, contentLength: 256 * KB, sentBytes: 10 * KB })
    held.push(...stalled.map((client) => client.socket))
    const body = JSON.stringify({ event: 'trade.funded', trade_id: 'tr_1', status: 'funded', external_reference: 'lim-1' })
    const send = (headers: Record<string, string> = {}) =>
      fetch(`${service.url}/webhooks/partner`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'x-partner-signature': signBody(body),
          'x-partner-delivery-id': `lim-${Math.random()}`,
          ...headers,
        },
        body,
      })
    // both have reserved their Content-Length
    await expect.poll(() => metric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(512 * KB)

    const refused = await send()
    expect(refused.status).toBe(503)
    expect(refused.headers.get('connection')).toBe('close')
    expect(await refused.json()).toEqual({ error: { code: 'overloaded', message: expect.any(String) } })
    expect(await metric(/^http_requests_refused_total\{reason="body_budget"\} (\d+)/m)).toBe(1)

    // a chunked body (no Content-Length) reserves the whole body limit: refused as well
    const chunked = await fetch(`${service.url}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-signature': signBody(body) },
      body: new Blob([body]).stream(),
      duplex: 'half',
    } as RequestInit)
    expect(chunked.status).toBe(503)

    // the held bodies end (their clients go away): the budget comes back
    for (const client of stalled) client.socket.destroy()
    await expect.poll(() => metric(/^http_inflight_body_bytes (\d+)/m), { timeout: 10_000 }).toBe(0)
    expect((await send()).status).toBe(200)
  })

  it('drops connections past MAX_CONNECTIONS and counts them', async () => {
    // a service of its own: no earlier keep-alive connection counts against the cap
    const capped = await startService({
      config: testConfig({ PORT: '0', POLL_ENABLED: 'false', MAX_CONNECTIONS: '8' }),
      logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
    })
    await capped.ready
    try {
      const cappedPort = Number(new URL(capped.url).port)
      const sockets = await Promise.all(
        Array.from({ length: 8 }, async () => {
          const socket = net.connect(cappedPort, '127.0.0.1')
          await once(socket, 'connect')
          return socket
        }),
      )
      const extra = net.connect(cappedPort, '127.0.0.1')
      extra.on('error', () => {})
      await once(extra, 'close')
      const scrape = await (await fetch(`${capped.adminUrl}/metrics`)).text()
      expect(scrape).toMatch(/^http_requests_refused_total\{reason="max_connections"\} 1$/m)
      for (const socket of sockets) socket.destroy()
      // with room again, requests are served
      await expect.poll(async () => (await fetch(`${capped.url}/healthz`)).status, { timeout: 10_000 }).toBe(200)
    } finally {
      await capped.stop()
    }
  })
})
