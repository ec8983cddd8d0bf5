// A delivery parked while its order was being created: its statement could not see the uncommitted order, and its
// second look, before the answer, did not wait for the creation. Answered 200 parked, its sender's next delivery
// was applied straight to the new order, and createOrder's pass after its commit then applied the first as stale:
// an outside attack saw 5 of 1,200 orders lose a transition (history created → delivered, no funded), and their
// handlers never got it. Now the creation holds its reference's lock, and the second look waits for it.
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { findDelivery } from '../src/webhooks/delivery.repository.js'
import { testLogger } from './helpers/log-sink.js'
import { eventually } from './helpers/reconcile-poller.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

describePostgres('a delivery parked while its order is being created (Postgres)', () => {
  const config = testConfig()
  let database: TestDatabase
  let app: App
  let creator: pg.Client
  beforeAll(async () => {
    database = await createTestDatabase()
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
    creator = new pg.Client({ connectionString: database.url })
    await creator.connect()
  })
  afterAll(async () => {
    await creator.end()
    await database.close()
  })

  it('is applied before its answer once the creation commits, so the next delivery comes after it', async () => {
    const reference = 'race-1'
    // a creation under way, as createOrder's transaction is before its commit: the reference's lock, the order inserted
    await creator.query('begin')
    await creator.query(`select pg_advisory_xact_lock(${0x6f726472}, hashtext($1))`, [reference])
    await creator.query('insert into orders (external_reference) values ($1)', [reference])

    let answered = false
    const funded = (async () => await sendWebhook(app, { body: tradePayload(reference, 'funded'), deliveryId: 'race-1-funded' }))().finally(() => {
      answered = true
    })
    // parked by its statement, which cannot see the order; then its second look waits for the creation's lock (or,
    // as before, answers at once without waiting)
    await eventually(async () => (await findDelivery(database.db, 'race-1-funded'))?.outcome === 'unmatched', 'the delivery is parked')
    const waiting = async () =>
      (await creator.query(`select 1 from pg_locks where locktype = 'advisory' and classid = $1 and not granted`, [0x6f726472])).rowCount! > 0
    await eventually(async () => answered || (await waiting()), 'the second look waits, or the delivery is answered')
    // the creation commits (it found nothing parked when it looked)
    await creator.query('commit')

    expect((await funded).status).toBe(200)
    // applied before its answer: nothing else here applies it (no pass after the creation's commit)
    expect(await findDelivery(database.db, 'race-1-funded')).toMatchObject({ outcome: 'applied' })
    expect((await sendWebhook(app, { body: tradePayload(reference, 'delivered'), deliveryId: 'race-1-delivered' })).status).toBe(200)
    const order = (await findOrderByExternalReference(database.db, reference))!
    expect(order.tradeStatus).toBe('delivered')
    expect((await orderHistory(database.db, order.id)).map((change) => change.toStatus)).toEqual(['funded', 'delivered'])
  })
})
