// Going live on the same database: an order keeps the PARTNER_ENV it was linked under (orders.partner_env), and a
// service or command of the other environment neither polls, flags nor moves it. Driven through the CLI (in-process
// runner, signed calls to two local platforms, one a sandbox and one live) and the webhook's HTTP contract.
import { randomUUID } from 'node:crypto'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { createApp } from '../src/http/app.js'
import { dueOrderStats } from '../src/reconcile/poller.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type PlannedAnswer, type RecordedRequest, type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { orderByReference } from './helpers/reconcile-orders.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

let database: TestDatabase
let sandbox: RecordingServer
let live: RecordingServer
let onSandbox: CliContext
let onLive: CliContext

const tradeIdOf = (path: string) => decodeURIComponent(path.split('/').at(-2)!)
const NOT_FOUND: PlannedAnswer = { status: 404, body: { error: { code: 'trade_not_found', message: 'No such trade' } } }

// the sandbox platform: a create answers a trade of the order, a GET the trade delivered
function sandboxAnswer(request: RecordedRequest): PlannedAnswer {
  if (request.method === 'POST') {
    const { external_reference: reference } = JSON.parse(request.rawBody.toString()) as { external_reference: string }
    return { status: 201, body: tradeRecord({ trade_id: `tr_${reference}`, external_reference: reference, status: 'created' }) }
  }
  const tradeId = tradeIdOf(request.path)
  return { status: 200, body: tradeRecord({ trade_id: tradeId, external_reference: tradeId.replace(/^tr_/, ''), status: 'delivered' }) }
}

beforeAll(async () => {
  database = await createTestDatabase()
  sandbox = await startRecordingServer({ secret: TEST_API_SECRET, answer: sandboxAnswer })
  // the live platform has none of the sandbox's trades
  live = await startRecordingServer({ secret: TEST_API_SECRET, answer: () => NOT_FOUND })
  const logger = testLogger([TEST_API_SECRET])
  onSandbox = { config: testConfig({ PARTNER_ENV: 'sandbox', PARTNER_API_BASE_URL: sandbox.url }), logger, db: database.db }
  onLive = { config: testConfig({ PARTNER_ENV: 'live', PARTNER_API_BASE_URL: live.url }), logger, db: database.db }
})
afterAll(async () => {
  await sandbox.close()
  await live.close()
  await database.close()
})
beforeEach(async () => {
  sandbox.requests.length = 0
  live.requests.length = 0
  await database.db.deleteFrom('orders').execute()
  await database.db.deleteFrom('reconcileRuns').execute()
})

/** `trades open` on the sandbox, then the order made due now (as the webhook it waits for never came). */
async function openOnSandbox(reference: string): Promise<void> {
  const open = await runCommandWith(
    ['trades', 'open', reference, '--title', 'A lamp', '--amount', '1.00', '--currency', 'KES', '--seller', 'usr_1'],
    onSandbox,
  )
  expect(open.stderr).toBe('')
  expect(open.code).toBe(0)
  await database.db
    .updateTable('orders')
    .set({ nextPollAt: new Date(Date.now() - 60_000) })
    .where('externalReference', '=', reference)
    .execute()
}

describe('an order linked on the sandbox, the service gone live', () => {
  it('is not polled against the live platform nor flagged, and `reconcile --once` says it was left', async () => {
    await openOnSandbox('go-live-1')

    const once = await runCommandWith(['reconcile', '--once'], onLive)

    expect(once.stderr).toBe('')
    expect(once.code).toBe(0)
    expect(once.stdout).toMatch(/^run \d+: claimed 0, polled 0, changed 0, errors 0\n/)
    expect(once.stdout).toContain('left 1 due order(s) linked under PARTNER_ENV=sandbox: not polled while PARTNER_ENV=live')
    expect(live.requests).toEqual([])
    const shown = await runCommandWith(['orders', 'show', 'go-live-1'], onLive)
    expect(shown.stdout).not.toContain('attention')
    expect(shown.stdout).toContain('env        sandbox (not polled nor moved while PARTNER_ENV=live)')
    expect(JSON.parse((await runCommandWith(['orders', 'show', 'go-live-1', '--json'], onLive)).stdout)).toMatchObject({
      partnerEnv: 'sandbox',
      attention: null,
      tradeStatus: 'created',
    })
    const json = JSON.parse((await runCommandWith(['reconcile', '--once', '--json'], onLive)).stdout)
    expect(json).toMatchObject({ claimed: 0, otherEnvironmentDue: 1 })
  })

  it('is refused by a trade command of the live service, before anything is sent', async () => {
    await openOnSandbox('go-live-cmd')

    for (const args of [['trades', 'fund', 'go-live-cmd'], ['trades', 'get', 'go-live-cmd']]) {
      const refused = await runCommandWith(args, onLive)
      expect(refused.code, args.join(' ')).toBe(1)
      expect(refused.stderr).toContain(
        "Order go-live-cmd's trade is on the sandbox platform (linked under PARTNER_ENV=sandbox), and this runs with PARTNER_ENV=live: nothing was sent",
      )
      expect(refused.stderr).toContain('[other_environment]')
    }
    expect(live.requests).toEqual([])
    expect((await runCommandWith(['trades', 'get', 'go-live-cmd'], onSandbox)).code).toBe(0)
  })

  it('is requeued by a live command with a word that only the sandbox polls it', async () => {
    await openOnSandbox('go-live-requeue')
    const requeued = await runCommandWith(['reconcile', '--requeue', 'go-live-requeue'], onLive)
    expect(requeued.stdout).toBe('go-live-requeue: due now (linked under PARTNER_ENV=sandbox: polled only there)\n')
    expect((await runCommandWith(['reconcile', '--requeue', 'go-live-requeue'], onSandbox)).stdout).toBe('go-live-requeue: due now\n')
  })

  it('is not among the due orders of the live service’s metrics (no oldest-due alert for an order no claim takes)', async () => {
    await openOnSandbox('go-live-due')
    const clock = { now: () => Date.now(), sleep: async () => {} }
    expect(await dueOrderStats(database.db, clock, 'live')).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
    expect(await dueOrderStats(database.db, clock, 'sandbox')).toMatchObject({ ordersDue: 1 })
  })

  it('is polled again on the sandbox once the service switches back', async () => {
    await openOnSandbox('go-live-2')
    await runCommandWith(['reconcile', '--once'], onLive)

    const once = await runCommandWith(['reconcile', '--once'], onSandbox)

    expect(once.code).toBe(0)
    expect(once.stdout).toMatch(/^run \d+: claimed 1, polled 1, changed 1, errors 0 \(applied 1\)\n$/)
    expect(sandbox.requests.filter((request) => request.method === 'GET').map((request) => request.path)).toEqual([
      '/api/partner/v1/trades/tr_go-live-2/',
    ])
    expect(await orderByReference(database.db, 'go-live-2')).toMatchObject({ tradeStatus: 'delivered', attention: null, partnerEnv: 'sandbox' })
  })

  it('lists the environment of each linked order', async () => {
    await openOnSandbox('go-live-3')
    const listed = await runCommandWith(['orders', 'list', '--json'], onLive)
    expect(JSON.parse(listed.stdout)).toEqual([expect.objectContaining({ externalReference: 'go-live-3', partnerEnv: 'sandbox' })])
    const table = await runCommandWith(['orders', 'list'], onLive)
    expect(table.stdout.split('\n')[0]).toMatch(/\benv\b/)
    expect(table.stdout).toMatch(/go-live-3 .*sandbox/)
  })

  it('is not moved by a webhook the live service lets in (a sandbox secret left in WEBHOOK_SECRETS)', async () => {
    await openOnSandbox('go-live-4')
    const app = createApp({ config: onLive.config, db: database.db, logger: testLogger(onLive.config.webhook.secrets), clock: new FakeClock() })
    const deliveryId = `dlv-${randomUUID()}`

    const response = await sendWebhook(app, { body: JSON.stringify(tradePayload('go-live-4', 'funded', 'tr_go-live-4')), deliveryId })

    expect(response.status).toBe(200)
    const stored = await database.db.selectFrom('webhookDeliveries').select('outcome').where('deliveryId', '=', deliveryId).executeTakeFirstOrThrow()
    expect(stored.outcome).toBe('trade_mismatch')
    expect(await orderByReference(database.db, 'go-live-4')).toMatchObject({ tradeStatus: 'created', version: 1, attention: null, partnerEnv: 'sandbox' })
  })
})

describe('an order linked before the environment was kept', () => {
  it('is taken as the service’s own, and gets the environment of the first observation applied to it', async () => {
    await openOnSandbox('legacy-1')
    await database.db.updateTable('orders').set({ partnerEnv: null }).where('externalReference', '=', 'legacy-1').execute()
    expect((await runCommandWith(['orders', 'show', 'legacy-1'], onLive)).stdout).toContain('env        live (not recorded')
    const app = createApp({ config: onLive.config, db: database.db, logger: testLogger(onLive.config.webhook.secrets), clock: new FakeClock() })

    const response = await sendWebhook(app, { body: JSON.stringify(tradePayload('legacy-1', 'funded', 'tr_legacy-1')), deliveryId: `dlv-${randomUUID()}` })

    expect(response.status).toBe(200)
    expect(await orderByReference(database.db, 'legacy-1')).toMatchObject({ tradeStatus: 'funded', partnerEnv: 'live' })
  })

  // the upgrade's advice: run under sandbox until the poller has seen every open order, then go live
  it('is recorded as the sandbox’s by a poll under sandbox, and then left by a live service', async () => {
    await openOnSandbox('legacy-2')
    await database.db.updateTable('orders').set({ partnerEnv: null }).where('externalReference', '=', 'legacy-2').execute()

    expect((await runCommandWith(['reconcile', '--once'], onSandbox)).stdout).toMatch(/^run \d+: claimed 1, polled 1, changed 1/)
    expect(await orderByReference(database.db, 'legacy-2')).toMatchObject({ tradeStatus: 'delivered', partnerEnv: 'sandbox' })
    await database.db.updateTable('orders').set({ nextPollAt: new Date(Date.now() - 60_000) }).where('externalReference', '=', 'legacy-2').execute()

    expect((await runCommandWith(['reconcile', '--once'], onLive)).stdout).toMatch(/^run \d+: claimed 0, polled 0/)
    expect(live.requests).toEqual([])
  })
})

describe('an order first linked by a webhook', () => {
  it('keeps the environment of the service that received it', async () => {
    const create = await runCommandWith(['orders', 'create', '--external-reference', 'hooked-1'], onLive)
    expect(create.code).toBe(0)
    const app = createApp({ config: onLive.config, db: database.db, logger: testLogger(onLive.config.webhook.secrets), clock: new FakeClock() })

    await sendWebhook(app, { body: JSON.stringify(tradePayload('hooked-1', 'created', 'tr_hooked-1')), deliveryId: `dlv-${randomUUID()}` })

    expect(await orderByReference(database.db, 'hooked-1')).toMatchObject({ tradeId: 'tr_hooked-1', partnerEnv: 'live' })
  })
})
