// JSON exchanged between systems is UTF-8 (RFC 8259 §8.1). A success answer of the platform whose Content-Type
// names another charset, or whose bytes are not UTF-8, is not decoded by a guess: the client refuses it as any
// answer that is not the expected record (invalid_response), naming the problem, and nothing acts on it. An error
// answer is read as before: only its status is acted on. A real HTTP server plays the platform, answering with
// the exact bytes and headers each test gives it.
import { once } from 'node:events'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { systemClock } from '../src/clock.js'
import { AnswerNotUtf8Error, readAnswer } from '../src/http/read-answer.js'
import { createPartnerApiClient } from '../src/partner-api/create-partner-api-client.js'
import { isOutcomeUnknown, PartnerApiError, PartnerInvalidResponseError } from '../src/partner-api/partner-api-error.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

interface Planned {
  status: number
  /** The Content-Type header as sent, or none at all. */
  contentType: string | undefined
  body: Buffer
}

let server: Server
let url: string
let planned: Planned
/** Answers for the next requests, before `planned`. */
const firstAnswers: Planned[] = []
const requests: { method: string; path: string }[] = []

const answer = (body: Buffer | string, contentType: string | undefined, status = 200): Planned => ({
  status,
  contentType,
  body: typeof body === 'string' ? Buffer.from(body, 'utf8') : body,
})

/** Answers every request with `body`, exactly these bytes, as `contentType` (none when undefined). */
function answerWith(body: Buffer | string, contentType: string | undefined, status = 200): void {
  planned = answer(body, contentType, status)
}

beforeAll(async () => {
  server = createServer((request, response) => {
    request.resume()
    request.on('end', () => {
      requests.push({ method: request.method ?? '', path: request.url ?? '' })
      const { status, contentType, body } = firstAnswers.shift() ?? planned
      response.writeHead(status, contentType === undefined ? {} : { 'content-type': contentType })
      response.end(body)
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

const client = () => createPartnerApiClient(testConfig({ PARTNER_API_BASE_URL: url }), { logger: testLogger([TEST_API_SECRET]), clock: systemClock })

const invalidFor = (method: string, path: string, problem: string) =>
  `${method} ${path}: the platform answered 200 with a body that is not the expected record ((body) ${problem})`

/** The trade's record as UTF-8 JSON, its title with characters of more than one byte. */
const recordText = (tradeId = 'tr_1') => JSON.stringify(tradeRecord({ trade_id: tradeId, title: 'Lampe à café 🙂' }))

/** The same record with its title's `à` written as Latin-1 writes it, one byte 0xE0: not UTF-8. */
function recordInLatin1(tradeId = 'tr_1'): Buffer {
  const text = JSON.stringify(tradeRecord({ trade_id: tradeId, title: 'Lampe à café' }))
  return Buffer.from(text, 'latin1')
}

describe('the partner API client and the charset of a success answer', () => {
  it('refuses a record declared in latin1 with invalid_response naming the charset, and does not ask again', async () => {
    answerWith(recordText(), 'application/json; charset=latin1')
    const before = requests.length
    const failure = await client().getTrade('tr_1').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure).toMatchObject({ code: 'invalid_response', status: 200, field: '(body)' })
    expect((failure as Error).message).toBe(invalidFor('GET', '/api/partner/v1/trades/tr_1/', 'is declared in the charset "latin1", not UTF-8'))
    // the platform did answer, and would answer the same again
    expect(requests.length - before).toBe(1)
  })

  it.each([
    ['application/json; charset=ISO-8859-1', '"ISO-8859-1"'],
    ['application/json;charset="windows-1252"', '"windows-1252"'],
    ['application/json; Charset=UTF-16', '"UTF-16"'],
    ['application/json; CHARSET = "latin1"', '"latin1"'],
    // two charsets: the first counts, as the media-type parser reads it
    ['application/json; charset=latin1; charset=utf-8', '"latin1"'],
    ['application/json; charset=', '""'],
  ])('refuses a record whose Content-Type is %s, naming %s', async (contentType, shown) => {
    answerWith(recordText(), contentType)
    const failure = await client().getTrade('tr_1').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect((failure as Error).message).toBe(invalidFor('GET', '/api/partner/v1/trades/tr_1/', `is declared in the charset ${shown}, not UTF-8`))
  })

  it('names a charset from outside on one line, visible, and by its first 40 characters', async () => {
    answerWith(recordText(), 'application/json; charset="latin\t1 \\"x\\";y"')
    const tab = (await client().getTrade('tr_1').catch((error: unknown) => error)) as Error
    expect(tab.message).toContain('(body) is declared in the charset "latin\\t1 \\"x\\";y", not UTF-8')
    expect(tab.message).not.toMatch(/[\t\n]/)
    answerWith(recordText(), `application/json; charset=${'x'.repeat(300)}`)
    const long = (await client().getTrade('tr_1').catch((error: unknown) => error)) as Error
    expect(long.message).toContain(`(body) is declared in the charset "${'x'.repeat(40)}… (300 characters)", not UTF-8`)
  })

  it('refuses a record whose bytes are not UTF-8 (Latin-1 sent undeclared) with invalid_response', async () => {
    answerWith(recordInLatin1(), 'application/json')
    const failure = await client().getTrade('tr_1').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure).toMatchObject({ code: 'invalid_response', status: 200, field: '(body)' })
    expect((failure as Error).message).toBe(invalidFor('GET', '/api/partner/v1/trades/tr_1/', 'is not valid UTF-8'))
  })

  it.each([
    ['a UTF-16 surrogate encoded in UTF-8 (CESU-8)', Buffer.from([0xed, 0xa0, 0xbd])],
    ['a sequence cut short at the end', Buffer.from([0xe2, 0x82])],
    ['an overlong encoding of "/"', Buffer.from([0xc0, 0xaf])],
  ])('refuses %s inside a record', async (_what, bytes) => {
    const [head, tail] = recordText().split('Lampe')
    answerWith(Buffer.concat([Buffer.from(`${head}Lampe`), bytes, Buffer.from(tail!)]), 'application/json; charset=utf-8')
    const failure = await client().getTrade('tr_1').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect((failure as Error).message).toBe(invalidFor('GET', '/api/partner/v1/trades/tr_1/', 'is not valid UTF-8'))
  })

  it.each([
    ['application/json; charset=UTF-8'],
    ['application/json; charset="utf-8"'],
    ['application/json;charset=utf8'],
    ['application/json'],
    [undefined],
  ])('accepts a UTF-8 record as %s, its characters as the platform wrote them', async (contentType) => {
    answerWith(recordText(), contentType)
    await expect(client().getTrade('tr_1')).resolves.toMatchObject({ trade_id: 'tr_1', title: 'Lampe à café 🙂' })
  })

  it('accepts a record after a byte order mark, as before', async () => {
    answerWith(`\ufeff${recordText()}`, 'application/json; charset=utf-8')
    await expect(client().getTrade('tr_1')).resolves.toMatchObject({ trade_id: 'tr_1', title: 'Lampe à café 🙂' })
  })

  it('refuses a write answered in latin1 the same way: the fund may have happened, so its outcome is unknown', async () => {
    answerWith(recordText('tr_2'), 'application/json; charset=latin1')
    const failure = await client().fundTrade('tr_2').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect((failure as Error).message).toBe(invalidFor('POST', '/api/partner/v1/trades/tr_2/fund/', 'is declared in the charset "latin1", not UTF-8'))
    expect(isOutcomeUnknown(failure)).toBe(true)
  })
})

describe('the partner API client and the charset of an error answer', () => {
  it('reads a refusal declared in latin1 as before: its status and code are the platform’s word', async () => {
    answerWith('{"error":{"code":"invalid_state","message":"not now"}}', 'application/json; charset=latin1', 409)
    const failure = await client().releaseTrade('tr_3').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerApiError)
    expect(failure).toMatchObject({ status: 409, code: 'invalid_state' })
    expect((failure as Error).message).toBe('POST /api/partner/v1/trades/tr_3/release/ answered 409 invalid_state: not now')
  })

  it('reads a refusal with bytes that are not UTF-8 as before, each shown as U+FFFD', async () => {
    answerWith(Buffer.from('{"error":{"code":"invalid_state","message":"d\u00e9j\u00e0"}}', 'latin1'), 'application/json', 409)
    const failure = await client().releaseTrade('tr_3').catch((error: unknown) => error)
    expect(failure).toMatchObject({ status: 409, code: 'invalid_state' })
    expect((failure as Error).message).toBe('POST /api/partner/v1/trades/tr_3/release/ answered 409 invalid_state: d\ufffdj\ufffd')
  })

  it('still asks again after a proxy’s 502 page in iso-8859-1 to a GET', async () => {
    const before = requests.length
    firstAnswers.push(answer('<html><body>Bad gateway</body></html>', 'text/html; charset=iso-8859-1', 502))
    answerWith(recordText(), 'application/json')
    await expect(client().getTrade('tr_1')).resolves.toMatchObject({ trade_id: 'tr_1' })
    expect(requests.length - before).toBe(2)
  })
})

describe('readAnswer, as every other caller reads', () => {
  it('decodes bytes that are not UTF-8 as U+FFFD without `fatal`, and rejects with AnswerNotUtf8Error with it', async () => {
    const bytes = () => new Response(Buffer.from([0x7b, 0xe9, 0x7d]))
    await expect(readAnswer(bytes(), 100)).resolves.toBe('{\ufffd}')
    await expect(readAnswer(bytes(), 100, { fatal: true })).rejects.toBeInstanceOf(AnswerNotUtf8Error)
    // past the limit is past the limit, with or without
    await expect(readAnswer(bytes(), 2, { fatal: true })).resolves.toBeUndefined()
    await expect(readAnswer(new Response('\ufeff{"a":"à"}'), 100, { fatal: true })).resolves.toBe('{"a":"à"}')
  })
})

describe('an answer in another charset, where the CLI meets it', () => {
  let database: TestDatabase
  let context: CliContext
  beforeAll(async () => {
    database = await createTestDatabase()
    context = { config: testConfig({ PARTNER_API_BASE_URL: url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
  })
  afterAll(() => database.close())
  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
  })

  it('trades get prints the answer’s fault and [invalid_response], exit 1, and prints no record', async () => {
    await insertOrders(database.db, [{ externalReference: 'get-1' }])
    answerWith(recordText('tr_get-1'), 'application/json; charset=latin1')
    const result = await runCommandWith(['trades', 'get', 'get-1'], context)
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toBe(
      `${invalidFor('GET', '/api/partner/v1/trades/tr_get-1/', 'is declared in the charset "latin1", not UTF-8')}; ` +
        'a GET changes nothing on the platform, and nothing of the answer is shown [invalid_response]\n',
    )
  })

  // an outside attack's poll stored `deliv\ufffdred` as a status from a 0xFF byte, and took an order off the schedule as
  // another order's trade from a Latin-1 reference
  it('reconcile --once stores nothing of a poll answered in Latin-1 bytes: the order backs off as after any malformed answer', async () => {
    await insertOrders(database.db, [{ externalReference: 'poll-1', tradeId: 'tr_poll-1', tradeStatus: 'created', nextPollAt: new Date(Date.now() - 60_000) }])
    answerWith(recordInLatin1('tr_poll-1'), 'application/json')
    const result = await runCommandWith(['reconcile', '--once', '--json'], context)
    expect(JSON.parse(result.stdout)).toMatchObject({ claimed: 1, changed: 0, errors: 1, results: { error: 1, trade_mismatch: 0 } })
    const order = await orderByReference(database.db, 'poll-1')
    expect(order).toMatchObject({ tradeStatus: 'created', attention: null, pollAttempts: 1 })
    expect(new Date(order.nextPollAt!).getTime()).toBeGreaterThan(Date.now())
    const history = await database.db.selectFrom('orderStatusHistory').select('toStatus').where('orderId', '=', order.id).execute()
    expect(history).toEqual([])
  })

  it('trades fund answered with bytes that are not UTF-8 records no status, says [outcome_unknown], and has the order polled soon', async () => {
    const clock = new FakeClock()
    await insertOrders(database.db, [{ externalReference: 'fund-1', tradeStatus: 'created' }])
    answerWith(recordInLatin1('tr_fund-1'), 'application/json')
    const result = await runCommandWith(['trades', 'fund', 'fund-1'], { ...context, clock })
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toContain(invalidFor('POST', '/api/partner/v1/trades/tr_fund-1/fund/', 'is not valid UTF-8'))
    expect(result.stderr).toMatch(/ \[outcome_unknown\]\n$/)
    expect(requests.at(-1)).toEqual({ method: 'POST', path: '/api/partner/v1/trades/tr_fund-1/fund/' })
    // the fund may have happened: the order is not moved on the answer's word, and the poller asks soon
    const order = await orderByReference(database.db, 'fund-1')
    expect(order).toMatchObject({ tradeStatus: 'created' })
    expect(new Date(order.nextPollAt!).getTime()).toBe(clock.now() + context.config.poll.expectedWebhookS * 1000)
  })
})
