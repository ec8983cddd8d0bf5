// A reference is kept exactly as the platform sent it (up to 200 characters, spaces included): ' ref-x' and 'ref-x'
// are two references, as the receiver and the CLI have them. The console trimmed every field it was given, its
// links' and its actions' hidden fields included, so Dismiss, Requeue and the lookups by reference acted on, or
// found, the reference without its spaces (a review found it). Here, through the console over HTTP, each one acts
// on the reference it was given.
import { describe, expect, it } from 'vitest'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { findDelivery } from '../src/webhooks/delivery.repository.js'
import { actionFields, consoleOverHttp } from './helpers/console-over-http.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const TOKEN = 'console-exact-token-0123456789abcdef'


const unescape = (href: string) => href.replace(/&amp;/g, '&')

describe('console: a reference is the exact text it was given', () => {
  const { under, get, post } = consoleOverHttp(TOKEN)

  it("a parked delivery's Dismiss sets aside that reference's deliveries, not those of the reference it trims to", async () => {
    expect((await sendWebhook(under.app, { body: tradePayload('ref-x', 'funded'), deliveryId: 'exact-plain' })).status).toBe(200)
    expect((await sendWebhook(under.app, { body: tradePayload(' ref-x', 'funded'), deliveryId: 'exact-spaced' })).status).toBe(200)
    const spaced = (await findDelivery(under.database.db, 'exact-spaced'))!
    expect([spaced.externalReference, spaced.outcome]).toEqual([' ref-x', 'unmatched'])

    const page = await get(`/console/delivery?id=exact-spaced&body=${spaced.bodySha256}`)
    const dismiss = unescape(/href="([^"]*\/deliveries\/dismiss\?[^"]*)"/.exec(page.text)![1]!)
    const confirm = await get(dismiss)
    expect(confirm.status).toBe(200)
    const fields = actionFields(confirm.text)
    expect(fields.reference).toBe(' ref-x')
    // the question names it so its leading space can be seen
    expect(confirm.text).toContain('exactly as written, with the white space it begins or ends with: &quot; ref-x&quot;')
    const done = await post('/console/deliveries/dismiss', fields)
    expect(done.status).toBe(200)
    expect(done.text).toContain('1 dismissed')
    expect((await findDelivery(under.database.db, 'exact-spaced'))?.outcome).toBe('dismissed')
    expect((await findDelivery(under.database.db, 'exact-plain'))?.outcome).toBe('unmatched')
  })

  it("dismisses ' o-3' parked beside an order 'o-3', where the order's reference was refused (409)", async () => {
    await under.database.db.insertInto('orders').values({ externalReference: 'o-3' }).execute()
    expect((await sendWebhook(under.app, { body: tradePayload(' o-3', 'funded', 'trd_spaced_o3'), deliveryId: 'exact-o3' })).status).toBe(200)
    const confirm = await get(`/console/deliveries/dismiss?${new URLSearchParams({ reference: ' o-3' }).toString()}`)
    expect(confirm.status).toBe(200)
    expect(actionFields(confirm.text).reference).toBe(' o-3')
    expect((await post('/console/deliveries/dismiss', actionFields(confirm.text))).status).toBe(200)
    expect((await findDelivery(under.database.db, 'exact-o3'))?.outcome).toBe('dismissed')
    // the order's own reference is still refused
    expect((await get('/console/deliveries/dismiss?reference=o-3')).status).toBe(409)
  })

  it("finds and requeues ' o-sp', not 'o-sp', and searches orders and deliveries by the exact reference and trade id", async () => {
    await under.database.db
      .insertInto('orders')
      .values([
        { externalReference: 'o-sp', tradeId: 'trd-sp', attention: 'trade_not_found' },
        { externalReference: ' o-sp', tradeId: ' trd-sp', attention: 'trade_not_found' },
      ])
      .execute()
    const found = await get('/console/orders?reference=+o-sp')
    expect(found.status).toBe(200)
    expect(found.text.match(/href="\/console\/orders\/\d+"/g)).toHaveLength(1)
    const spacedId = (await findOrderByExternalReference(under.database.db, ' o-sp'))!.id
    expect(found.text).toContain(`href="/console/orders/${spacedId}"`)
    const byTrade = await get('/console/orders?trade=%20trd-sp')
    expect(byTrade.text.match(/href="\/console\/orders\/\d+"/g)).toEqual([`href="/console/orders/${spacedId}"`])

    // the order page's Requeue form carries the reference as it is
    const orderPage = await get(`/console/orders/${spacedId}`)
    expect(orderPage.text).toContain('<input type="hidden" name="reference" value=" o-sp">')
    const confirm = await get('/console/orders/requeue?reference=%20o-sp')
    const fields = actionFields(confirm.text)
    expect(fields.reference).toBe(' o-sp')
    expect((await post('/console/orders/requeue', fields)).text).toContain('1 due now')
    expect((await findOrderByExternalReference(under.database.db, ' o-sp'))?.attention).toBeNull()
    expect((await findOrderByExternalReference(under.database.db, 'o-sp'))?.attention).toBe('trade_not_found')

    // the deliveries search: by reference and by trade id, exactly
    const deliveries = await get('/console/deliveries?reference=%20ref-x')
    expect(deliveries.text).toContain('exact-spaced')
    expect(deliveries.text).not.toContain('exact-plain')
    expect((await sendWebhook(under.app, { body: tradePayload('lead-1', 'funded', 'trd-lead'), deliveryId: 'exact-trade-plain' })).status).toBe(200)
    expect((await sendWebhook(under.app, { body: tradePayload('lead-2', 'funded', ' trd-lead'), deliveryId: 'exact-trade-spaced' })).status).toBe(200)
    // a space pasted into a search box is named when nothing matches
    const none = await get('/console/orders?reference=o-sp+')
    expect(none.text).toContain('No order matches. External reference &quot;o-sp &quot; begins or ends with white space, and is matched exactly as written.')
    const byDeliveryTrade = await get('/console/deliveries?trade=+trd-lead')
    expect(byDeliveryTrade.text).toContain('exact-trade-spaced')
    expect(byDeliveryTrade.text).not.toContain('exact-trade-plain')
  })
})
