// poller_orders_due and poller_oldest_due_age_seconds through the service's /metrics: an order counts as due from the
// time its poll came due until a poll of it is answered, whether a cycle holds it (its lease) or it waits out the
// backoff of a failed poll. Read from next_poll_at alone, both read 0 at a scrape during the cycle that held every due
// order, and through each backoff of a platform that failed, so PartnerEscrowOldestDueOrderLate flapped through a long
// outage of the platform (found by a review of an on-call night).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import type { RunningService } from '../src/service.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { eventually, pollerSleeps, SERVICE_POLL_INTERVAL_MS } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { scrapeMetrics, startTestService } from './helpers/test-service.js'

/** 20 s behind the machine's (and the database's) time, on a whole second, as test/poller-service.test.ts's. */
const nearDatabaseTime = () => Math.floor(Date.now() / 1000) * 1000 - 20_000

/** A platform that holds every GET until the test answers it. */
interface HeldPlatform {
  readonly url: string
  /** The GETs received and not answered yet, by the trade id in their path. */
  readonly held: Map<string, ServerResponse>
  close(): Promise<void>
}

async function startHeldPlatform(): Promise<HeldPlatform> {
  const held = new Map<string, ServerResponse>()
  const server: Server = createServer((request: IncomingMessage, response: ServerResponse) => {
    request.resume()
    request.on('end', () => held.set(/\/trades\/([^/]+)\//.exec(request.url ?? '')?.[1] ?? '', response))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    held,
    close: async () => {
      for (const response of held.values()) response.destroy()
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

function answer(platform: HeldPlatform, tradeId: string, status: number, body: unknown): void {
  const response = platform.held.get(tradeId)!
  platform.held.delete(tradeId)
  response.writeHead(status, { 'content-type': 'application/json' })
  response.end(JSON.stringify(body))
}

const gauges = (scrape: string) => ({
  due: /^poller_orders_due (\S+)$/m.exec(scrape)?.[1],
  oldest: /^poller_oldest_due_age_seconds (\S+)$/m.exec(scrape)?.[1],
})

let service: RunningService | undefined
let platform: HeldPlatform | undefined
afterEach(async () => {
  await platform?.close()
  await service?.stop()
  service = undefined
  platform = undefined
})

/** Two orders due, held by one cycle's GETs, then one answered and one refused, scraped at each step. */
async function holdAndAnswer(database: Record<string, string> = {}): Promise<void> {
  platform = await startHeldPlatform()
  const clock = new FakeClock(nearDatabaseTime())
  const config = testConfig({ PARTNER_API_BASE_URL: platform.url, PORT: '0', POLL_INTERVAL_S: String(SERVICE_POLL_INTERVAL_MS / 1000), ...database })
  service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]), clock })
  await service.ready
  await eventually(() => pollerSleeps(clock) === 1, 'the poller sleeps')
  await insertOrders(service.database.db, [
    { externalReference: 'late-1', nextPollAt: new Date(clock.now() - 90_000) },
    { externalReference: 'late-2', nextPollAt: new Date(clock.now() - 60_000) },
  ])
  expect(gauges(await scrapeMetrics(service))).toEqual({ due: '2', oldest: '90' })

  // the next cycle claims both orders (its lease moves next_poll_at to the lease's end) and their GETs hang
  await clock.advance(SERVICE_POLL_INTERVAL_MS)
  await eventually(() => platform!.held.size === 2, 'the cycle polls both orders')
  for (const reference of ['late-1', 'late-2']) {
    const claimed = await orderByReference(service.database.db, reference)
    expect(claimed.pollLeaseToken).not.toBeNull()
    expect(new Date(claimed.nextPollAt!).getTime()).toBeGreaterThan(clock.now())
  }
  // every due order is held by the cycle: the gauges still count them, from when they came due (they read 0 and 0)
  const intervalS = SERVICE_POLL_INTERVAL_MS / 1000
  expect(gauges(await scrapeMetrics(service))).toEqual({ due: '2', oldest: String(90 + intervalS) })

  // the platform answers one and refuses the other: the first is reconciled and due no more, the second backs off
  // (due again 15 to 30 s on) and still counts from its due time
  answer(platform, 'tr_late-1', 200, tradeRecord({ trade_id: 'tr_late-1', status: 'delivered', external_reference: 'late-1' }))
  answer(platform, 'tr_late-2', 400, { error: { code: 'bad_request', message: 'refused' } })
  // the two answers are written back independently, in either order: wait for both
  await eventually(async () => {
    const order = await orderByReference(service!.database.db, 'late-2')
    return order.pollLeaseToken === null && order.pollAttempts === 1
  }, 'the failed poll is written back')
  await eventually(async () => (await orderByReference(service!.database.db, 'late-1')).tradeStatus === 'delivered', 'the answered poll is applied')
  const backingOff = await orderByReference(service.database.db, 'late-2')
  expect(new Date(backingOff.nextPollAt!).getTime()).toBeGreaterThan(clock.now())
  const scrape = await scrapeMetrics(service)
  expect(gauges(scrape)).toEqual({ due: '1', oldest: String(60 + intervalS) })
  expect(scrape).toMatch(/^poller_polls_total\{result="error"\} 1$/m)
  expect(scrape).toMatch(/^poller_polls_total\{result="applied"\} 1$/m)
}

describe('the due gauges while the poller holds an order or backs it off', () => {
  it('count an order from the time it came due until a poll of it is answered', async () => {
    await holdAndAnswer()
  })
})

describePostgres('the due gauges while the poller holds an order or backs it off (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })

  it('count an order from the time it came due until a poll of it is answered', async () => {
    await holdAndAnswer({ DATABASE_URL: database.url! })
  })
})
