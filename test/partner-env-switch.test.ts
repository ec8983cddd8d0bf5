// Going live on the same database: an order keeps the PARTNER_ENV it was linked under (orders.partner_env), and a
// service or command of the other environment neither polls, flags nor moves it. Driven through the CLI (in-process
// runner, signed calls to two local platforms, one a sandbox and one live) and the webhook's HTTP contract.
import { randomUUID } from 'node:crypto'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import request from 'supertest'
import { createAdminApp } from '../src/http/admin-app.js'
import { createApp } from '../src/http/app.js'
import { dueOrderStats } from '../src/reconcile/poller.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type PlannedAnswer, type RecordedRequest, type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

let database: TestDatabase
let sandbox: RecordingServer
let live: RecordingServer
let onSandbox: CliContext
let onLive: CliContext
// live, with the sandbox platform's webhook secret in WEBHOOK_SECRETS_SANDBOX
let onLiveHearingSandbox: CliContext

const SANDBOX_WEBHOOK_SECRET = 'the-sandbox-platform-webhook-secret-0000'

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
  onLiveHearingSandbox = {
    config: testConfig({ PARTNER_ENV: 'live', PARTNER_API_BASE_URL: live.url, WEBHOOK_SECRETS_SANDBOX: SANDBOX_WEBHOOK_SECRET }),
    logger: testLogger([TEST_API_SECRET, SANDBOX_WEBHOOK_SECRET]),
    db: database.db,
  }
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
  await database.db.deleteFrom('webhookDeliveries').execute()
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

describe('a live service given the sandbox’s webhook secret in WEBHOOK_SECRETS_SANDBOX', () => {
  const app = () =>
    createApp({ config: onLiveHearingSandbox.config, db: database.db, logger: onLiveHearingSandbox.logger, clock: new FakeClock() })
  const fromSandbox = (reference: string, status: string, deliveryId = `dlv-${randomUUID()}`) =>
    sendWebhook(app(), { body: JSON.stringify(tradePayload(reference, status, `tr_${reference}`)), deliveryId, secret: SANDBOX_WEBHOOK_SECRET })
  const fromLive = (reference: string, status: string) =>
    sendWebhook(app(), { body: JSON.stringify(tradePayload(reference, status, `tr_${reference}`)), deliveryId: `dlv-${randomUUID()}` })
  const storedDelivery = (deliveryId: string) =>
    database.db.selectFrom('webhookDeliveries').select(['outcome', 'partnerEnv']).where('deliveryId', '=', deliveryId).executeTakeFirstOrThrow()

  it('links an order not linked yet under sandbox, by a sandbox-signed delivery, and the live poller leaves it', async () => {
    expect((await runCommandWith(['orders', 'create', '--external-reference', 'heard-1'], onLiveHearingSandbox)).code).toBe(0)
    const deliveryId = `dlv-${randomUUID()}`

    const response = await fromSandbox('heard-1', 'created', deliveryId)

    expect(response.status).toBe(200)
    expect(response.body).toEqual({ received: true })
    expect(await storedDelivery(deliveryId)).toEqual({ outcome: 'applied', partnerEnv: 'sandbox' })
    expect(await orderByReference(database.db, 'heard-1')).toMatchObject({ tradeId: 'tr_heard-1', tradeStatus: 'created', partnerEnv: 'sandbox' })
    // the line names the environment, never the secret (the sink's suite-wide check looks for the secret itself)
    expect(logEntries().filter((entry) => entry.msg === 'webhook received' && entry.deliveryId === deliveryId)).toEqual([
      expect.objectContaining({ outcome: 'applied', partnerEnv: 'sandbox' }),
    ])
    // a retry is a duplicate, as any
    expect((await fromSandbox('heard-1', 'created', deliveryId)).body).toEqual({ received: true, duplicate: true })

    await database.db.updateTable('orders').set({ nextPollAt: new Date(Date.now() - 60_000) }).where('externalReference', '=', 'heard-1').execute()
    const once = await runCommandWith(['reconcile', '--once'], onLiveHearingSandbox)
    expect(once.stdout).toMatch(/^run \d+: claimed 0, polled 0/)
    expect(once.stdout).toContain('left 1 due order(s) linked under PARTNER_ENV=sandbox: not polled while PARTNER_ENV=live')
    expect(live.requests).toEqual([])
  })

  it('does not move an order linked under live by a sandbox-signed delivery (trade_mismatch), and a live-signed one moves it', async () => {
    expect((await runCommandWith(['orders', 'create', '--external-reference', 'heard-2'], onLiveHearingSandbox)).code).toBe(0)
    expect((await fromLive('heard-2', 'created')).status).toBe(200)
    expect(await orderByReference(database.db, 'heard-2')).toMatchObject({ tradeId: 'tr_heard-2', partnerEnv: 'live' })
    const deliveryId = `dlv-${randomUUID()}`

    const sandboxSigned = await fromSandbox('heard-2', 'funded', deliveryId)

    expect(sandboxSigned.status).toBe(200)
    expect(await storedDelivery(deliveryId)).toEqual({ outcome: 'trade_mismatch', partnerEnv: 'sandbox' })
    expect(await orderByReference(database.db, 'heard-2')).toMatchObject({ tradeStatus: 'created', version: 1, attention: null, partnerEnv: 'live' })

    expect((await fromLive('heard-2', 'funded')).status).toBe(200)
    expect(await orderByReference(database.db, 'heard-2')).toMatchObject({ tradeStatus: 'funded', version: 2, partnerEnv: 'live' })
  })

  it('moves an order linked under sandbox by a sandbox-signed delivery', async () => {
    await openOnSandbox('heard-3')

    expect((await fromSandbox('heard-3', 'funded')).status).toBe(200)

    expect(await orderByReference(database.db, 'heard-3')).toMatchObject({ tradeStatus: 'funded', partnerEnv: 'sandbox' })
  })

  it('records an order linked before the environment was kept as the sandbox’s, by a sandbox-signed delivery', async () => {
    await openOnSandbox('heard-4')
    await database.db.updateTable('orders').set({ partnerEnv: null }).where('externalReference', '=', 'heard-4').execute()

    expect((await fromSandbox('heard-4', 'funded')).status).toBe(200)

    expect(await orderByReference(database.db, 'heard-4')).toMatchObject({ tradeStatus: 'funded', partnerEnv: 'sandbox' })
    expect((await runCommandWith(['reconcile', '--once'], onLiveHearingSandbox)).stdout).toMatch(/^run \d+: claimed 0, polled 0/)
    expect(live.requests).toEqual([])
  })

  it('keeps a sandbox-signed delivery parked until its order is created, then links the order under sandbox', async () => {
    const deliveryId = `dlv-${randomUUID()}`
    expect((await fromSandbox('heard-5', 'created', deliveryId)).status).toBe(200)
    expect(await storedDelivery(deliveryId)).toEqual({ outcome: 'unmatched', partnerEnv: 'sandbox' })

    expect((await runCommandWith(['orders', 'create', '--external-reference', 'heard-5'], onLiveHearingSandbox)).code).toBe(0)

    expect(await storedDelivery(deliveryId)).toEqual({ outcome: 'applied', partnerEnv: 'sandbox' })
    expect(await orderByReference(database.db, 'heard-5')).toMatchObject({ tradeId: 'tr_heard-5', partnerEnv: 'sandbox' })
  })

  it('re-applies a stored sandbox-signed delivery as the sandbox’s, and shows whose secret verified it', async () => {
    const deliveryId = `dlv-${randomUUID()}`
    expect((await fromSandbox('heard-7', 'created', deliveryId)).status).toBe(200)
    // an order made without its creation's pass over the parked deliveries: the operator's reapply links it
    await insertOrders(database.db, [{ externalReference: 'heard-7', tradeId: null, tradeStatus: null }])

    const reapplied = await runCommandWith(['deliveries', 'reapply', deliveryId, '--json'], onLiveHearingSandbox)

    expect(JSON.parse(reapplied.stdout)).toMatchObject({ outcome: 'applied' })
    expect(await orderByReference(database.db, 'heard-7')).toMatchObject({ tradeId: 'tr_heard-7', partnerEnv: 'sandbox' })
    const listed = (await runCommandWith(['deliveries', 'list'], onLiveHearingSandbox)).stdout.split('\n')
    expect(listed[0]).toMatch(/ env$/)
    expect(listed.find((line) => line.startsWith(deliveryId))).toMatch(/ applied +sandbox$/)
    expect(JSON.parse((await runCommandWith(['deliveries', 'show', deliveryId, '--json'], onLiveHearingSandbox)).stdout)).toMatchObject({
      partnerEnv: 'sandbox',
    })
    const token = 'console-token-0123456789abcdef0123'
    const config = testConfig({ PARTNER_ENV: 'live', PARTNER_API_BASE_URL: live.url, WEBHOOK_SECRETS_SANDBOX: SANDBOX_WEBHOOK_SECRET, ADMIN_TOKEN: token })
    const admin = createAdminApp({ config, db: database.db, logger: onLiveHearingSandbox.logger })
    const { bodySha256 } = await database.db.selectFrom('webhookDeliveries').select('bodySha256').where('deliveryId', '=', deliveryId).executeTakeFirstOrThrow()
    const page = await request(admin).get(`/console/deliveries/${deliveryId}/${bodySha256}`).set('Authorization', `Bearer ${token}`)
    expect(page.status).toBe(200)
    expect(page.text).toContain('<dt>Environment</dt><dd>sandbox: that platform\'s webhook secret verified it</dd>')
  })

  it('still refuses 401 a delivery that no secret of either list verifies, and stores nothing', async () => {
    const deliveryId = `dlv-${randomUUID()}`
    const response = await sendWebhook(app(), {
      body: JSON.stringify(tradePayload('heard-6', 'created', 'tr_heard-6')),
      deliveryId,
      secret: 'a-secret-of-neither-platform-0000000',
    })

    expect(response.status).toBe(401)
    expect(response.body).toMatchObject({ error: { code: 'invalid_signature' } })
    expect(await database.db.selectFrom('webhookDeliveries').select('deliveryId').where('deliveryId', '=', deliveryId).execute()).toEqual([])
    expect(logEntries().filter((entry) => entry.msg === 'webhook signature rejected' && entry.deliveryId === deliveryId)).toEqual([
      expect.objectContaining({ secretsTried: 2 }),
    ])
  })
})
