// The poller with the real partner API client against a local platform that misbehaves on purpose: a 401 whose body
// is still coming when the cycle stops for another reason, and a 429 with `Retry-After: 0` to every call in flight.
// Requests are counted where the platform receives them.
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { directPlatformFetch } from '../src/partner-api/platform-fetch.js'
import type { RetryOptions } from '../src/partner-api/partner-api-transport.js'
import { UNAUTHORIZED_MESSAGE } from '../src/reconcile/reconcile-cycle.js'
import { FakeClock, ZeroSleepFakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { deferred, testPoller } from './helpers/reconcile-poller.js'
import { useTestDatabase } from './helpers/test-database.js'

const SECRET = 'apisec_poller_platform_answers_3b7e9c1d'

interface Platform {
  readonly url: string
  /** The trade id of every GET received, in order. */
  readonly requests: string[]
  close(): Promise<void>
}

/** A platform whose answer to each GET the test writes: `answer(tradeId, response)`. */
async function startPlatform(answer: (tradeId: string, response: ServerResponse) => void | Promise<void>): Promise<Platform> {
  const requests: string[] = []
  const server = createServer((request, response) => {
    const tradeId = /\/trades\/([^/]+)\//.exec(request.url ?? '')?.[1] ?? ''
    requests.push(tradeId)
    request.resume()
    // no Date header: the fake clock's time is not this machine's, and a 401 far off it would blame the clock
    response.sendDate = false
    response.on('error', () => {})
    void answer(tradeId, response)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}

function answerJson(response: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) {
  response.writeHead(status, { 'content-type': 'application/json', ...headers })
  response.end(JSON.stringify(body))
}

describe('the poller against a misbehaving platform', () => {
  const database = useTestDatabase()
  let clock: FakeClock
  let platform: Platform | undefined
  const fromNow = (s: number) => new Date(clock.now() + s * 1000)

  beforeEach(async () => {
    clock = new FakeClock()
    await database.db.deleteFrom('orders').execute()
    await database.db.deleteFrom('reconcileRuns').execute()
  })
  afterEach(async () => {
    await platform?.close()
    platform = undefined
  })

  function client(fetch?: typeof globalThis.fetch, retry?: Partial<RetryOptions>) {
    return new PartnerApiClient({
      baseUrl: platform!.url,
      keyId: 'pk_poller_platform_answers',
      secret: SECRET,
      env: 'sandbox',
      kind: 'marketplace',
      // never reached: the clock moves only where a test moves it
      timeoutMs: 60_000,
      clock,
      logger: testLogger([SECRET]),
      random: () => 0.5,
      ...(fetch ? { fetch } : {}),
      ...(retry ? { retry } : {}),
    })
  }

  /**
   * A platform that answers tr_o0 with the head of a 401 and holds its body; `others` answers the rest once that head
   * has reached the client. Answers the client, through a fetch that sees the head arrive.
   */
  async function heldUnauthorized(others: (response: ServerResponse) => void) {
    const headArrived = deferred<void>()
    platform = await startPlatform(async (tradeId, response) => {
      if (tradeId === 'tr_o0') {
        response.writeHead(401, { 'content-type': 'application/json', 'content-length': '200' })
        response.write('{"error":{"code":"invalid_signature",')
        return
      }
      await headArrived.promise
      others(response)
    })
    const platformFetch = directPlatformFetch()
    const fetch = (async (input: Parameters<typeof globalThis.fetch>[0], init?: Parameters<typeof globalThis.fetch>[1]) => {
      const response = await platformFetch(input, init)
      if (response.status === 401) headArrived.resolve()
      return response
    }) as typeof globalThis.fetch
    return { api: client(fetch, { maxAttempts: 1 }), headArrived: headArrived.promise }
  }

  // found from outside: a 401 whose answer was still arriving when the cycle stopped was counted as a call aborted, and
  // the cycle reported the platform failing, not our credentials
  it('counts and reports a 401 that was arriving when polls in a row failing stopped the cycle as unauthorized', async () => {
    const dueTimes = Array.from({ length: 10 }, (_, i) => fromNow(-100 + i))
    await insertOrders(database.db, dueTimes.map((nextPollAt, i) => ({ externalReference: `o${i}`, nextPollAt })))
    const { api } = await heldUnauthorized((response) => answerJson(response, 503, { error: { code: 'unavailable', message: 'down' } }))
    const replica = 'replica-401-while-failing'
    const poller = testPoller({ db: database.db, fetcher: api, clock, replica, settings: { concurrency: 5 } })

    const summary = await poller.runOnce()

    expect(summary.stoppedReason).toBe('unauthorized')
    expect(summary.results.unauthorized).toBe(1)
    expect(poller.reported.filter((result) => result.result === 'unauthorized').map((result) => result.externalReference)).toEqual(['o0'])
    const run = await database.db.selectFrom('reconcileRuns').selectAll().executeTakeFirstOrThrow()
    expect(run.stoppedReason).toBe('unauthorized')
    const errors = logEntries().filter((entry) => entry.replica === replica && Number(entry.level) >= 50)
    expect(errors.map((entry) => entry.msg)).toEqual([UNAUTHORIZED_MESSAGE])
    // given back as any 401's order: due as before, no attempt counted
    const refused = await orderByReference(database.db, 'o0')
    expect([new Date(refused.nextPollAt!).toISOString(), refused.pollAttempts, refused.pollLeaseToken]).toEqual([dueTimes[0]!.toISOString(), 0, null])
  })

  it('counts and reports a 401 that was arriving when the poller was stopped as unauthorized', async () => {
    const dueAt = fromNow(-10)
    await insertOrders(database.db, [{ externalReference: 'o0', nextPollAt: dueAt }])
    const { api, headArrived } = await heldUnauthorized(() => {})
    const replica = 'replica-401-at-stop'
    const poller = testPoller({ db: database.db, fetcher: api, clock, replica })

    poller.start()
    await headArrived
    await poller.stop()

    expect(poller.reported.map((result) => [result.externalReference, result.result])).toEqual([['o0', 'unauthorized']])
    expect(poller.cycles.map((cycle) => [cycle.stoppedReason, cycle.results.unauthorized])).toEqual([['unauthorized', 1]])
    const run = await database.db.selectFrom('reconcileRuns').selectAll().executeTakeFirstOrThrow()
    expect(run.stoppedReason).toBe('unauthorized')
    const errors = logEntries().filter((entry) => entry.replica === replica && Number(entry.level) >= 50)
    expect(errors.map((entry) => entry.msg)).toEqual([UNAUTHORIZED_MESSAGE])
    const order = await orderByReference(database.db, 'o0')
    expect([new Date(order.nextPollAt!).toISOString(), order.pollAttempts]).toEqual([dueAt.toISOString(), 0])
  })

  // found from outside: with `Retry-After: 0`, each call in flight sent its four attempts at once before the cycle
  // stopped on the first one to give up
  it('sends each order in flight one request when the platform answers 429 with Retry-After: 0, then stops the cycle', async () => {
    clock = new ZeroSleepFakeClock()
    await insertOrders(database.db, Array.from({ length: 20 }, (_, i) => ({ externalReference: `o${i}`, nextPollAt: fromNow(-100 + i) })))
    platform = await startPlatform((_tradeId, response) =>
      answerJson(response, 429, { error: { code: 'rate_limited', message: 'slow down' } }, { 'retry-after': '0' }),
    )
    const concurrency = 4
    const poller = testPoller({ db: database.db, fetcher: client(), clock, replica: 'replica-429-zero', settings: { concurrency } })

    const summary = await poller.runOnce()

    expect(summary.stoppedReason).toBe('throttled')
    // one request per call in flight at most: the first call's retry waits the backoff, and the others' 429s are not
    // retried (a call the cycle's stop came before sends none: how many began first depends on the machine)
    expect(platform.requests.length).toBeGreaterThanOrEqual(1)
    expect(platform.requests.length).toBeLessThanOrEqual(concurrency)
    expect(summary.results.throttled).toBeGreaterThanOrEqual(1)
    expect(summary.claimed).toBe(20)
  })
})
