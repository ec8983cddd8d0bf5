// The platform's answer is read up to PARTNER_API_ANSWER_LIMIT and no further. A real HTTP server plays the
// platform, so the bytes it got written before the client closed the connection are counted on the wire.
import { once } from 'node:events'
import { rmSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { gzipSync } from 'node:zlib'
import { afterEach, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createPartnerApiClient } from '../src/partner-api/create-partner-api-client.js'
import { PartnerInvalidResponseError } from '../src/partner-api/partner-api-error.js'
import { receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { answerEndlessly, MiB } from './helpers/endless-answer.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'

interface Platform {
  url: string
  requests: number
  /** Bytes of answer bodies the server's socket took before each connection closed. */
  written: number[]
}

let server: Server | undefined
afterEach(async () => {
  server?.closeAllConnections()
  if (server) await new Promise((resolve) => server!.close(resolve))
  server = undefined
})

/** Answers every request with `status` and a body of `size` bytes: a JSON string padded with spaces. */
async function platform({ status = 200, size, gzip = false }: { status?: number; size: number; gzip?: boolean }) {
  const answered: Platform = { url: '', requests: 0, written: [] }
  server = createServer((_request, response) => {
    answered.requests++
    if (gzip) {
      const body = gzipSync(Buffer.alloc(size, ' '))
      response.writeHead(status, { 'content-type': 'application/json', 'content-encoding': 'gzip' })
      response.end(body)
      return
    }
    answerEndlessly(response, (written) => answered.written.push(written), { size, status })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  answered.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  return answered
}

/** The client as the service builds it from its environment, on the real clock: a retry would happen. */
function client(baseUrl: string, env: Record<string, string> = {}) {
  const config = testConfig({ PARTNER_API_BASE_URL: baseUrl, ...env })
  return createPartnerApiClient(config, { logger: testLogger([TEST_API_SECRET]), clock: systemClock })
}

describe('an answer larger than PARTNER_API_ANSWER_LIMIT', () => {
  it('fails the call with invalid_response after reading about the limit, not the whole answer', async () => {
    const answer = await platform({ size: 256 * MiB })
    const failure = await client(answer.url).getTrade('tr_1').catch((error: unknown) => error)

    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure).toMatchObject({ code: 'invalid_response', status: 200, field: '(body)' })
    expect((failure as Error).message).toBe(
      'GET /api/partner/v1/trades/tr_1/: the platform answered 200 with a body larger than 1,048,576 bytes, ' +
        'the most this client reads; the rest was not read',
    )
    // the connection was closed with most of the answer unsent: what was written is the limit plus what
    // the two sockets' kernel buffers hold
    await expect.poll(() => answer.written.length).toBe(1)
    expect(answer.written[0]).toBeLessThan(32 * MiB)
    // a GET is retried on network errors, but not this: the answer would be as large again
    expect(answer.requests).toBe(1)
  })

  it('counts the decoded bytes: a small gzip answer that inflates past the limit fails the same way', async () => {
    const answer = await platform({ size: 64 * MiB, gzip: true })
    const failure = await client(answer.url).getTrade('tr_1').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure).toMatchObject({ field: '(body)' })
    expect((failure as Error).message).toContain('with a body larger than 1,048,576 bytes')
  })

  it('applies to an error status too, which is then not retried', async () => {
    const answer = await platform({ status: 503, size: 4 * MiB })
    const failure = await client(answer.url, { PARTNER_API_ANSWER_LIMIT: '1mb' })
      .getTrade('tr_1')
      .catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure).toMatchObject({ status: 503, field: '(body)' })
    expect(answer.requests).toBe(1)
  })
})

describe('an answer within PARTNER_API_ANSWER_LIMIT', () => {
  // a trade record padded to exactly `size` bytes with spaces after its JSON
  async function recordOfSize(size: number) {
    const record = JSON.stringify(tradeRecord({ trade_id: 'tr_1' }))
    server = createServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'application/json' })
      response.end(record.padEnd(size, ' '))
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  }

  it('is read whole up to the limit, and one byte past it fails', async () => {
    const atLimit = await recordOfSize(16 * 1024)
    await expect(client(atLimit, { PARTNER_API_ANSWER_LIMIT: '16kb' }).getTrade('tr_1')).resolves.toMatchObject({
      trade_id: 'tr_1',
    })
    await expect(client(atLimit, { PARTNER_API_ANSWER_LIMIT: '16383b' }).getTrade('tr_1')).rejects.toThrow(
      'with a body larger than 16,383 bytes',
    )
  })
})

describe('the compiled CLI against a platform whose answer has no end', () => {
  it('trades get exits 1 naming the limit, having read about 1 MiB of a 256 MiB answer', async () => {
    const created = JSON.stringify(tradeRecord({ trade_id: 'tr_big', external_reference: 'big-1' }))
    let written = 0
    let closed = 0
    server = createServer((request, response) => {
      if (request.method === 'POST') {
        response.writeHead(201, { 'content-type': 'application/json' }).end(created)
        return
      }
      answerEndlessly(response, (bytes) => {
        written = bytes
        closed++
      })
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    const dataDir = migratedDataDir('answer-limit-')
    try {
      const env = { ...receiverEnv(dataDir), PARTNER_API_BASE_URL: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
      const open = ['trades', 'open', 'big-1', '--title', 'Chair', '--amount', '10.00', '--currency', 'EUR', '--seller', 's_1']
      expect((await runCli(open, env)).code).toBe(0)
      const get = await runCli(['trades', 'get', 'big-1'], env)
      expect(get.code).toBe(1)
      expect(get.stderr).toContain('the platform answered 200 with a body larger than 1,048,576 bytes')
      await expect.poll(() => closed).toBe(1)
      expect(written).toBeLessThan(32 * MiB)
    } finally {
      rmSync(dataDir, { recursive: true, force: true })
    }
  })
})
