// The console's "Run one cycle now" says what `reconcile --once` prints: each poll result's count, the claims given
// back (`released`) and the orders the cycle flagged trade_create_unknown. It said `claimed 0, polled 0, changed 0,
// errors 0` of a cycle that flagged an order (a review found it). Through the console over HTTP, a real cycle.
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createAdminApp } from '../src/http/admin-app.js'
import type { App } from '../src/http/app.js'
import { findOrderByExternalReference, setTradeCreateState, startTradeCreate } from '../src/orders/order.repository.js'
import type { RunSummary } from '../src/reconcile/poller.js'
import { testLogger } from './helpers/log-sink.js'
import { backdateCreateMark, createOrder } from './helpers/orders.js'
import { countingFetcher, insertOrders } from './helpers/reconcile-orders.js'
import { testPoller } from './helpers/reconcile-poller.js'
import { actionFields } from './helpers/console-over-http.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-cycle-token-0123456789abcdef'


describe("console: a reconcile cycle's result", () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })
  const consoleWith = (reconcileOnce: () => Promise<RunSummary>): App =>
    createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: testLogger([TOKEN]), reconcileOnce })
  const runCycle = async (admin: App) => {
    const page = await request(admin).get('/console/reconcile').set('Authorization', `Bearer ${TOKEN}`)
    const run = await request(admin).post('/console/reconcile/run').set('Authorization', `Bearer ${TOKEN}`).type('form').send(actionFields(page.text))
    expect(run.status).toBe(200)
    return /<p class="result">([\s\S]*?)<\/p>/.exec(run.text)![1]!
  }

  it('names the count of each poll result and the orders it flagged trade_create_unknown, as reconcile --once does', async () => {
    await insertOrders(database.db, [
      { externalReference: 'cyc-moves', tradeId: 'tr_cyc-moves', tradeStatus: 'created', nextPollAt: new Date(Date.now() - 1_000) },
      { externalReference: 'cyc-stays', tradeId: 'tr_cyc-stays', tradeStatus: 'funded', nextPollAt: new Date(Date.now() - 1_000) },
    ])
    // a trade create that got no answer, long enough ago to be flagged
    const { order } = await createOrder(database.db, { externalReference: 'cyc-<unanswered>' })
    expect(await startTradeCreate(database.db, order.id, 'none', { waitMs: 1_000 })).toBeDefined()
    await setTradeCreateState(database.db, order.id, 'unknown')
    await backdateCreateMark(database.db, order.id, 60_000)

    const admin = consoleWith(() =>
      testPoller({ db: database.db, fetcher: countingFetcher(() => 'funded'), clock: systemClock, settings: { unresolvedCreateAfterS: 1 } }).runOnce(),
    )
    const result = await runCycle(admin)
    expect(result).toMatch(/^run \d+: claimed 2, polled 2, changed 1, errors 0 \(applied 1, unchanged 1\); flagged trade_create_unknown: 1 order\(s\) /)
    expect(result).toContain(
      'whose trade create got no answer and no webhook linked a trade (cyc-&lt;unanswered&gt;): check the platform, then `trades open REFERENCE --retry` or `trades link`',
    )
    expect((await findOrderByExternalReference(database.db, 'cyc-<unanswered>'))?.attention).toBe('trade_create_unknown')
  })

  it('names the claims given back when the cycle stopped', async () => {
    const at = new Date()
    const admin = consoleWith(async () => ({
      runId: 7, replica: 'r', startedAt: at, finishedAt: at, claimed: 3, polled: 1, changed: 0, errors: 1, released: 2,
      results: { unauthorized: 1 } as RunSummary['results'], stoppedReason: 'unauthorized', throttledUntil: null, clockOffsetS: null,
      firstFailure: null, flaggedCreates: [],
    }))
    expect(await runCycle(admin)).toBe('run 7: claimed 3, polled 1, changed 0, errors 1, released 2 (unauthorized 1); stopped: unauthorized')
  })
})
