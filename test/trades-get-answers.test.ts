// `trades get` is a read: it shows the platform's record of the order's trade and records nothing. A record of
// another trade is refused as `trades fund` refuses it ([answer_mismatch], exit 1, nothing shown or recorded), and
// the poller, meeting the same answer, applies nothing. A GET that gets no answer changed nothing, so it is
// `[no_answer]`, to be run again; a POST that gets none keeps `[outcome_unknown]`. A real HTTP server plays the
// platform (the client's retries and timeouts are the real ones, on a fake clock).
import { once } from 'node:events'
import { createServer, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as delay } from 'node:timers/promises'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { runCapturedCommandLine } from '../src/cli/run-cli.js'
import { createPartnerApiClient } from '../src/partner-api/create-partner-api-client.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type PlannedAnswer, type RecordedRequest, type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { testPoller } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

let database: TestDatabase
let server: RecordingServer
let context: CliContext
let answer: (request: RecordedRequest) => PlannedAnswer

beforeAll(async () => {
  database = await createTestDatabase()
  server = await startRecordingServer({ secret: TEST_API_SECRET, answer: (request) => answer(request) })
  context = { config: testConfig({ PARTNER_API_BASE_URL: server.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
})
afterAll(async () => {
  await server.close()
  await database.close()
})
beforeEach(async () => {
  await database.db.deleteFrom('orders').execute()
})

const historyOf = async (externalReference: string) => {
  const order = await orderByReference(database.db, externalReference)
  return database.db.selectFrom('orderStatusHistory').selectAll().where('orderId', '=', order.id).execute()
}

/** The platform answers every call on the trade with the record of `OTHER-<the trade asked for>`, released. */
const answerAnotherTrade = (externalReference: string) =>
  (answer = (request) => {
    const asked = decodeURIComponent(request.path.split('/')[5]!)
    return { status: 200, body: tradeRecord({ trade_id: `OTHER-${asked}`, status: 'released', external_reference: externalReference }) }
  })

describe('a record of another trade', () => {
  it('trades get refuses it as trades fund does: exit 1, [answer_mismatch], nothing printed or recorded', async () => {
    await insertOrders(database.db, [{ externalReference: 'o-proto', tradeId: 'T-x', tradeStatus: 'created' }])
    answerAnotherTrade('o-proto')
    const before = await orderByReference(database.db, 'o-proto')

    for (const args of [['trades', 'get', 'o-proto'], ['trades', 'get', 'o-proto', '--json']]) {
      const get = await runCommandWith(args)
      expect(server.requests.at(-1)).toMatchObject({ method: 'GET', path: '/api/partner/v1/trades/T-x/', signatureValid: true })
      expect(get.code).toBe(1)
      expect(get.stdout).toBe('')
      expect(get.stderr).toBe(
        'The platform answered for order o-proto (trade T-x) with the record of trade OTHER-T-x for external reference ' +
          'o-proto: another trade or order. Nothing of it is shown, and a GET changes nothing on the platform; the ' +
          'poller flags the order trade_mismatch if it is answered the same. [answer_mismatch]\n',
      )
    }
    const unchanged = await orderByReference(database.db, 'o-proto')
    expect(unchanged).toEqual(before)
    const warned = logEntries().filter((entry) => entry.externalReference === 'o-proto' && entry.answeredTradeId === 'OTHER-T-x')
    expect(warned).toHaveLength(2)
    expect(warned[0]!.msg).toContain('another trade')

    // the same answer to a fund: the same code, and the order as it was
    const fund = await runCommandWith(['trades', 'fund', 'o-proto'])
    expect(fund.code).toBe(1)
    expect(fund.stdout).toBe('')
    expect(fund.stderr).toMatch(/^The platform answered for order o-proto \(trade T-x\) with the record of trade OTHER-T-x .* \[answer_mismatch\]\n$/)

    expect(await orderByReference(database.db, 'o-proto')).toMatchObject({ tradeId: 'T-x', tradeStatus: 'created', attention: null })
    expect(await historyOf('o-proto')).toEqual([])
  })

  it('shows the answered id on one line: a line feed in it forges no line of the output', async () => {
    await insertOrders(database.db, [{ externalReference: 'o-forge', tradeId: 'T-f' }])
    answer = () => ({ status: 200, body: tradeRecord({ trade_id: 'T-f\no-forge: trade T-f (R) is released', external_reference: 'o-forge' }) })
    const get = await runCommandWith(['trades', 'get', 'o-forge'])
    expect(get.code).toBe(1)
    expect(get.stderr.split('\n')).toHaveLength(2)
    expect(get.stderr).toContain('record of trade T-f\\u000ao-forge: trade T-f (R) is released for external reference o-forge')
  })

  it('refuses the order’s own trade filed under another order’s reference, as trades fund and the poller do', async () => {
    await insertOrders(database.db, [{ externalReference: 'o-filed', tradeId: 'T-filed', tradeStatus: 'created' }])
    answer = () => ({ status: 200, body: tradeRecord({ trade_id: 'T-filed', status: 'funded', external_reference: 'someone-else' }) })
    const get = await runCommandWith(['trades', 'get', 'o-filed'])
    expect(get.code).toBe(1)
    expect(get.stdout).toBe('')
    expect(get.stderr).toContain('with the record of trade T-filed for external reference someone-else: another trade or order')
    expect(get.stderr).toMatch(/ \[answer_mismatch\]\n$/)
    const fund = await runCommandWith(['trades', 'fund', 'o-filed'])
    expect(fund.stderr).toMatch(/ \[answer_mismatch\]\n$/)
    expect(await orderByReference(database.db, 'o-filed')).toMatchObject({ tradeStatus: 'created' })
  })

  it('still shows the trade’s own record, the one the order is linked to', async () => {
    await insertOrders(database.db, [{ externalReference: 'o-own', tradeId: 'T-own', tradeStatus: 'created' }])
    answer = () => ({ status: 200, body: tradeRecord({ trade_id: 'T-own', reference: 'R-own', status: 'funded', external_reference: 'o-own' }) })
    const get = await runCommandWith(['trades', 'get', 'o-own'])
    expect(get.stderr).toBe('')
    expect(get.code).toBe(0)
    expect(get.stdout).toMatch(/^o-own: trade T-own \(R-own\) is funded on the platform\nlocal order: /)
    // a read: the local order keeps its status, the platform's is not applied
    expect(await orderByReference(database.db, 'o-own')).toMatchObject({ tradeStatus: 'created' })
    expect(await historyOf('o-own')).toEqual([])
  })

  it('the poller, asking the real client, applies nothing of it: an error of the cycle, the order flagged', async () => {
    const clock = new FakeClock()
    await insertOrders(database.db, [{ externalReference: 'o-poll', tradeId: 'T-p', tradeStatus: 'funded', nextPollAt: new Date(clock.now() - 1_000) }])
    answerAnotherTrade('o-poll')
    const logger = testLogger([TEST_API_SECRET])
    const fetcher = createPartnerApiClient(context.config, { logger, clock })
    const poller = testPoller({ db: database.db, fetcher, clock, logger })

    const summary = await poller.runOnce()

    expect(server.requests.at(-1)).toMatchObject({ method: 'GET', path: '/api/partner/v1/trades/T-p/', signatureValid: true })
    expect(summary).toMatchObject({ claimed: 1, polled: 1, changed: 0, errors: 1 })
    expect(summary.results).toMatchObject({ applied: 0, trade_mismatch: 1 })
    expect(poller.reported.map(({ result }) => result)).toEqual(['trade_mismatch'])
    expect(await orderByReference(database.db, 'o-poll')).toMatchObject({
      tradeId: 'T-p',
      tradeStatus: 'funded',
      isTerminal: false,
      attention: 'trade_mismatch',
      nextPollAt: null,
    })
    expect(await historyOf('o-poll')).toEqual([])
  })
})

describe('a call that gets no answer', () => {
  // a platform of its own that holds or cuts each connection as the test says, and lists what it was sent
  let respond: (response: ServerResponse) => void
  const received: string[] = []
  let silent: Server
  let silentContext: CliContext
  beforeAll(async () => {
    silent = createServer((request, response) => {
      request.resume()
      request.on('end', () => {
        received.push(`${request.method} ${request.url}`)
        respond(response)
      })
    })
    silent.listen(0, '127.0.0.1')
    await once(silent, 'listening')
    const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`
    silentContext = { ...context, config: testConfig({ PARTNER_API_BASE_URL: url }) }
  })
  afterAll(async () => {
    silent.closeAllConnections()
    await new Promise((resolve) => silent.close(resolve))
  })

  /** Answers 200 and then a byte of a body every 20 ms, never the end: a platform that trickles. */
  const trickle = (response: ServerResponse) => {
    response.writeHead(200, { 'content-type': 'application/json' })
    response.write('{')
    const timer = setInterval(() => response.write(' '), 20)
    response.on('close', () => clearInterval(timer))
  }

  /**
   * Runs `args` on a fake clock: for each of `attempts`, once the platform has it, moves the clock past its
   * timeout (when the platform `holds` it) and then past the backoff before the next. Answers the command's
   * result and the requests the platform got.
   */
  async function runOnFakeClock(args: string[], { attempts, holds }: { attempts: number; holds: boolean }) {
    const clock = new FakeClock()
    const timeoutMs = silentContext.config.partner.timeoutMs
    const before = received.length
    const sent = () => received.length - before
    const slept = (timeouts: boolean) => clock.sleeps.filter((ms) => (ms === timeoutMs) === timeouts).length
    let ended = false
    const result = runCommandWith(args, { ...silentContext, clock }).finally(() => (ended = true))
    for (let attempt = 1; attempt <= attempts; attempt++) {
      if (holds) {
        await until(() => ended || (sent() >= attempt && slept(true) >= attempt))
        await clock.advance(timeoutMs)
      }
      if (attempt < attempts) {
        // the backoff: at most 800 ms, after the third attempt
        await until(() => ended || slept(false) >= attempt)
        await clock.advance(1_000)
      }
    }
    return { ...(await result), requests: received.slice(before) }
  }

  it('trades get: [no_answer] after the 4 attempts, saying nothing was changed; exit 1, nothing printed', async () => {
    await insertOrders(database.db, [{ externalReference: 'o-slow', tradeId: 'T-slow', tradeStatus: 'created' }])
    respond = trickle
    for (const args of [['trades', 'get', 'o-slow'], ['trades', 'get', 'o-slow', '--json']]) {
      const get = await runOnFakeClock(args, { attempts: 4, holds: true })
      expect(get.requests).toEqual(Array(4).fill('GET /api/partner/v1/trades/T-slow/'))
      expect(get.code).toBe(1)
      expect(get.stdout).toBe('')
      // each retry told as it comes, then the failure's line
      expect(get.stderr).toMatch(
        new RegExp(
          `^${[2, 3, 4].map((attempt) => `GET /api/partner/v1/trades/T-slow/: no answer within 10000 ms; sending it again in [\\d.]+ s \\(attempt ${attempt} of 4\\)\\n`).join('')}` +
            'GET /api/partner/v1/trades/T-slow/: no answer within 10000 ms after 4 attempts; nothing was changed by it: try again \\[no_answer\\]\\n$',
        ),
      )
    }
    // a read schedules nothing either
    expect(await orderByReference(database.db, 'o-slow')).toMatchObject({ tradeStatus: 'created', nextPollAt: null })
  })

  it('trades get: [no_answer] when every attempt’s connection is cut before an answer', async () => {
    await insertOrders(database.db, [{ externalReference: 'o-cut', tradeId: 'T-cut' }])
    respond = (response) => response.socket?.destroy()
    const get = await runOnFakeClock(['trades', 'get', 'o-cut'], { attempts: 4, holds: false })
    expect(get.requests).toEqual(Array(4).fill('GET /api/partner/v1/trades/T-cut/'))
    expect(get.code).toBe(1)
    expect(get.stderr).toMatch(
      /^(?:GET \/api\/partner\/v1\/trades\/T-cut\/: failed: .+; sending it again in [\d.]+ s \(attempt [234] of 4\)\n){3}GET \/api\/partner\/v1\/trades\/T-cut\/ failed: .+ after 4 attempts; nothing was changed by it: try again \[no_answer\]\n$/,
    )
  })

  it('trades fund, a POST sent once, keeps [outcome_unknown] and has the order polled soon', async () => {
    await insertOrders(database.db, [{ externalReference: 'o-fund', tradeId: 'T-fund', tradeStatus: 'created' }])
    respond = trickle
    const fund = await runOnFakeClock(['trades', 'fund', 'o-fund'], { attempts: 1, holds: true })
    expect(fund.requests).toEqual(['POST /api/partner/v1/trades/T-fund/fund/'])
    expect(fund.code).toBe(1)
    expect(fund.stderr).toBe(
      'POST /api/partner/v1/trades/T-fund/fund/: no answer within 10000 ms. The platform may or may not have done it: ' +
        'check with `trades get` (the order is polled soon). [outcome_unknown]\n',
    )
    const order = await orderByReference(database.db, 'o-fund')
    expect(order.tradeStatus).toBe('created')
    expect(order.nextPollAt).not.toBeNull()
  })
})

function runCommandWith(args: string[], withContext: CliContext = context) {
  return runCapturedCommandLine(args, withContext)
}

async function until(condition: () => boolean): Promise<void> {
  for (let waited = 0; !condition(); waited += 5) {
    if (waited > 10_000) throw new Error('timed out waiting for the condition')
    await delay(5)
  }
}
