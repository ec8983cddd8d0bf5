// What makes a delivery itself: its id AND its exact body. A retry (same id, same bytes) is a duplicate;
// the same id with another verified body is a reused id, stored and applied; and the body stored is the
// bytes received, byte-order mark and all.
import { createHash, createHmac, randomUUID } from 'node:crypto'
import fc from 'fast-check'
import { type KyselyPlugin, sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { createMetrics, type Metrics } from '../src/metrics/metrics.js'
import { observationSettings } from '../src/orders/observations.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { createDeliveryIngest } from '../src/webhooks/delivery-ingest.js'
import { createOrder } from './helpers/orders.js'
import { FakeClock } from './helpers/fake-clock.js'
import { runCommand } from './helpers/cli-in-process.js'
import { logEntries, logLines, testLogger } from './helpers/log-sink.js'
import { TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { holdOrderRow } from './helpers/order-row-lock.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig({ LOG_LEVEL: 'warn' })
const sha256 = (bytes: string | Buffer) => createHash('sha256').update(bytes).digest('hex')

describe('a delivery is its id and its body', () => {
  let database: TestDatabase
  let app: App
  let metrics: Metrics
  let clock: FakeClock
  // every statement the app sends, to tell a retry answered from memory from one that asked the database
  const counter = { statements: 0 }
  const counting: KyselyPlugin = {
    transformQuery: (args) => {
      counter.statements++
      return args.node
    },
    transformResult: async (args) => args.result,
  }

  beforeAll(async () => {
    database = await createTestDatabase()
    metrics = createMetrics({}, { defaultMetrics: false })
    clock = new FakeClock()
    app = createApp({
      config,
      db: database.db.withPlugin(counting),
      logger: testLogger(config.webhook.secrets),
      clock,
      metrics,
    })
  })
  afterAll(async () => {
    await database.close()
  })

  const rowsOf = (deliveryId: string) =>
    database.db
      .selectFrom('webhookDeliveries')
      // the stored bytes themselves (a driver may strip a byte-order mark from text it reads)
      .select(['bodySha256', 'outcome', 'observedStatus', sql<Uint8Array>`convert_to(raw_body, 'UTF8')`.as('bytes')])
      .where('deliveryId', '=', deliveryId)
      .orderBy('receivedAt')
      .execute()
  const counted = async (outcome: string) =>
    (await metrics.deliveries.get()).values.find((value) => value.labels.outcome === outcome)?.value ?? 0

  it('applies a verified body sent under an id already stored with another body, and counts and logs the reuse', async () => {
    const ref = 'reused-id'
    const { order } = await createOrder(database.db, { externalReference: ref })
    const id = `dlv-${randomUUID()}`
    const funded = JSON.stringify(tradePayload(ref, 'funded'))
    const released = JSON.stringify(tradePayload(ref, 'released'))
    const reusedBefore = await counted('id_reused')

    expect((await sendWebhook(app, { body: funded, deliveryId: id })).body).toEqual({ received: true })
    await clock.advance(1_000)
    const second = await sendWebhook(app, { body: released, deliveryId: id })
    expect([second.status, second.body]).toEqual([200, { received: true }])

    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('released')
    expect((await orderHistory(database.db, order.id)).map((change) => change.toStatus)).toEqual(['funded', 'released'])
    expect((await rowsOf(id)).map((row) => [row.bodySha256, row.observedStatus, row.outcome])).toEqual([
      [sha256(funded), 'funded', 'applied'],
      [sha256(released), 'released', 'applied'],
    ])
    expect(await counted('id_reused')).toBe(reusedBefore + 1)
    const warning = logEntries().find((entry) => entry.msg === 'webhook delivery id reused with a different body' && entry.deliveryId === id)
    expect(warning).toMatchObject({ level: 40, bodySha256: sha256(released), outcome: 'applied', eventType: 'trade.released' })
    // the log names the body by its hash only
    expect(logLines.filter((line) => line.includes(id)).some((line) => line.includes('external_reference'))).toBe(false)

    // a retry of either (same id, same bytes) is a duplicate, answered from memory: no statement at all
    const statements = counter.statements
    for (const body of [funded, released]) {
      expect((await sendWebhook(app, { body, deliveryId: id })).body).toEqual({ received: true, duplicate: true })
    }
    expect(counter.statements).toBe(statements)
    expect(await rowsOf(id)).toHaveLength(2)
  })

  it('runs a reused id through the status rules: an older status under it is stale, not applied', async () => {
    const ref = 'reused-stale'
    await createOrder(database.db, { externalReference: ref })
    const id = `dlv-${randomUUID()}`
    await sendWebhook(app, { body: tradePayload(ref, 'delivered'), deliveryId: id })
    await clock.advance(1_000)
    await sendWebhook(app, { body: tradePayload(ref, 'funded'), deliveryId: id })
    expect((await rowsOf(id)).map((row) => row.outcome)).toEqual(['applied', 'stale'])
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('delivered')
  })

  it('stores an event that changes no order under a reused id too, and counts it', async () => {
    const id = `dlv-${randomUUID()}`
    const reusedBefore = await counted('id_reused')
    await sendWebhook(app, { body: { event: 'seller.verified', seller_id: 's-1' }, deliveryId: id })
    await clock.advance(1_000)
    const again = await sendWebhook(app, { body: { event: 'seller.suspended', seller_id: 's-1' }, deliveryId: id })
    expect(again.body).toEqual({ received: true })
    expect((await rowsOf(id)).map((row) => row.outcome)).toEqual(['ignored', 'ignored'])
    expect(await counted('id_reused')).toBe(reusedBefore + 1)
    // and a retry of the second is a duplicate
    const retry = await sendWebhook(app, { body: { event: 'seller.suspended', seller_id: 's-1' }, deliveryId: id })
    expect(retry.body).toEqual({ received: true, duplicate: true })
  })

  it('counts one reuse when two bodies under one id of an event that changes no order arrive together', async () => {
    for (let round = 0; round < 5; round++) {
      const id = `dlv-${randomUUID()}`
      const reusedBefore = await counted('id_reused')
      const lines = logEntries().length
      const answers = await Promise.all(
        // bodies of their own each round: a body stored before is a replay under a fresh id, not stored again
        ['seller.verified', 'seller.suspended'].map((event) => sendWebhook(app, { body: { event, seller_id: `s-2-${round}` }, deliveryId: id })),
      )
      expect(answers.map((answer) => answer.body)).toEqual([{ received: true }, { received: true }])
      // two bodies stored under the id: the second is the one reuse, however the two interleaved
      expect(await rowsOf(id)).toHaveLength(2)
      expect(await counted('id_reused')).toBe(reusedBefore + 1)
      const warnings = logEntries()
        .slice(lines)
        .filter((entry) => entry.msg === 'webhook delivery id reused with a different body' && entry.deliveryId === id)
      expect(warnings).toHaveLength(1)
    }
  })

  it('shows each body stored under a reused id with `deliveries show --body-sha256`', async () => {
    const ref = 'reused-cli'
    const id = `dlv-${randomUUID()}`
    const first = JSON.stringify(tradePayload(ref, 'funded'))
    const second = JSON.stringify(tradePayload(ref, 'delivered'))
    await sendWebhook(app, { body: first, deliveryId: id })
    await clock.advance(1_000)
    await sendWebhook(app, { body: second, deliveryId: id })
    const shown = await runCommand(['deliveries', 'show', id], database.db)
    expect(shown.code).toBe(0)
    expect(shown.stdout).toContain('this id was reused: 2 bodies stored')
    expect(shown.stdout).toContain(sha256(first))
    const picked = await runCommand(['deliveries', 'show', id, '--body-sha256', sha256(second).slice(0, 10), '--json'], database.db)
    expect(JSON.parse(picked.stdout)).toMatchObject({ deliveryId: id, bodySha256: sha256(second), rawBody: second, bodiesUnderThisId: 2 })
    const bad = await runCommand(['deliveries', 'show', id, '--body-sha256', 'not-hex'], database.db)
    expect(bad.code).toBe(2)
  })

  it('stores the exact bytes received: a byte-order mark is kept, and the stored body still verifies', async () => {
    const ref = 'with-bom'
    await createOrder(database.db, { externalReference: ref })
    const bytes = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(JSON.stringify(tradePayload(ref, 'funded')))])
    const id = `dlv-${randomUUID()}`
    const response = await sendWebhook(app, { body: bytes, deliveryId: id })
    expect([response.status, response.body]).toEqual([200, { received: true }])
    const [row] = await rowsOf(id)
    expect(Buffer.from(row!.bytes).equals(bytes)).toBe(true)
    expect(row!.bodySha256).toBe(sha256(bytes))
    expect(createHmac('sha256', TEST_WEBHOOK_SECRET).update(row!.bytes).digest('hex')).toBe(
      createHmac('sha256', TEST_WEBHOOK_SECRET).update(bytes).digest('hex'),
    )
    // the JSON inside was read (the mark is not part of it), and the operator view shows the same bytes
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('funded')
    const shown = JSON.parse((await runCommand(['deliveries', 'show', id, '--json'], database.db)).stdout)
    expect(Buffer.from(shown.rawBody, 'utf8').equals(bytes)).toBe(true)
    // and a retry of those bytes is the same delivery
    expect((await sendWebhook(app, { body: bytes, deliveryId: id })).body).toEqual({ received: true, duplicate: true })
  })

  it('applies a parked delivery with a byte-order mark when its order appears, reference included', async () => {
    const ref = 'parked-bom'
    const bytes = Buffer.concat([Buffer.from('\ufeff'), Buffer.from(JSON.stringify(tradePayload(ref, 'funded')))])
    await sendWebhook(app, { body: bytes })
    const { order } = await createOrder(database.db, { externalReference: ref })
    expect(order).toMatchObject({ tradeStatus: 'funded', tradeReference: `REF-${ref}` })
  })

  it('round-trips any verified UTF-8 JSON body byte for byte (property)', async () => {
    // JSON text as a sender might write it: any Unicode in strings, any whitespace, maybe a leading mark
    const text = fc.string({ unit: 'binary', maxLength: 30 }).filter((value) => !value.includes('\u0000'))
    const whitespace = fc.constantFrom('', ' ', '\n', '\t', '\r\n  ')
    let sent = 0
    await fc.assert(
      fc.asyncProperty(
        fc.boolean(),
        fc.dictionary(text, fc.oneof(text, fc.integer(), fc.boolean()), { maxKeys: 5 }),
        whitespace,
        whitespace,
        async (mark, fields, before, after) => {
          const id = `rt-${++sent}-${randomUUID()}`
          // the id in the body too, last: two runs that drew the same body would make the second a replay, not stored
          const body = { event: 'buyer.noted', ...fields, round_trip: id }
          const json = `${before}${JSON.stringify(body, null, before.length > 1 ? 1 : undefined)}${after}`
          const bytes = Buffer.from(`${mark ? '\ufeff' : ''}${json}`, 'utf8')
          const response = await sendWebhook(app, { body: bytes, deliveryId: id })
          expect(response.status, JSON.stringify(response.body)).toBe(200)
          const [row] = await rowsOf(id)
          expect(Buffer.from(row!.bytes).toString('hex')).toBe(bytes.toString('hex'))
          expect(row!.bodySha256).toBe(sha256(bytes))
        },
      ),
      { numRuns: 100 },
    )
  })
})

// and where a DBA made REPEATABLE READ the database's default: the two replicas' inserts of one delivery failed
// each other (40001, answered 503) until the service's sessions set READ COMMITTED back
describe.each([undefined, 'repeatable read'] as const)('transactions by default: %s', (defaultIsolation) => {
  describePostgres('a delivery received by two replicas at once (Postgres)', () => {
    let database: TestDatabase
    let replicas: App[]
    let closeOther: () => Promise<void>

    beforeAll(async () => {
      database = await createTestDatabase(defaultIsolation ? { sessionDefaults: { default_transaction_isolation: defaultIsolation } } : {})
      const other = database.openAnother()
      closeOther = () => other.close()
      replicas = [database.db, other.db].map((db) =>
        createApp({ config, db, logger: testLogger(config.webhook.secrets), clock: new FakeClock() }),
      )
    })
    afterAll(async () => {
      await closeOther()
      await database.close()
    })

    it('stores the same id and body once, and the same id with two bodies twice, each applied by the rules', async () => {
      for (let round = 0; round < 20; round++) {
        const ref = `replicas-${round}`
        await createOrder(database.db, { externalReference: ref })
        const id = `dlv-${randomUUID()}`
        const funded = JSON.stringify(tradePayload(ref, 'funded'))
        const same = await Promise.all(replicas.map((app) => sendWebhook(app, { body: funded, deliveryId: id })))
        expect(same.map((response) => response.status)).toEqual([200, 200])
        expect(same.filter((response) => response.body.duplicate === true)).toHaveLength(1)

        const reused = `dlv-${randomUUID()}`
        const bodies = ['delivered', 'disputed'].map((status) => JSON.stringify(tradePayload(ref, status)))
        const answers = await Promise.all(replicas.map((app, n) => sendWebhook(app, { body: bodies[n]!, deliveryId: reused })))
        expect(answers.map((response) => response.body)).toEqual([{ received: true }, { received: true }])

        const rows = await database.db.selectFrom('webhookDeliveries').select('deliveryId').where('externalReference', '=', ref).execute()
        expect(rows.map((row) => row.deliveryId).sort()).toEqual([id, reused, reused].sort())
        const order = await findOrderByExternalReference(database.db, ref)
        // delivered then disputed, or disputed (delivered, lower, then stale): never back down
        expect(order?.tradeStatus).toBe('disputed')
        const entered = (await orderHistory(database.db, order!.id)).map((change) => change.toStatus)
        expect(new Set(entered).size).toBe(entered.length)
      }
    })
  })
})

describePostgres('two bodies under one id at one process, stored by different paths (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })

  // the second body is stored in a transaction of its own (recordDelivery), the first by the group commit
  it.each([
    ['a seller event', { event: 'seller.verified', seller_id: 's-3' }, 'ignored'],
    ['a trade event lacking its trade_id', { status: 'released', external_reference: 'same-id-paths' }, 'invalid'],
  ])('counts one reuse when a trade event and %s arrive together under one id', async (_name, second, outcome) => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const logger = testLogger(config.webhook.secrets)
    const ingest = createDeliveryIngest({ config, db: database.db, logger, settings: observationSettings(config), metrics })
    const app = createApp({ config, db: database.db, logger, clock: systemClock, metrics, ingest })
    const ref = `same-id-paths-${randomUUID()}`
    await createOrder(database.db, { externalReference: ref })
    const id = `dlv-${randomUUID()}`

    // another session holds the order, so the trade event's statement is in flight (its snapshot taken) while
    // the second body arrives
    const holder = await holdOrderRow(database, ref)
    try {
      const trade = sendWebhook(app, { body: tradePayload(ref, 'funded'), deliveryId: id }).then((answer) => answer)
      await holder.untilBlocked()

      let secondAnswered = false
      const other = sendWebhook(app, { body: second, deliveryId: id }).then((answer) => {
        secondAnswered = true
        return answer
      })
      // the second body is stored (it used to be, beside the first in flight) or waits for the first's turn
      while (!secondAnswered && ingest.turns.waiting(id) < 2) await new Promise((resolve) => setTimeout(resolve, 10))
      await holder.release()

      const answers = await Promise.all([trade, other])
      expect(answers.map((answer) => [answer.status, answer.body])).toEqual([
        [200, { received: true }],
        [200, { received: true }],
      ])
      const rows = await database.db.selectFrom('webhookDeliveries').select('outcome').where('deliveryId', '=', id).orderBy('receivedAt').execute()
      expect(rows.map((row) => row.outcome).sort()).toEqual(['applied', outcome].sort())
      const reused = (await metrics.deliveries.get()).values.find((value) => value.labels.outcome === 'id_reused')?.value ?? 0
      expect(reused).toBe(1)
      const warnings = logEntries().filter((entry) => entry.msg === 'webhook delivery id reused with a different body' && entry.deliveryId === id)
      expect(warnings).toHaveLength(1)
    } finally {
      await holder.end()
    }
  })
})
