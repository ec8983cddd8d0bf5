// An answer of the platform that holds a key twice in one object is two answers in one: JSON.parse keeps the last
// value, another reader the first. The client refuses it as it refuses any answer that is not the record it
// expects (invalid_response), naming the key, and nothing acts on it: the poller backs the order off as for any
// malformed answer, and the CLI prints it with its code, the order untouched. A real HTTP server plays the
// platform and checks every signature.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { systemClock } from '../src/clock.js'
import { createPartnerApiClient } from '../src/partner-api/create-partner-api-client.js'
import { isOutcomeUnknown, PartnerApiError, PartnerInvalidResponseError } from '../src/partner-api/partner-api-error.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type PlannedAnswer, type RecordedRequest, type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { testPoller } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

/** The trade's record as the platform writes it, with `"status":"released"` written again after its `status`. */
function statusTwice(tradeId: string, externalReference: string): string {
  const record = JSON.stringify(tradeRecord({ trade_id: tradeId, external_reference: externalReference, status: 'funded' }))
  return record.replace('"status":"funded"', '"status":"funded","status":"released"')
}

/** The trade's record with one milestone holding `key` twice, written as given (escapes and all). */
function nestedTwice(tradeId: string, externalReference: string, key = '"status"'): string {
  const record = tradeRecord({
    trade_id: tradeId,
    external_reference: externalReference,
    milestones: [{ milestone_id: 'm_1', title: 'Frame', amount: '70.00', status: 'pending' }],
  })
  return JSON.stringify(record).replace('"status":"pending"', `"status":"pending",${key}:"released"`)
}

const invalidFor = (method: string, path: string, problem: string) =>
  `${method} ${path}: the platform answered 200 with a body that is not the expected record (${problem})`

let server: RecordingServer
let answer: (request: RecordedRequest) => PlannedAnswer
const answerText = (text: string, status = 200) => (answer = () => ({ status, text }))

beforeAll(async () => {
  server = await startRecordingServer({ secret: TEST_API_SECRET, answer: (request) => answer(request) })
})
afterAll(() => server.close())

describe('the partner API client', () => {
  const client = () =>
    createPartnerApiClient(testConfig({ PARTNER_API_BASE_URL: server.url }), { logger: testLogger([TEST_API_SECRET]), clock: systemClock })

  it('refuses a trade record whose status is written twice with invalid_response naming the key, and does not ask again', async () => {
    answerText(statusTwice('tr_1', 'order-1'))
    const before = server.requests.length
    const failure = await client().getTrade('tr_1').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
    expect(failure).toMatchObject({ code: 'invalid_response', status: 200, field: '(body)' })
    expect((failure as Error).message).toBe(
      invalidFor('GET', '/api/partner/v1/trades/tr_1/', '(body) holds the key "status" twice in one object'),
    )
    // the platform did answer, and would answer the same again
    expect(server.requests.length - before).toBe(1)
    expect(server.requests.at(-1)!.signatureValid).toBe(true)
  })

  it('finds the key twice at any depth, however it is escaped; an operation so answered may have taken effect', async () => {
    for (const key of ['"status"', '"st\\u0061tus"']) {
      answerText(nestedTwice('tr_2', 'order-2', key))
      const failure = await client().fundTrade('tr_2').catch((error: unknown) => error)
      expect(failure).toBeInstanceOf(PartnerInvalidResponseError)
      expect((failure as Error).message).toBe(
        invalidFor('POST', '/api/partner/v1/trades/tr_2/fund/', '(body) holds the key "status" twice in one object'),
      )
      // a POST: the fund may have happened, so its outcome is unknown (the order is polled soon)
      expect(isOutcomeUnknown(failure)).toBe(true)
    }
  })

  it('names a key from outside on one line, visible, and by its first 100 characters', async () => {
    const withExtra = (extra: string) => JSON.stringify(tradeRecord({ trade_id: 'tr_3' })).replace(/}$/, `,"extra":${extra}}`)
    // a reordering character and a line feed: shown as escapes, never acted on by a terminal or a log viewer
    answerText(withExtra('{"a\\u202eb\\nc":1,"a\\u202eb\\nc":2}'))
    const shown = (await client().getTrade('tr_3').catch((error: unknown) => error)) as Error
    expect(shown.message).toContain('(body) holds the key "a\\u202eb\\nc" twice in one object')
    expect(shown.message).not.toMatch(/[\u202e\n]/)
    const long = 'k'.repeat(300)
    answerText(withExtra(`{"${long}":1,"${long}":2}`))
    const cut = (await client().getTrade('tr_3').catch((error: unknown) => error)) as Error
    expect(cut.message).toContain(`(body) holds the key "${'k'.repeat(100)}…" twice in one object`)
  })

  it('accepts the same key in different objects: a trade’s status beside its milestones’', async () => {
    answerText(nestedTwice('tr_4', 'order-4', '"note"'))
    await expect(client().getTrade('tr_4')).resolves.toMatchObject({ trade_id: 'tr_4', milestones: [{ status: 'pending' }] })
  })

  it('reads no code or message from a refusal whose body holds a key twice: the status alone is the platform’s word', async () => {
    answerText('{"error":{"code":"invalid_state","code":"insufficient_funds","message":"no"}}', 409)
    const failure = await client().releaseTrade('tr_5').catch((error: unknown) => error)
    expect(failure).toBeInstanceOf(PartnerApiError)
    expect(failure).toMatchObject({ status: 409, code: 'http_409' })
    expect((failure as Error).message).toBe('POST /api/partner/v1/trades/tr_5/release/ answered 409 http_409')
  })
})

describe('an answer with a key twice, where the service and the CLI meet it', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(() => database.close())
  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
  })

  const historyOf = async (externalReference: string) => {
    const order = await orderByReference(database.db, externalReference)
    return database.db.selectFrom('orderStatusHistory').selectAll().where('orderId', '=', order.id).execute()
  }

  it('the poller leaves the order as it was and backs it off, as it does for an answer that is not JSON', async () => {
    const clock = new FakeClock()
    await insertOrders(database.db, [
      { externalReference: 'twice-1', nextPollAt: new Date(clock.now() - 2_000) },
      { externalReference: 'not-json-1', nextPollAt: new Date(clock.now() - 1_000) },
    ])
    answer = (request) =>
      request.path.includes('tr_twice-1') ? { status: 200, text: statusTwice('tr_twice-1', 'twice-1') } : { status: 200, text: '<html>' }
    const logger = testLogger([TEST_API_SECRET])
    const fetcher = createPartnerApiClient(testConfig({ PARTNER_API_BASE_URL: server.url }), { logger, clock })
    // one at a time, the order with the key twice first: its error is the one the cycle's line carries
    const poller = testPoller({ db: database.db, fetcher, clock, logger, settings: { concurrency: 1 } })

    const summary = await poller.runOnce()

    expect(summary).toMatchObject({ claimed: 2, polled: 2, changed: 0, errors: 2 })
    expect(summary.results.error).toBe(2)
    expect(poller.reported.map(({ externalReference, result }) => [externalReference, result])).toEqual([
      ['twice-1', 'error'],
      ['not-json-1', 'error'],
    ])
    expect(poller.reported[0]!.error).toBeInstanceOf(PartnerInvalidResponseError)
    const [twice, notJson] = [await orderByReference(database.db, 'twice-1'), await orderByReference(database.db, 'not-json-1')]
    for (const order of [twice, notJson]) {
      // neither `funded` nor `released` taken: as it was, its lease given up, due again after the first backoff
      expect(order).toMatchObject({ tradeStatus: 'funded', pollAttempts: 1, pollLeaseToken: null, attention: null })
      expect(await historyOf(order.externalReference)).toEqual([])
    }
    expect(new Date(twice.nextPollAt!).getTime()).toBe(new Date(notJson.nextPollAt!).getTime())
    expect(new Date(twice.nextPollAt!).getTime()).toBeGreaterThan(clock.now())
    const run = await database.db.selectFrom('reconcileRuns').selectAll().where('id', '=', summary.runId!).executeTakeFirstOrThrow()
    expect(run).toMatchObject({ polled: 2, changed: 0, errors: 2 })
    const line = logEntries().find((entry) => entry.msg === 'reconcile cycle done with errors: those orders back off' && entry.runId === summary.runId)
    expect((line?.err as { message?: string } | undefined)?.message).toBe(
      invalidFor('GET', '/api/partner/v1/trades/tr_twice-1/', '(body) holds the key "status" twice in one object'),
    )
  })

  describe('the CLI', () => {
    let context: CliContext
    beforeAll(() => {
      context = { config: testConfig({ PARTNER_API_BASE_URL: server.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
    })

    it('trades get prints the answer’s fault and our code, exit 1, and prints no record', async () => {
      await insertOrders(database.db, [{ externalReference: 'get-1' }])
      answerText(statusTwice('tr_get-1', 'get-1'))
      for (const args of [['trades', 'get', 'get-1'], ['trades', 'get', 'get-1', '--json']]) {
        const result = await runCommandWith(args, context)
        expect(result.code).toBe(1)
        expect(result.stdout).toBe('')
        expect(result.stderr).toBe(
          `${invalidFor('GET', '/api/partner/v1/trades/tr_get-1/', '(body) holds the key "status" twice in one object')}; ` +
            'a GET changes nothing on the platform, and nothing of the answer is shown [invalid_response]\n',
        )
      }
    })

    it('a key that reads like a database failure is still the answer’s fault, not the database’s', async () => {
      await insertOrders(database.db, [{ externalReference: 'get-2' }])
      answerText(statusTwice('tr_get-2', 'get-2').replace('"status":"released"', '"Connection terminated":1,"Connection terminated":2'))
      const result = await runCommandWith(['trades', 'get', 'get-2'], context)
      expect(result.code).toBe(1)
      expect(result.stderr).toMatch(/^GET \S+ the platform answered 200 .*\(\(body\) holds the key "Connection terminated" twice in one object\); .* \[invalid_response\]\n$/)
    })

    it('trades fund answered with a key twice records no status, and has the order polled soon', async () => {
      const clock = new FakeClock()
      await insertOrders(database.db, [{ externalReference: 'fund-1', tradeStatus: 'created' }])
      answerText(nestedTwice('tr_fund-1', 'fund-1'))
      const result = await runCommandWith(['trades', 'fund', 'fund-1'], { ...context, clock })
      expect(result.code).toBe(1)
      expect(result.stderr).toContain('(body) holds the key "status" twice in one object')
      expect(result.stderr).toMatch(/ \[outcome_unknown\]\n$/)
      expect(server.requests.at(-1)).toMatchObject({ method: 'POST', path: '/api/partner/v1/trades/tr_fund-1/fund/', signatureValid: true })
      // the fund may have happened: the order is not moved on the answer's word, and the poller asks soon
      const order = await orderByReference(database.db, 'fund-1')
      expect(order).toMatchObject({ tradeStatus: 'created' })
      expect(new Date(order.nextPollAt!).getTime()).toBe(clock.now() + context.config.poll.expectedWebhookS * 1000)
      expect(await historyOf('fund-1')).toEqual([])
    })
  })
})
