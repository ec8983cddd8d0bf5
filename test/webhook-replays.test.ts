// A captured delivery replayed under fresh delivery ids (the id is not signed): it must change nothing. Two
// ways it did, found from outside:
// - for a reference with no order yet, each replay was parked: rows kept until the order comes, so without end,
//   and the order's creation then applied every one in its transaction (50,000 replays: 16 minutes, every
//   reaction stream of the server held back meanwhile);
// - for the status an order has, each replay put its next poll STALE_AFTER_S later, so replays kept the order
//   from the poll that heals a lost webhook;
// - any body stored with no effect (ignored, stale, parked, dismissed ...) was stored again under each fresh id:
//   200 replays of one 200 KB seller event grew the table by 41 MB, and a replay of a dismissed body parked it
//   again. Such a replay is now answered as a duplicate and not stored (migrations/0017).
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type App, createApp } from '../src/http/app.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { createOrder, TEST_OBSERVATION_SETTINGS } from './helpers/orders.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig()

describe('replays of a delivery under fresh delivery ids', () => {
  let database: TestDatabase
  let app: App
  const clock = new FakeClock(Date.parse('2026-12-01T00:00:00Z'))

  beforeAll(async () => {
    database = await createTestDatabase()
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock })
  })
  afterAll(async () => {
    await database.close()
  })

  const outcomes = async (ids: readonly string[]) =>
    (await database.db.selectFrom('webhookDeliveries').select(['deliveryId', 'outcome', 'orderId']).where('deliveryId', 'in', ids).orderBy('deliveryId').execute())

  it('parks a body once: its replays are answered as duplicates and not stored, and the order applies it once', async () => {
    const body = JSON.stringify(tradePayload('replayed-1', 'funded'))
    const ids = ['rp-1-a', 'rp-1-b', 'rp-1-c']
    const answers = []
    for (const deliveryId of ids) answers.push(await sendWebhook(app, { body, deliveryId }))
    expect(answers.map((answer) => [answer.status, answer.body])).toEqual([
      [200, { received: true }],
      [200, { received: true, duplicate: true }],
      [200, { received: true, duplicate: true }],
    ])
    expect(await outcomes(ids)).toEqual([{ deliveryId: 'rp-1-a', outcome: 'unmatched', orderId: null }])

    const { order } = await createOrder(database.db, { externalReference: 'replayed-1' })
    expect(await outcomes(ids)).toEqual([{ deliveryId: 'rp-1-a', outcome: 'applied', orderId: order.id }])
    expect((await findOrderByExternalReference(database.db, 'replayed-1'))?.tradeStatus).toBe('funded')
    // once applied, the body is a duplicate of its effect: stored once more as such, then not again
    for (const deliveryId of ['rp-1-d', 'rp-1-e']) expect((await sendWebhook(app, { body, deliveryId })).status).toBe(200)
    expect((await outcomes(['rp-1-d', 'rp-1-e'])).map((row) => row.outcome)).toEqual(['duplicate_effect'])
  })

  // found from outside: the platform sends a status's body byte for byte again when the trade comes back to it. A
  // hold lifted (funded, on_hold, funded) was answered as a replay of the first funded's copy (stored
  // duplicate_effect), nothing asked for the poll, and the order stayed on_hold for STALE_AFTER_S
  // a copy an older build stored (before migrations/0019, or beside this build in a rolling upgrade) has no order
  // version, and is judged by its receipt time as before
  it.each([
    ['this build', false],
    ['an older build', true],
  ])('stores a body that asks for a poll when its order changed since the copy %s stored before, and folds it when not', async (_, older) => {
    const reference = older ? 'replayed-hold-older' : 'replayed-hold'
    const funded = JSON.stringify(tradePayload(reference, 'funded'))
    const onHold = JSON.stringify(tradePayload(reference, 'on_hold'))
    const { order } = await createOrder(database.db, { externalReference: reference })
    const poll = async (status: string) => {
      await clock.advance(1_000)
      const observation = { target: { externalReference: reference }, tradeId: `trd_${reference}`, externalReference: reference, status }
      const { outcome } = await applyObservation(database.db, { ...observation, source: 'poll', observedAt: new Date(clock.now()) }, TEST_OBSERVATION_SETTINGS)
      expect(outcome).toBe('applied')
    }
    const send = async (body: string, deliveryId: string) => {
      await clock.advance(1_000)
      const answer = await sendWebhook(app, { body, deliveryId })
      expect(answer.status).toBe(200)
      if (older) await database.db.updateTable('webhookDeliveries').set({ orderVersion: null }).where('deliveryId', '=', deliveryId).execute()
      const stored = await outcomes([deliveryId])
      const { nextPollAt } = (await findOrderByExternalReference(database.db, reference))!
      return { duplicate: answer.body.duplicate === true, outcome: stored[0]?.outcome, pollsNow: nextPollAt?.getTime() === clock.now() }
    }
    expect(await send(funded, 'rh-funded-1')).toEqual({ duplicate: false, outcome: 'applied', pollsNow: false })
    // the webhook again under another id, as after an API call moved the order first
    expect(await send(funded, 'rh-funded-2')).toMatchObject({ duplicate: false, outcome: 'duplicate_effect' })
    expect(await send(onHold, 'rh-hold-1')).toEqual({ duplicate: false, outcome: 'unknown_status', pollsNow: true })
    await poll('on_hold')
    // the hold is lifted: its funded is stored and asks for the poll; a replay of it meanwhile changes nothing
    expect(await send(funded, 'rh-funded-3')).toEqual({ duplicate: false, outcome: 'stale', pollsNow: true })
    expect(await send(funded, 'rh-funded-4')).toEqual({ duplicate: true, outcome: undefined, pollsNow: false })
    await poll('funded')
    expect((await findOrderByExternalReference(database.db, reference))).toMatchObject({ id: order.id, tradeStatus: 'funded' })
  })

  // found from outside, with replicas whose clocks disagree: "stored since its order last changed" compared one
  // replica's receipt time with another's time of the move. A copy of funded stored by a replica 120 s ahead read
  // as newer than the hold the poll applied after it, the hold's lifting was folded as a replay of that copy, and
  // the order stayed on_hold for STALE_AFTER_S. The order's version, stored with the copy, decides it now
  it('tells a hold lifted from a replay by the order’s version, whatever the clocks of the replicas that stored the copies', async () => {
    const reference = 'replayed-hold-skew'
    const funded = JSON.stringify(tradePayload(reference, 'funded'))
    const onHold = JSON.stringify(tradePayload(reference, 'on_hold'))
    const ahead = new FakeClock(clock.now() + 120_000)
    const appAhead = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: ahead })
    await createOrder(database.db, { externalReference: reference })
    const tick = async () => {
      await clock.advance(1_000)
      await ahead.advance(1_000)
    }
    const send = async (to: App, body: string, deliveryId: string) => {
      await tick()
      const answer = await sendWebhook(to, { body, deliveryId })
      expect(answer.status).toBe(200)
      return { duplicate: answer.body.duplicate === true, outcome: (await outcomes([deliveryId]))[0]?.outcome }
    }
    expect(await send(app, funded, 'rhs-funded-1')).toEqual({ duplicate: false, outcome: 'applied' })
    // the platform's send under a second id, received by the replica ahead
    expect(await send(appAhead, funded, 'rhs-funded-2')).toEqual({ duplicate: false, outcome: 'duplicate_effect' })
    expect(await send(app, onHold, 'rhs-hold-1')).toEqual({ duplicate: false, outcome: 'unknown_status' })
    await tick()
    const { outcome } = await applyObservation(
      database.db,
      { target: { externalReference: reference }, tradeId: `trd_${reference}`, externalReference: reference, status: 'on_hold', source: 'poll', observedAt: new Date(clock.now()) },
      TEST_OBSERVATION_SETTINGS,
    )
    expect(outcome).toBe('applied')
    // the hold lifted, received by either replica: stored, and the poll asked for now
    expect(await send(app, funded, 'rhs-funded-3')).toEqual({ duplicate: false, outcome: 'stale' })
    const order = await findOrderByExternalReference(database.db, reference)
    expect(order).toMatchObject({ tradeStatus: 'on_hold' })
    expect(order!.nextPollAt!.getTime()).toBeLessThanOrEqual(clock.now())
    // and a replay of it, at the replica ahead, is one
    expect(await send(appAhead, funded, 'rhs-funded-4')).toEqual({ duplicate: true, outcome: undefined })
  })

  it('does not park a dismissed body again when it is replayed, nor store a replayed body that changed nothing', async () => {
    const body = JSON.stringify(tradePayload('replayed-dismissed', 'funded'))
    expect((await sendWebhook(app, { body, deliveryId: 'rp-d-0' })).status).toBe(200)
    await database.db.updateTable('webhookDeliveries').set({ outcome: 'dismissed' }).where('deliveryId', '=', 'rp-d-0').execute()
    const replay = await sendWebhook(app, { body, deliveryId: 'rp-d-1' })
    expect(replay.body).toEqual({ received: true, duplicate: true })
    expect(await outcomes(['rp-d-0', 'rp-d-1'])).toEqual([{ deliveryId: 'rp-d-0', outcome: 'dismissed', orderId: null }])
    expect(await database.db.selectFrom('webhookDeliveries').select('deliveryId').where('outcome', '=', 'unmatched')
      .where('externalReference', '=', 'replayed-dismissed').execute()).toEqual([])

    // a large seller event (ignored: no handler takes it), replayed under 20 fresh ids: one row, one body
    const seller = JSON.stringify({ event: 'seller.verified', seller_id: 's-1', padding: 'x'.repeat(200_000) })
    const ids = Array.from({ length: 21 }, (_, i) => `rp-s-${String(i).padStart(2, '0')}`)
    for (const deliveryId of ids) expect((await sendWebhook(app, { body: seller, deliveryId })).status).toBe(200)
    expect(await outcomes(ids)).toEqual([{ deliveryId: 'rp-s-00', outcome: 'ignored', orderId: null }])
  })

  it('applies a body parked many times before (stored so by an earlier version) once, and records the rest in one go', async () => {
    const body = JSON.stringify(tradePayload('replayed-2', 'funded'))
    expect((await sendWebhook(app, { body, deliveryId: 'rp-2-0' })).status).toBe(200)
    const [first] = await database.db.selectFrom('webhookDeliveries').selectAll().where('deliveryId', '=', 'rp-2-0').execute()
    // as an earlier version stored replays: each parked
    const copies = Array.from({ length: 300 }, (_, i) => ({ ...first!, id: undefined, deliveryId: `rp-2-${String(i + 1).padStart(3, '0')}` }))
    for (const copy of copies) delete copy.id
    await database.db.insertInto('webhookDeliveries').values(copies).execute()

    const { order, parkedDeliveries: parked } = await createOrder(database.db, { externalReference: 'replayed-2' })
    expect(parked.map((result) => result.outcome)).toEqual(['applied', ...copies.map(() => 'duplicate_effect')])
    const stored = await outcomes(['rp-2-0', ...copies.map((copy) => copy.deliveryId)])
    expect(stored.filter((row) => row.outcome === 'applied')).toEqual([{ deliveryId: 'rp-2-0', outcome: 'applied', orderId: order.id }])
    expect(stored.filter((row) => row.outcome === 'duplicate_effect' && row.orderId === order.id)).toHaveLength(300)
    // each recorded with the order's version after the move, as the ingest records a copy (what the replay check reads)
    const versions = await database.db.selectFrom('webhookDeliveries').select('orderVersion').distinct()
      .where('deliveryId', 'in', ['rp-2-0', ...copies.map((copy) => copy.deliveryId)]).execute()
    expect(versions).toEqual([{ orderVersion: 1 }])
  })

  it('does not put the next poll later for a replay of the status the order has', async () => {
    await createOrder(database.db, { externalReference: 'replayed-3', now: () => new Date(clock.now()) })
    const body = JSON.stringify(tradePayload('replayed-3', 'funded'))
    expect((await sendWebhook(app, { body, deliveryId: 'rp-3-0' })).status).toBe(200)
    const moved = await findOrderByExternalReference(database.db, 'replayed-3')
    expect(moved?.tradeStatus).toBe('funded')
    const due = moved!.nextPollAt!.getTime()
    expect(due).toBe(clock.now() + config.poll.staleAfterS * 1_000)

    for (let replay = 1; replay <= 3; replay++) {
      await clock.advance(3_600_000)
      expect((await sendWebhook(app, { body, deliveryId: `rp-3-${replay}` })).status).toBe(200)
      const order = await findOrderByExternalReference(database.db, 'replayed-3')
      expect(order?.nextPollAt?.getTime(), `replay ${replay}`).toBe(due)
    }
    // the first replay is stored as a duplicate of the effect; the next, the same body again, are not stored
    expect((await outcomes(['rp-3-1', 'rp-3-2', 'rp-3-3'])).map((row) => row.outcome)).toEqual(['duplicate_effect'])

    // a status the service does not know asks for a poll now: a resend of the current status then leaves it due
    const unknown = JSON.stringify(tradePayload('replayed-3', 'on_hold'))
    expect((await sendWebhook(app, { body: unknown, deliveryId: 'rp-3-unknown' })).status).toBe(200)
    const pollNow = (await findOrderByExternalReference(database.db, 'replayed-3'))!.nextPollAt!.getTime()
    expect(pollNow).toBeLessThanOrEqual(clock.now())
    await clock.advance(2_000)
    expect((await sendWebhook(app, { body, deliveryId: 'rp-3-4' })).status).toBe(200)
    expect((await findOrderByExternalReference(database.db, 'replayed-3'))?.nextPollAt?.getTime()).toBe(pollNow)
  })
})
