// An order whose stored trade id the client refuses in a request's path ("..", ".", blank: stored by a version that
// did not refuse it). `trades get|fund` exit 1 [unusable_trade_id] for it; the poller tried the GET on every cycle,
// failed before sending, backed off and tried again, for good and without a word. It now flags the order
// `unusable_trade_id` for an operator, with one warning, and sends nothing: counted by orders_needing_attention,
// shown in the console, cleared by `reconcile --requeue`, and flagged again by the next poll if the id is unchanged.
import request from 'supertest'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { countOrdersNeedingAttention } from '../src/orders/order.repository.js'
import { createPoller } from '../src/reconcile/poller.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, logLines, testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { countingFetcher, insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { TEST_POLLER_SETTINGS } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-token-unusable-0123456789abcdef'
const WARNING = /^the order's stored trade id cannot be put in a request's path .*flagged unusable_trade_id and no longer polled/

let database: TestDatabase
let platform: RecordingServer
let context: CliContext

beforeAll(async () => {
  database = await createTestDatabase()
  platform = await startRecordingServer({
    secret: TEST_API_SECRET,
    answer: (request) => {
      const tradeId = decodeURIComponent(request.path.split('/').at(-2)!)
      return { status: 200, body: tradeRecord({ trade_id: tradeId, external_reference: tradeId.replace(/^tr_/, ''), status: 'delivered' }) }
    },
  })
  context = {
    config: testConfig({ PARTNER_API_BASE_URL: platform.url, POLL_CONCURRENCY: '1' }),
    logger: testLogger([TEST_API_SECRET]),
    db: database.db,
  }
})
afterAll(async () => {
  await platform.close()
  await database.close()
})
beforeEach(async () => {
  platform.requests.length = 0
  await database.db.deleteFrom('orders').execute()
  await database.db.deleteFrom('reconcileRuns').execute()
})

const cli = (...args: string[]) => runCommandWith(args, context)
const past = (s: number) => new Date(Date.now() - s * 1000)
/** The poller's warnings about unusable trade ids so far, by external reference. */
const warnings = () =>
  logEntries()
    .filter((entry) => typeof entry.msg === 'string' && WARNING.test(entry.msg))
    .map((entry) => ({ level: entry.level, externalReference: entry.externalReference, tradeId: entry.tradeId }))

describe('reconcile --once, for an order whose stored trade id no request can carry', () => {
  it('flags it unusable_trade_id with one warning naming it, sends nothing for it, and polls the other orders', async () => {
    // a reference with a terminal control in it: the warning names it escaped, never as raw bytes
    const hostile = 'hostile-\u001b]0;owned\u0007'
    await insertOrders(database.db, [
      { externalReference: 'ids-fine', nextPollAt: past(60) },
      { externalReference: 'ids-dots', tradeId: '..', nextPollAt: past(50) },
      { externalReference: 'ids-dot', tradeId: '.', nextPollAt: past(40) },
      { externalReference: 'ids-blank', tradeId: '   ', nextPollAt: past(30) },
      { externalReference: hostile, tradeId: '\t', nextPollAt: past(20) },
    ])
    const before = warnings().length
    const lineCount = logLines.length

    const result = await cli('reconcile', '--once', '--json')

    expect(result.stderr).toBe('')
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toMatchObject({
      claimed: 5,
      polled: 5,
      changed: 1,
      errors: 4,
      results: { applied: 1, unusable_trade_id: 4, error: 0 },
    })
    expect(platform.requests.map((sent) => sent.path)).toEqual(['/api/partner/v1/trades/tr_ids-fine/'])
    for (const reference of ['ids-dots', 'ids-dot', 'ids-blank', hostile]) {
      expect(await orderByReference(database.db, reference), reference).toMatchObject({
        attention: 'unusable_trade_id',
        nextPollAt: null,
        pollLeaseToken: null,
        pollLeaseExpiresAt: null,
        tradeStatus: 'funded',
        // nothing was sent: no attempt counted, not polled
        pollAttempts: 0,
        lastPolledAt: null,
      })
    }
    expect(await orderByReference(database.db, 'ids-fine')).toMatchObject({ attention: null, tradeStatus: 'delivered' })
    // pino's level 40: warn
    expect(warnings().slice(before)).toEqual([
      { level: 40, externalReference: 'ids-dots', tradeId: '..' },
      { level: 40, externalReference: 'ids-dot', tradeId: '.' },
      { level: 40, externalReference: 'ids-blank', tradeId: '   ' },
      { level: 40, externalReference: hostile, tradeId: '\t' },
    ])
    const written = logLines.slice(lineCount).join('')
    expect(written).toContain('hostile-\\u001b]0;owned\\u0007')
    expect(written).not.toContain('\u001b')

    // off the schedule: the next cycle neither sends nor warns again
    const again = await cli('reconcile', '--once', '--json')
    expect(JSON.parse(again.stdout)).toMatchObject({ claimed: 0 })
    expect(platform.requests).toHaveLength(1)
    expect(warnings()).toHaveLength(before + 4)

    const shown = await cli('orders', 'show', 'ids-dots')
    expect(shown.stdout).toContain('\nattention  unusable_trade_id\n')
  })

  it('flags it again, with one more warning and still nothing sent, when an operator requeues it unchanged', async () => {
    await insertOrders(database.db, [{ externalReference: 'ids-requeued', tradeId: '..', nextPollAt: past(60) }])
    await cli('reconcile', '--once')
    const before = warnings().length

    const requeued = await cli('reconcile', '--requeue')
    expect(requeued.code).toBe(0)
    expect(requeued.stdout).toBe('ids-requeued: due now (was unusable_trade_id)\n')
    expect(await orderByReference(database.db, 'ids-requeued')).toMatchObject({ attention: null, pollAttempts: 0 })

    const result = await cli('reconcile', '--once', '--json')
    expect(JSON.parse(result.stdout)).toMatchObject({ claimed: 1, errors: 1, results: { unusable_trade_id: 1, error: 0 } })
    expect(await orderByReference(database.db, 'ids-requeued')).toMatchObject({ attention: 'unusable_trade_id', nextPollAt: null })
    expect(warnings().slice(before)).toEqual([{ level: 40, externalReference: 'ids-requeued', tradeId: '..' }])
    expect(platform.requests).toEqual([])
  })
})

describe('an order flagged unusable_trade_id, as the operator sees it', () => {
  it('is counted by orders_needing_attention and poller_polls_total, and the console explains the flag', async () => {
    const clock = new FakeClock()
    const logger = testLogger([TOKEN])
    const metrics = createMetrics({ ordersNeedingAttention: () => countOrdersNeedingAttention(database.db) }, { defaultMetrics: false })
    const admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger, metrics })
    const scrape = async () => (await request(admin).get('/metrics')).text
    // a sample before any order has the flag, so that an alert on it can resolve
    expect(await scrape()).toMatch(/^orders_needing_attention\{flag="unusable_trade_id"\} 0$/m)
    expect(await scrape()).toMatch(/^poller_polls_total\{result="unusable_trade_id"\} 0$/m)

    await insertOrders(database.db, [{ externalReference: 'ids-seen', tradeId: '..', nextPollAt: new Date(clock.now() - 1_000) }])
    const fetcher = countingFetcher()
    const poller = createPoller({
      db: database.db,
      fetcher,
      clock,
      logger,
      replica: 'replica-unusable',
      random: () => 0.5,
      settings: TEST_POLLER_SETTINGS,
      ...metrics.pollerHooks(clock),
    })
    await poller.runOnce()
    expect(fetcher.calls).toEqual([])

    const after = await scrape()
    expect(after).toMatch(/^orders_needing_attention\{flag="unusable_trade_id"\} 1$/m)
    expect(after).toMatch(/^poller_polls_total\{result="unusable_trade_id"\} 1$/m)
    expect(after).toMatch(/^poller_polls_total\{result="error"\} 0$/m)

    const overview = await request(admin).get('/console/').set('Authorization', `Bearer ${TOKEN}`)
    expect(overview.status).toBe(200)
    expect(overview.text).toContain('1 order(s) flagged')
    expect(overview.text).toContain('(unusable_trade_id: 1)')
    expect(overview.text).toMatch(/cannot be put in a request \(unusable_trade_id\)/)
    const flagged = await request(admin).get('/console/orders?attention=1').set('Authorization', `Bearer ${TOKEN}`)
    expect(flagged.text).toContain('ids-seen')
    expect(flagged.text).toContain('<span class="outcome attention">unusable_trade_id</span>')
  })
})
