// A bulk re-apply's dry run says, for each outcome, what re-applying its deliveries does (reapplyDelivery): the
// dismissed deliveries with no order stay dismissed, those whose reference has an order now are applied to it. It
// said "applied again: a status the order already has changes nothing" of them all, orders or none (a review found
// it). Through the console over HTTP: the dry run, then the run, whose result is what the dry run said.
import { describe, expect, it } from 'vitest'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { findDelivery } from '../src/webhooks/delivery.repository.js'
import { actionFields, consoleOverHttp } from './helpers/console-over-http.js'
import { createOrder } from './helpers/orders.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const TOKEN = 'console-dry-run-token-0123456789abcdef'


describe('console: what a bulk re-apply dry run says of dismissed deliveries', () => {
  const { under, get, post } = consoleOverHttp(TOKEN)

  it('says the dismissed with no order stay dismissed and those with an order now are applied to it, as the run does', async () => {
    const from = new Date(Date.now() - 1_000).toISOString()
    for (const reference of ['dis-none-1', 'dis-none-2', 'dis-later']) {
      expect((await sendWebhook(under.app, { body: tradePayload(reference, 'funded'), deliveryId: `dlv-${reference}` })).status).toBe(200)
      const confirm = await get(`/console/deliveries/dismiss?${new URLSearchParams({ reference }).toString()}`)
      expect((await post('/console/deliveries/dismiss', actionFields(confirm.text))).text).toContain('1 dismissed')
    }
    // an order made since for one of them: it does not take a dismissed delivery, a re-apply applies it
    await createOrder(under.database.db, { externalReference: 'dis-later' })

    const dryRun = await get(`/console/deliveries/reapply?${new URLSearchParams({ outcome: 'dismissed', from }).toString()}`)
    expect(dryRun.status).toBe(200)
    expect(dryRun.text).toContain('3 deliveries match')
    const row = /<tr><td>dismissed<\/td>([\s\S]*?)<\/tr>/.exec(dryRun.text)![1]!
    expect(row).toContain('1 applied to the order made since for their reference; 2 stay dismissed: no order has their reference')
    expect(row).not.toContain('changes nothing')

    const run = await post('/console/deliveries/reapply', actionFields(dryRun.text))
    expect(run.status).toBe(200)
    expect(run.text).toContain('3 deliveries re-applied')
    expect((await findDelivery(under.database.db, 'dlv-dis-none-1'))?.outcome).toBe('dismissed')
    expect((await findDelivery(under.database.db, 'dlv-dis-none-2'))?.outcome).toBe('dismissed')
    expect((await findDelivery(under.database.db, 'dlv-dis-later'))?.outcome).toBe('applied')
    expect((await findOrderByExternalReference(under.database.db, 'dis-later'))?.tradeStatus).toBe('funded')
  })
})
