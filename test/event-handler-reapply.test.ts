// `deliveries reapply` and the console's re-apply of a seller or buyer event: its handlers run again on the stored
// body. The platform retries a delivery whose handler failed under a fresh id, five times at most; after those,
// nothing ran the handler again, and the reapply refused the delivery as no trade event.
import { sql } from 'kysely'
import request from 'supertest'
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { createApp } from '../src/http/app.js'
import { configuredReactions } from '../src/reactions/configured-reactions.js'
import { findDelivery } from '../src/webhooks/delivery.repository.js'
import { createEventHandlers, type EventHandlers } from '../src/webhooks/event-handlers.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { actionFields } from './helpers/console-over-http.js'
import { taggedLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'
import { sendWebhook } from './helpers/webhook-delivery.js'

const TOKEN = 'reapply-console-token-0123456789'
const config = testConfig({ ADMIN_TOKEN: TOKEN })
const sellerEvent = (id: string) => `{"event":"seller.verified","seller_id":"${id}","status":"verified","note":"a secret-ish body line"}`

describe('re-applying a seller or buyer event', () => {
  const database = useTestDatabase()

  /** A registry whose seller handler fails while `failing.now`, and records the seller ids it ran for. */
  function sellerHandlers() {
    const failing = { now: true }
    const ran: string[] = []
    const events = createEventHandlers()
    events.on('seller', async ({ body }) => {
      ran.push(String(body.seller_id))
      if (failing.now) throw new Error('the seller registry is down')
      return 'applied'
    })
    return { events, failing, ran }
  }

  /** Stored as the ingest leaves a delivery whose handler failed: answered 500, stored ignored. */
  async function failedAtIngest(events: EventHandlers, deliveryId: string, sellerId: string): Promise<void> {
    const { logger } = taggedLogger(config.webhook.secrets)
    const app = createApp({ config, db: database.db, logger, clock: systemClock, eventHandlers: events })
    const answer = await sendWebhook(app, { body: sellerEvent(sellerId), deliveryId })
    expect(answer.status).toBe(500)
    expect((await findDelivery(database.db, deliveryId))?.outcome).toBe('ignored')
  }

  const reapply = (deliveryId: string, events: EventHandlers | undefined, logger = taggedLogger(config.webhook.secrets).logger, json = false) =>
    runCommandWith(['deliveries', 'reapply', deliveryId, ...(json ? ['--json'] : [])], {
      config,
      db: database.db,
      logger,
      reactions: configuredReactions(config, { logger, partnerHandlers: false }),
      eventHandlers: events,
    })

  it('runs the handler again on the stored body: applied, and the row says so', async () => {
    const { events, failing, ran } = sellerHandlers()
    await failedAtIngest(events, 'dlv-seller-1', 's-1')
    failing.now = false
    const again = await reapply('dlv-seller-1', events)
    expect(again).toEqual({ code: 0, stdout: 'dlv-seller-1: applied (seller.verified: its handler ran again)\n', stderr: '' })
    expect(ran).toEqual(['s-1', 's-1'])
    const stored = await findDelivery(database.db, 'dlv-seller-1')
    expect(stored).toMatchObject({ outcome: 'applied', appliedAt: expect.any(Date) })
    // --json: the outcome, the event type and how many handlers ran; run again, the row keeps when it first applied
    const json = await reapply('dlv-seller-1', events, undefined, true)
    expect(JSON.parse(json.stdout)).toEqual({ deliveryId: 'dlv-seller-1', eventType: 'seller.verified', outcome: 'applied', handlers: 1 })
    expect(ran).toEqual(['s-1', 's-1', 's-1'])
    expect((await findDelivery(database.db, 'dlv-seller-1'))?.appliedAt).toEqual(stored!.appliedAt)
  })

  it('a handler that fails again: exit 1 [event_handler_failed], logged with the id and the type, never the body; the row as it was', async () => {
    const { events, ran } = sellerHandlers()
    await failedAtIngest(events, 'dlv-seller-2', 's-2')
    const tagged = taggedLogger(config.webhook.secrets)
    const again = await reapply('dlv-seller-2', events, tagged.logger)
    expect(again).toMatchObject({ code: 1, stdout: '' })
    expect(again.stderr).toBe(
      'The handler for seller.verified failed again on delivery dlv-seller-2 (its error is logged with the delivery id): the delivery stays ' +
        'stored as ignored; reapply it again once what failed is put right [event_handler_failed]\n',
    )
    expect(ran).toEqual(['s-2', 's-2'])
    expect(tagged.entries().filter((entry) => Number(entry.level) >= 50)).toEqual([
      expect.objectContaining({
        msg: 'webhook event handler failed again on a re-apply; the delivery stays stored as it was',
        deliveryId: 'dlv-seller-2',
        eventType: 'seller.verified',
        err: expect.objectContaining({ message: 'the seller registry is down' }),
      }),
    ])
    expect(tagged.lines().join('\n')).not.toContain('secret-ish')
    expect((await findDelivery(database.db, 'dlv-seller-2'))?.outcome).toBe('ignored')
  })

  it('a body pruned: exit 1 [body_pruned], the handler not run', async () => {
    const { events, ran } = sellerHandlers()
    await failedAtIngest(events, 'dlv-seller-3', 's-3')
    await sql`update webhook_deliveries set raw_body = null where delivery_id = 'dlv-seller-3'`.execute(database.db)
    const again = await reapply('dlv-seller-3', events)
    expect(again).toEqual({
      code: 1,
      stdout: '',
      stderr:
        'Delivery dlv-seller-3 (seller.verified) has no body any more (pruned RETENTION_DAYS after its receipt): its event handlers ' +
        'have nothing to run on [body_pruned]\n',
    })
    expect(ran).toEqual(['s-3'])
  })

  it('an event no handler takes: refused as before, saying where a handler is registered', async () => {
    const { events } = sellerHandlers()
    await failedAtIngest(events, 'dlv-seller-4', 's-4')
    const again = await reapply('dlv-seller-4', createEventHandlers())
    expect(again).toEqual({
      code: 1,
      stdout: '',
      stderr:
        'Delivery dlv-seller-4 is a seller.verified event, and no event handler takes it (registerEventHandlers, ' +
        'src/webhooks/partner-event-handlers.ts): only trade events and the events a handler takes have an effect to re-run [not_a_trade_event]\n',
    })
  })

  it("the console's re-apply runs the service's handlers too", async () => {
    const { events, failing, ran } = sellerHandlers()
    await failedAtIngest(events, 'dlv-seller-5', 's-5')
    const { logger } = taggedLogger([TOKEN, ...config.webhook.secrets])
    const admin = createAdminApp({ config, db: database.db, logger, eventHandlers: events })
    const stored = await findDelivery(database.db, 'dlv-seller-5')
    const path = `/console/deliveries/dlv-seller-5/${stored!.bodySha256}/reapply`
    const bearer = <T extends request.Test>(test: T) => test.set('Authorization', `Bearer ${TOKEN}`)
    const post = async () => {
      const confirm = await bearer(request(admin).get(path))
      expect(confirm.status).toBe(200)
      return bearer(request(admin).post(path)).type('form').send(actionFields(confirm.text))
    }
    const failed = await post()
    expect(failed.status).toBe(200)
    expect(failed.text).toContain("the seller.verified handler failed again (its error is in the service&#39;s log): the delivery stays stored as ignored")
    failing.now = false
    const done = await post()
    expect(done.text).toContain('applied (the seller.verified event&#39;s handler ran again)')
    expect(ran).toEqual(['s-5', 's-5', 's-5'])
    expect((await findDelivery(database.db, 'dlv-seller-5'))?.outcome).toBe('applied')
  })
})
