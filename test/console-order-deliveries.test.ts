// An order's page lists the newest 50 deliveries of its reference; past them it links to the deliveries search from
// where its list stops. It showed the 50 with no word of more (a review found it). Through the console over HTTP.
import { describe, expect, it } from 'vitest'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { consoleOverHttp } from './helpers/console-over-http.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const TOKEN = 'console-order-deliveries-token-0123456789'

describe("console: an order's deliveries", () => {
  const { under, get } = consoleOverHttp(TOKEN)
  const deliveryIds = (page: string) => [...page.matchAll(/>(od-\d{2})<\/a>/g)].map((match) => match[1]!)

  it('links past the newest 50 to the deliveries search, which goes on with the rest of the reference', async () => {
    await under.database.db.insertInto('orders').values({ externalReference: ' od ref', tradeId: 'trd-od' }).execute()
    // 52 deliveries of the reference (a leading space: the link keeps it), and one of another
    for (let i = 0; i < 52; i++) {
      const body = { ...tradePayload(' od ref', i % 2 === 0 ? 'funded' : 'created', 'trd-od'), sent: i }
      expect((await sendWebhook(under.app, { body, deliveryId: `od-${String(i).padStart(2, '0')}` })).status).toBe(200)
    }
    expect((await sendWebhook(under.app, { body: tradePayload('od ref', 'funded', 'trd-other'), deliveryId: 'od-99' })).status).toBe(200)
    const order = (await findOrderByExternalReference(under.database.db, ' od ref'))!
    const page = await get(`/console/orders/${order.id}`)
    expect(page.status).toBe(200)
    const listed = deliveryIds(page.text)
    expect(listed).toHaveLength(50)
    const more = /<a rel="next" href="([^"]+)">Older deliveries of this reference →<\/a>/.exec(page.text)?.[1]?.replace(/&amp;/g, '&')
    expect(more).toMatch(/^\/console\/deliveries\?reference=\+od\+ref&after=/)
    const rest = deliveryIds((await get(more!)).text)
    expect(rest).toHaveLength(2)
    expect(new Set([...listed, ...rest]).size).toBe(52)
    expect(rest).not.toContain('od-99')
  })

  it('has no such link when every delivery is shown', async () => {
    await under.database.db.insertInto('orders').values({ externalReference: 'od-few', tradeId: 'trd-few' }).execute()
    expect((await sendWebhook(under.app, { body: tradePayload('od-few', 'funded', 'trd-few'), deliveryId: 'od-few-1' })).status).toBe(200)
    const order = (await findOrderByExternalReference(under.database.db, 'od-few'))!
    const page = await get(`/console/orders/${order.id}`)
    expect(page.text).toContain('od-few-1')
    expect(page.text).not.toContain('Older deliveries of this reference')
  })

  // as `orders show` says it: a create marked and not sent read `create pending` here, like one sent and waiting for
  // its answer, where the next `trades open` sends the first and must not send the second again
  it("says of a pending create whether it was sent, as `orders show` does", async () => {
    for (const [reference, waitMs, shown] of [
      ['od-unsent', -20_000, 'create pending (marked, not sent)'],
      ['od-sent', 20_000, 'create pending<'],
    ] as const) {
      await under.database.db.insertInto('orders').values({ externalReference: reference, tradeCreateState: 'pending', tradeCreateWaitMs: waitMs }).execute()
      const order = (await findOrderByExternalReference(under.database.db, reference))!
      const page = await get(`/console/orders/${order.id}`)
      expect(page.text).toContain(shown)
    }
  })
})
