// ORDER_REFERENCE_PATTERN: the external references this backend's orders use. A trade event for a reference the
// pattern does not match, with no order, is stored `dismissed` rather than parked: it never reaches the parked
// gauge and its alert, where a foreign trade's every event used to park again after `deliveries dismiss`. No order
// is made with such a reference, so no order can miss the events dismissed for it. Over the real database (PGlite,
// and Postgres when TEST_DATABASE_URL is set), through the webhook endpoint and the CLI.
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { countParkedDeliveries } from '../src/webhooks/delivery.repository.js'
import { runCommand } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

describe('ORDER_REFERENCE_PATTERN', () => {
  const database = useTestDatabase()
  const config = testConfig({ ORDER_REFERENCE_PATTERN: 'ORD-[0-9]+' })
  const cli = (...args: string[]) => runCommand(args, database.db, config)

  let sent = 0
  const send = async (reference: string, status: string) => {
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    const response = await sendWebhook(app, { body: tradePayload(reference, status), deliveryId: `dlv-${reference}-${sent++}` })
    expect(response.status).toBe(200)
    expect(response.body).toEqual({ received: true })
  }
  const outcomes = async (reference: string) =>
    (
      await database.db
        .selectFrom('webhookDeliveries')
        .select('outcome')
        .where('externalReference', '=', reference)
        .orderBy('receivedAt')
        .execute()
    ).map((row) => row.outcome)

  it('stores a foreign reference’s events dismissed, parks ours, and applies an order’s whatever its reference', async () => {
    // an order made before the pattern was set, with a reference it does not match: still this backend's
    await insertOrders(database.db, [{ externalReference: 'legacy-7', tradeId: null, tradeStatus: null }])

    await send('elsewhere-1', 'created')
    await send('elsewhere-1', 'funded')
    await send('ORD-1', 'created')
    await send('legacy-7', 'created')

    expect(await outcomes('elsewhere-1')).toEqual(['dismissed', 'dismissed'])
    expect(await outcomes('ORD-1')).toEqual(['unmatched'])
    expect(await outcomes('legacy-7')).toEqual(['applied'])
    // only ours is parked: the gauge the alert watches counts one
    expect((await countParkedDeliveries(database.db, new Date())).parked).toBe(1)

    // a dismissed delivery re-applied by an operator stays dismissed while no order has its reference
    const [dismissed] = await database.db
      .selectFrom('webhookDeliveries')
      .select('deliveryId')
      .where('externalReference', '=', 'elsewhere-1')
      .execute()
    const reapplied = await cli('deliveries', 'reapply', dismissed!.deliveryId, '--json')
    expect([reapplied.code, JSON.parse(reapplied.stdout).outcome]).toEqual([0, 'dismissed'])
    expect(await outcomes('elsewhere-1')).toEqual(['dismissed', 'dismissed'])

    // our order made later takes its parked delivery at once
    expect((await cli('orders', 'create', '--external-reference', 'ORD-1')).code).toBe(0)
    expect(await outcomes('ORD-1')).toEqual(['applied'])
    expect((await findOrderByExternalReference(database.db, 'ORD-1'))?.tradeStatus).toBe('created')
  })

  it('refuses to make an order with a reference it does not match, before anything is written or sent', async () => {
    await send('elsewhere-2', 'created')

    const created = await cli('orders', 'create', '--external-reference', 'elsewhere-2')
    expect(created.code).toBe(2)
    expect(created.stderr).toContain('Invalid order: external_reference: does not match ORDER_REFERENCE_PATTERN')
    // the partner API's base URL in the test config answers nothing: the refusal comes before any call
    const opened = await cli('trades', 'open', 'elsewhere-3', '--title', 'Bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1')
    expect(opened.code).toBe(2)
    expect(opened.stderr).toContain('does not match ORDER_REFERENCE_PATTERN')

    expect(await findOrderByExternalReference(database.db, 'elsewhere-2')).toBeUndefined()
    expect(await findOrderByExternalReference(database.db, 'elsewhere-3')).toBeUndefined()
    expect(await outcomes('elsewhere-2')).toEqual(['dismissed'])
  })
})
