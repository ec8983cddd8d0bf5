// A signed body with a key twice in one object, as a sender sees it: JSON.parse keeps the last value and a
// reader that keeps the first sees another body, so neither is applied. It is stored as invalid and answered
// 200 (a retry would carry the same body), no order moves, and the forwarder is given nothing.
import { randomBytes } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { configuredReactions, FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams, readReactionStream } from '../src/reactions/reaction-stream.repository.js'
import { logEntries, rememberSecret, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { untilEventsReadable } from './helpers/reaction-jobs.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook } from './helpers/webhook-delivery.js'

const forwardSecret = `whsec_${randomBytes(32).toString('base64')}`
rememberSecret(forwardSecret.slice('whsec_'.length))
// the forwarder is configured (nothing runs it here): a transition would be in its stream, to be sent on
const config = testConfig({ FORWARD_URL: 'http://127.0.0.1:9/forward', FORWARD_SECRET: forwardSecret })

describe('a signed webhook body with a key twice', () => {
  let database: TestDatabase
  let app: App
  let counter = 0
  const reference = () => `dupkey-${++counter}`

  beforeAll(async () => {
    database = await createTestDatabase()
    const logger = testLogger(config.webhook.secrets)
    const reactions = configuredReactions(config, { logger })
    await ensureReactionStreams(database.db, reactions.names, new Date())
    app = createApp({ config, db: database.db, logger, clock: systemClock, reactions })
  })
  afterAll(async () => {
    await database.close()
  })

  const stored = (deliveryId: string) =>
    database.db
      .selectFrom('webhookDeliveries')
      .select(['outcome', 'eventType', 'rawBody'])
      .where('deliveryId', '=', deliveryId)
      .executeTakeFirstOrThrow()
  /** The events of this order that the forwarder's stream gives it (read without moving the stream). */
  const forwarded = async (externalReference: string) => {
    await untilEventsReadable(database.db)
    const now = new Date()
    const { events } = await readReactionStream(database.db, {
      handler: FORWARDER_HANDLER,
      leaseToken: 'duplicate-keys-test',
      now,
      leaseEnd: new Date(now.getTime() + 60_000),
      limit: 10_000,
    })
    return events.filter(({ event }) => event.externalReference === externalReference).map(({ event }) => event.type)
  }
  const problemLogged = (deliveryId: string) =>
    logEntries().find((entry) => entry.msg === 'webhook payload invalid' && entry.deliveryId === deliveryId)?.problem

  it('stores the attack body as invalid, answers 200, moves no order and forwards nothing', async () => {
    const ref = reference()
    const { order } = await createOrder(database.db, { externalReference: ref })
    // the body of the report: last key wins made it `released`, terminal and money-moving
    const body = `{"trade_id":"t-${ref}","reference":"R1","status":"created","status":"released","external_reference":"${ref}"}`
    const response = await sendWebhook(app, { body, deliveryId: `dlv-${ref}` })
    expect([response.status, response.body]).toEqual([200, { received: true }])
    expect(await stored(`dlv-${ref}`)).toEqual({ outcome: 'invalid', eventType: 'trade.released', rawBody: body })
    expect(problemLogged(`dlv-${ref}`)).toBe('duplicate key "status"')
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBeNull()
    expect(await orderHistory(database.db, order.id)).toEqual([])
    expect(await forwarded(ref)).toEqual([])

    // the same delivery again: a duplicate of the stored one, still nothing applied
    expect((await sendWebhook(app, { body, deliveryId: `dlv-${ref}` })).status).toBe(200)
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBeNull()

    // the body with its key once is applied and forwarded, as before
    const once = `{"trade_id":"t-${ref}","reference":"R1","status":"released","external_reference":"${ref}"}`
    expect((await sendWebhook(app, { body: once, deliveryId: `dlv-${ref}-once` })).status).toBe(200)
    expect(await stored(`dlv-${ref}-once`)).toMatchObject({ outcome: 'applied' })
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('released')
    expect(await forwarded(ref)).toEqual(['trade.released'])
  })

  it.each([
    ['inside a milestone', (ref: string) => `{"trade_id":"t-${ref}","status":"funded","external_reference":"${ref}","milestones":[{"id":"m1"},{"id":"m2","id":"m3"}]}`, 'id'],
    ['written once with an escape', (ref: string) => `{"trade_id":"t-${ref}","status":"created","st\\u0061tus":"funded","external_reference":"${ref}"}`, 'status'],
    ['naming the order', (ref: string) => `{"trade_id":"t-${ref}","status":"funded","external_reference":"other-${ref}","external_reference":"${ref}"}`, 'external_reference'],
    ['with its event', (ref: string) => `{"event":"trade.created","event":"trade.funded","trade_id":"t-${ref}","status":"funded","external_reference":"${ref}"}`, 'event'],
  ])('stores a body with a key twice %s as invalid, its order unmoved', async (_name, body, key) => {
    const ref = reference()
    const { order } = await createOrder(database.db, { externalReference: ref })
    expect((await sendWebhook(app, { body: body(ref), deliveryId: `dlv-${ref}` })).status).toBe(200)
    expect(await stored(`dlv-${ref}`)).toMatchObject({ outcome: 'invalid', eventType: 'trade.funded' })
    expect(problemLogged(`dlv-${ref}`)).toBe(`duplicate key "${key}"`)
    expect(await orderHistory(database.db, order.id)).toEqual([])
    expect(await forwarded(ref)).toEqual([])
  })

  it('does not park a body for an order not created yet: creating the order applies nothing', async () => {
    const ref = reference()
    const body = `{"trade_id":"t-${ref}","status":"created","status":"released","external_reference":"${ref}"}`
    expect((await sendWebhook(app, { body, deliveryId: `dlv-${ref}` })).status).toBe(200)
    expect(await stored(`dlv-${ref}`)).toMatchObject({ outcome: 'invalid' })
    const { order, appliedDeliveries } = await createOrder(database.db, { externalReference: ref })
    expect(appliedDeliveries).toBe(0)
    expect(order.tradeStatus).toBeNull()
    expect(await forwarded(ref)).toEqual([])
  })

  it('stores a seller event with a key twice as invalid rather than ignored', async () => {
    const body = '{"event":"seller.verified","seller_id":"s-1","status":"pending","status":"verified"}'
    expect((await sendWebhook(app, { body, deliveryId: 'dlv-seller-dupkey' })).status).toBe(200)
    expect(await stored('dlv-seller-dupkey')).toEqual({ outcome: 'invalid', eventType: 'seller.verified', rawBody: body })
  })
})
