// End to end: the sandbox platform takes trades through their lifecycles and webhooks them, over HTTP,
// to the real receiver, losing and reordering some; then the poller brings every order in line with
// the platform, and the history says which changes came by poll.
import { afterEach, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { observationSettings } from '../src/orders/observations.js'
import { requeueOpenOrders } from '../src/orders/poll-schedule.repository.js'
import { createPartnerApiClient } from '../src/partner-api/create-partner-api-client.js'
import type { RunSummary } from '../src/reconcile/poller.js'
import { processWarningsDuring } from './helpers/process-warnings.js'
import { testPoller } from './helpers/reconcile-poller.js'
import {
  type PlatformLoop,
  runRandomLifecycles,
  startPlatformLoop,
} from './helpers/reconcile-sandbox.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

describe('the poller against the sandbox platform', () => {
  let database: TestDatabase | undefined
  let loop: PlatformLoop | undefined
  afterEach(async () => {
    await loop?.close()
    await database?.close()
    loop = undefined
    database = undefined
  })

  async function localOrders() {
    const rows = await database!.db
      .selectFrom('orders')
      .select(['id', 'externalReference', 'tradeId', 'tradeStatus', 'nextPollAt', 'pollLeaseToken'])
      .execute()
    return new Map(rows.map((row) => [row.tradeId!, row]))
  }

  async function historyBySource() {
    const rows = await database!.db
      .selectFrom('orderStatusHistory')
      .select(['orderId', 'toStatus', 'source'])
      .orderBy('id')
      .execute()
    return rows
  }

  /** Runs cycles, as the service would after STALE_AFTER_S, until a cycle finds its batch not full. */
  async function pollUntilDone({ concurrency = 8 } = {}): Promise<RunSummary[]> {
    const config = loop!.config
    // every order that is not terminal is due STALE_AFTER_S after its last observation at the latest: as then, all
    // due now by the database's clock, which dates what the poller writes (a poller on a clock run ahead found each
    // order it polled due again at once)
    await requeueOpenOrders(database!.db, { withinS: 0, partnerEnv: config.partner.env })
    const poller = testPoller({
      db: database!.db,
      // the platform checks the signature's timestamp against real time
      fetcher: createPartnerApiClient(config, { logger: loop!.logger, clock: systemClock }),
      clock: systemClock,
      settings: { batchSize: 50, concurrency, observation: observationSettings(config) },
    })
    const runs: RunSummary[] = []
    for (;;) {
      const summary = await poller.runOnce()
      runs.push(summary)
      if (summary.claimed < 50) return runs
    }
  }

  it('heals 200 trades after 30% of webhooks were dropped and some reordered', async () => {
    database = await createTestDatabase()
    loop = await startPlatformLoop(database.db, {
      dropRate: 0.3,
      reorderRate: 0.15,
      duplicateRate: 0.05,
      seed: 6,
    })
    await runRandomLifecycles(loop, { count: 200, prefix: 'e2e', seed: 6 })
    await loop.sandbox.idle()

    const platform = new Map(loop.sandbox.trades().map((trade) => [trade.trade_id, trade.status]))
    expect(platform.size).toBe(200)
    const dropped = loop.sandbox.deliveryLog.filter((attempt) => attempt.result === 'dropped').length
    expect(dropped).toBeGreaterThan(50)
    const before = await localOrders()
    const behind = [...platform].filter(([tradeId, status]) => before.get(tradeId)?.tradeStatus !== status)
    // the webhooks alone left orders behind: there is something to heal
    expect(behind.length).toBeGreaterThan(10)

    const runs = await pollUntilDone()
    expect(runs.reduce((sum, run) => sum + run.errors, 0)).toBe(0)
    expect(runs.reduce((sum, run) => sum + run.changed, 0)).toBe(behind.length)

    const after = await localOrders()
    for (const [tradeId, status] of platform) {
      expect({ tradeId, status: after.get(tradeId)?.tradeStatus }).toEqual({ tradeId, status })
      expect(after.get(tradeId)?.pollLeaseToken).toBeNull()
    }
    // each order that was behind got its current status from a poll, and the history says so
    const history = await historyBySource()
    for (const [tradeId, status] of behind) {
      const last = history.filter((row) => row.orderId === after.get(tradeId)!.id).at(-1)
      expect(last).toEqual({ orderId: after.get(tradeId)!.id, toStatus: status, source: 'poll' })
    }
    const sources = new Set(history.map((row) => row.source))
    expect(sources).toEqual(new Set(['api', 'webhook', 'poll']))
    expect(history.filter((row) => row.source === 'poll')).toHaveLength(behind.length)
  })

  it('heals every order after the receiver was down for the whole retry schedule', async () => {
    database = await createTestDatabase()
    loop = await startPlatformLoop(database.db, { seed: 7 })
    loop.sandbox.setReceiverDown(true)
    await runRandomLifecycles(loop, { count: 60, prefix: 'down', seed: 7 })
    // every event was tried 6 times and given up
    await loop.sandbox.idle()
    loop.sandbox.setReceiverDown(false)
    const attempts = loop.sandbox.deliveryLog
    expect(attempts.length).toBeGreaterThan(0)
    expect(attempts.every((attempt) => attempt.result === 'failed')).toBe(true)
    expect(Math.max(...attempts.map((attempt) => attempt.attempt))).toBe(6)
    const received = await database.db.selectFrom('webhookDeliveries').select('deliveryId').execute()
    expect(received).toEqual([])

    const platform = new Map(loop.sandbox.trades().map((trade) => [trade.trade_id, trade.status]))
    const before = await localOrders()
    const behind = [...platform].filter(([tradeId, status]) => before.get(tradeId)?.tradeStatus !== status)
    expect(behind.length).toBeGreaterThan(10)

    await pollUntilDone()

    const after = await localOrders()
    for (const [tradeId, status] of platform) {
      expect({ tradeId, status: after.get(tradeId)?.tradeStatus }).toEqual({ tradeId, status })
    }
    const history = await historyBySource()
    expect(history.some((row) => row.source === 'webhook')).toBe(false)
    expect(history.filter((row) => row.source === 'poll')).toHaveLength(behind.length)
  })

  it('polls 32 orders at once under its one stop signal without a listener warning', async () => {
    // each call listens to the poll cycle's stop signal while it runs: 32 at once is more than Node's default
    // of 10 listeners, which Node would report as a possible leak on every cycle
    const warnings = await processWarningsDuring(async () => {
      database = await createTestDatabase()
      loop = await startPlatformLoop(database.db, { dropRate: 0.3, seed: 8 })
      await runRandomLifecycles(loop, { count: 150, prefix: 'wide', seed: 8 })
      await loop.sandbox.idle()
      const platform = new Map(loop.sandbox.trades().map((trade) => [trade.trade_id, trade.status]))

      const runs = await pollUntilDone({ concurrency: 32 })
      expect(runs.reduce((sum, run) => sum + run.errors, 0)).toBe(0)
      // the first cycle's batch keeps all 32 lanes busy at its start
      expect(runs[0]!.claimed).toBeGreaterThan(32)
      const after = await localOrders()
      for (const [tradeId, status] of platform) {
        expect({ tradeId, status: after.get(tradeId)?.tradeStatus }).toEqual({ tradeId, status })
      }
    })
    expect(warnings.filter((warning) => warning.startsWith('MaxListenersExceededWarning'))).toEqual([])
  })
})
