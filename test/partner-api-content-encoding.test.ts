// An answer whose body is not what its Content-Encoding says (a 200 marked gzip whose bytes are plain JSON) came
// from the platform, and would come the same way again: a success answer is an invalid answer (invalid_response,
// field `(body)`), not retried, as any answer that fails its check; a refusal stands on its status, as one whose
// body is not JSON does. A connection lost in the middle of a gzip body is still a lost connection, and a GET is
// asked again. A body cut short of its end (a gzip without its trailer) is not what its Content-Encoding says either,
// and a success answer in a coding the client does not undo (x-foo; zstd, which Node's own fetch undoes on 24 but
// not on 20) is refused the same way, on every Node version. A real HTTP server plays the platform, answering with
// the exact bytes and headers each test gives it.
import { once } from 'node:events'
import { createServer, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import zlib, { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { systemClock } from '../src/clock.js'
import { decodedBody } from '../src/partner-api/content-coding.js'
import { createPartnerApiClient } from '../src/partner-api/create-partner-api-client.js'
import { isOutcomeUnknown, PartnerApiError, PartnerInvalidResponseError } from '../src/partner-api/partner-api-error.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

type Answer = (response: ServerResponse) => void

let server: Server
let url: string
/** Answers for the next requests, in order; then `planned`. */
const queued: Answer[] = []
let planned: Answer
const requests: { method: string; path: string; acceptEncoding: string | undefined }[] = []

beforeAll(async () => {
  server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      requests.push({ method: request.method ?? '', path: request.url ?? '', acceptEncoding: request.headers['accept-encoding'] })
      ;(queued.shift() ?? planned)(response)
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(async () => {
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
})
beforeEach(() => {
  queued.length = 0
})

/** Exactly these bytes, with this Content-Encoding. */
const encoded =
  (status: number, contentEncoding: string, body: Buffer | string): Answer =>
  (response) => {
    response.writeHead(status, { 'content-type': 'application/json', 'content-encoding': contentEncoding })
    response.end(body)
  }

const recordText = (tradeId = 'tr_1') => JSON.stringify(tradeRecord({ trade_id: tradeId }))

const client = () =>
  createPartnerApiClient(testConfig({ PARTNER_API_BASE_URL: url }), {
    logger: testLogger([TEST_API_SECRET]),
    clock: systemClock,
    retry: { baseDelayMs: 1, maxDelayMs: 1 },
  })

const invalidFor = (method: string, path: string, problem: string) =>
  `${method} ${path}: the platform answered 200 with a body that is not the expected record ((body) ${problem})`

describe('the partner API client and a success answer whose body is not what its Content-Encoding says', () => {
  it.each([
    ['gzip', 'plain JSON', recordText(), 'Z_DATA_ERROR'],
    ['gzip', 'a gzip record with bytes after it', Buffer.concat([gzipSync(recordText()), Buffer.from('trailing')]), 'Z_DATA_ERROR'],
    ['deflate', 'plain JSON', recordText(), 'Z_DATA_ERROR'],
    ['br', 'plain JSON', recordText(), 'ERR__ERROR_FORMAT_PADDING_2'],
    // cut short in its framing: fetch's lenient decoding took these as whole
    ['gzip', 'a gzip record without its trailer (checksum and length)', gzipSync(recordText()).subarray(0, -8), 'Z_BUF_ERROR'],
    ['gzip', 'a gzip record cut in the middle', gzipSync(recordText()).subarray(0, 30), 'Z_BUF_ERROR'],
    ['deflate', 'a deflate record without its checksum', deflateSync(recordText()).subarray(0, -4), 'Z_BUF_ERROR'],
    ['br', 'a br record without its last bytes', brotliCompressSync(recordText()).subarray(0, -4), 'Z_BUF_ERROR'],
    // a coding it does not know: refused unread, rather than read as plain bytes
    ['x-foo', 'plain JSON', recordText(), undefined],
  ])('refuses a GET answered %s over %s with invalid_response, and does not ask again', async (encoding, _what, body, code) => {
    planned = encoded(200, encoding, body)
    const before = requests.length
    const failure = await client().getTrade('tr_1').catch((error: unknown) => error)
    expect(requests.length - before).toBe(1)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure).toMatchObject({ code: 'invalid_response', status: 200, field: '(body)' })
    const problem = code
      ? `could not be decoded as its Content-Encoding "${encoding}" says (${code})`
      : `is in the Content-Encoding "${encoding}", which this client does not decode (it accepts gzip, deflate, br)`
    expect((failure as Error).message).toBe(invalidFor('GET', '/api/partner/v1/trades/tr_1/', problem))
  })

  it('refuses a write answered so the same way: the fund may have happened, so its outcome is unknown', async () => {
    planned = encoded(200, 'gzip', recordText('tr_2'))
    const failure = await client().fundTrade('tr_2').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(isOutcomeUnknown(failure)).toBe(true)
  })

  it('names an unknown coding among known ones quoted and shortened, as the header writes it', async () => {
    planned = encoded(200, `gzip, X-${'é'.repeat(60)}`, gzipSync(recordText()))
    const failure = (await client().getTrade('tr_1').catch((error: unknown) => error)) as Error
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    // the coding alone, cut at 40 characters
    expect(failure.message).toContain(`(body) is in the Content-Encoding "X-${'é'.repeat(38)}… (62 characters)", which this client does not decode`)
  })

  it('refuses a success answer in zstd on every Node version, and asks only for the codings it decodes', async () => {
    // Node 22.15 and later can write zstd; on Node 20 the bytes only need to be marked so
    const body = 'zstdCompressSync' in zlib ? (zlib as unknown as { zstdCompressSync(text: string): Buffer }).zstdCompressSync(recordText()) : recordText()
    planned = encoded(200, 'zstd', body)
    const before = requests.length
    const failure = await client().fundTrade('tr_1').catch((error: unknown) => error)
    expect(requests.slice(before)).toEqual([{ method: 'POST', path: '/api/partner/v1/trades/tr_1/fund/', acceptEncoding: 'gzip, deflate, br' }])
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect((failure as Error).message).toBe(
      `POST /api/partner/v1/trades/tr_1/fund/: the platform answered 200 with a body that is not the expected record ` +
        '((body) is in the Content-Encoding "zstd", which this client does not decode (it accepts gzip, deflate, br))',
    )
    // the fund may have happened: its outcome is unknown, as for any answer that is not the record
    expect(isOutcomeUnknown(failure)).toBe(true)
  })

  it('names the Content-Encoding as the header has it: two codings, the body gzipped once', async () => {
    planned = encoded(200, 'gzip, gzip', gzipSync(recordText()))
    const failure = (await client().getTrade('tr_1').catch((error: unknown) => error)) as Error
    expect(failure.message).toContain('(body) could not be decoded as its Content-Encoding "gzip, gzip" says (Z_DATA_ERROR)')
  })

  // each coding is a decoder of its own: 2,500 gzip layers in a 71-KB body took 53 s of decoding past a 1.5-s
  // timeout, and 339 MB. More than five are refused by the header, as fetch refuses them, and nothing is decoded
  it('refuses a success answer listing more than five codings, unread, and reads one with five', async () => {
    const layered = (layers: number) => {
      let body = Buffer.from(recordText())
      for (let layer = 0; layer < layers; layer++) body = gzipSync(body)
      return body
    }
    planned = encoded(200, Array(6).fill('gzip').join(', '), layered(6))
    const before = requests.length
    const failure = (await client().getTrade('tr_1').catch((error: unknown) => error)) as Error
    expect(requests.length - before).toBe(1)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure.message).toBe(invalidFor('GET', '/api/partner/v1/trades/tr_1/', 'is in 6 Content-Encodings, more than the 5 this client undoes'))
    planned = encoded(200, 'gzip,gzip, gzip,  gzip,gzip', layered(5))
    await expect(client().getTrade('tr_1')).resolves.toMatchObject({ trade_id: 'tr_1' })
  })

  it('takes a refusal listing more than five codings by its status, its body not decoded', async () => {
    planned = encoded(409, Array(2_500).fill('gzip').join(','), gzipSync('{"error":{"code":"invalid_state","message":"not now"}}'))
    const failure = await client().releaseTrade('tr_3').catch((error: unknown) => error)
    expect(failure).toMatchObject({ status: 409, code: 'http_409' })
  })

  it.each([
    ['gzip', gzipSync],
    ['deflate', deflateSync],
    ['br', brotliCompressSync],
  ])('reads a record that is %s as it says', async (encoding, compress) => {
    planned = encoded(200, encoding, compress(recordText()))
    await expect(client().getTrade('tr_1')).resolves.toMatchObject({ trade_id: 'tr_1' })
  })

  it('still asks a GET again when the connection is lost in the middle of a gzip body', async () => {
    const whole = gzipSync(recordText())
    queued.push((response) => {
      response.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': whole.length })
      response.write(whole.subarray(0, 10))
      setTimeout(() => response.socket?.destroy(), 20)
    })
    planned = encoded(200, 'gzip', whole)
    const before = requests.length
    await expect(client().getTrade('tr_1')).resolves.toMatchObject({ trade_id: 'tr_1' })
    expect(requests.length - before).toBe(2)
  })
})

// the body may have come whole before the call's timeout fires: the decoding must end with it, not run on
describe('decodedBody and the call\'s signal', () => {
  it('ends the decoding of a body already received when the signal is aborted, with its reason', async () => {
    const compressed = gzipSync(Buffer.alloc(64 * 1024 * 1024))
    const received = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new Uint8Array(compressed))
        controller.close()
      },
    })
    const timedOut = new AbortController()
    const reader = decodedBody(received, 'gzip', timedOut.signal).getReader()
    const first = await reader.read()
    expect(first.done).toBe(false)
    timedOut.abort(new Error('the call timed out'))
    const rest = (async () => {
      for (;;) if ((await reader.read()).done) return 'read to its end'
    })()
    await expect(rest).rejects.toMatchObject({ cause: { message: 'the call timed out' } })
  })
})

describe('the partner API client and a refusal whose body is not what its Content-Encoding says', () => {
  it('takes a 409 for the refusal it is, by its status: the platform did answer', async () => {
    planned = encoded(409, 'gzip', '{"error":{"code":"invalid_state","message":"not now"}}')
    const failure = await client().releaseTrade('tr_3').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerApiError)
    expect(failure).toMatchObject({ status: 409, code: 'http_409' })
    expect((failure as Error).message).toBe('POST /api/partner/v1/trades/tr_3/release/ answered 409 http_409')
    // refused: nothing happened on the platform
    expect(isOutcomeUnknown(failure)).toBe(false)
  })

  // a Response cannot be rebuilt with a status past 599: the answer read as a lost connection, in fetch's words
  it('takes a 799 marked gzip by its status, as any refusal, not as a lost connection', async () => {
    planned = encoded(799, 'gzip', gzipSync('{"error":{"code":"odd","message":"odd"}}'))
    const failure = await client().fundTrade('tr_4').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerApiError)
    expect(failure).toMatchObject({ status: 799, code: 'http_799' })
    expect((failure as Error).message).toBe('POST /api/partner/v1/trades/tr_4/fund/ answered 799 http_799')
  })

  it('asks a GET again after a 503 so, as after any 503', async () => {
    queued.push(encoded(503, 'gzip', 'Service unavailable'))
    planned = encoded(200, 'gzip', gzipSync(recordText()))
    const before = requests.length
    await expect(client().getTrade('tr_1')).resolves.toMatchObject({ trade_id: 'tr_1' })
    expect(requests.length - before).toBe(2)
  })
})

describe('an answer that cannot be decoded, where the CLI meets it', () => {
  let database: TestDatabase
  let context: CliContext
  beforeAll(async () => {
    database = await createTestDatabase()
    context = { config: testConfig({ PARTNER_API_BASE_URL: url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
  })
  afterAll(() => database.close())

  it('trades get asks once, prints the answer’s fault and [invalid_response], exit 1, and prints no record', async () => {
    await insertOrders(database.db, [{ externalReference: 'gz-1', tradeStatus: 'created' }])
    planned = encoded(200, 'gzip', recordText('tr_gz-1'))
    const before = requests.length
    const result = await runCommandWith(['trades', 'get', 'gz-1'], context)
    expect(requests.length - before).toBe(1)
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toBe(
      `${invalidFor('GET', '/api/partner/v1/trades/tr_gz-1/', 'could not be decoded as its Content-Encoding "gzip" says (Z_DATA_ERROR)')}; ` +
        'a GET changes nothing on the platform, and nothing of the answer is shown [invalid_response]\n',
    )
  })
})
