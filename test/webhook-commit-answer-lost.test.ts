// The ingest's commit answered by Postgres but cut on the wire before the answer reached the service: a proxy
// between them (helpers/commit-answer-proxy.ts) forwards the Sync that commits the batch's statement, waits until
// Postgres answered it, drops that answer and closes the service's connection. The service cannot know the
// delivery is stored: it answers 503 (retry later) in its error shape, and the platform's retry with the same id
// and body is answered 200 as a duplicate; the order moved once, with one history row and one reaction event.
// The same cut before the Sync (nothing committed): 503, and the retry applies the delivery once.
import { randomUUID } from 'node:crypto'
import { beforeAll, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { openDatabase } from '../src/db/open-database.js'
import { type App, createApp } from '../src/http/app.js'
import { observationSettings } from '../src/orders/observations.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ensureReactionStreams, readReactionStream } from '../src/reactions/reaction-stream.repository.js'
import { PERHAPS_STORED_MESSAGE } from '../src/webhooks/webhook-endpoint.js'
import { type CommitAnswerProxy, startCommitAnswerProxy } from './helpers/commit-answer-proxy.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { untilEventsReadable } from './helpers/reaction-jobs.js'
import { testConfig } from './helpers/test-config.js'
import { describePostgres, useTestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig({ LOG_LEVEL: 'warn' })
const HANDLER = 'ship-goods'
const reactions = createReactionRegistry().on('trade.funded', HANDLER, async () => {})
const settings = observationSettings(config, reactions.handlersFor)

describePostgres('the answer to the ingest statement’s commit lost on the wire (Postgres)', () => {
  const database = useTestDatabase({ poolSize: 4 })

  beforeAll(async () => {
    await ensureReactionStreams(database.db, reactions.names, new Date())
  })

  /** The service, its pool going through the proxy; closed after `run`. */
  const throughProxy = async (run: (service: { app: App; proxy: CommitAnswerProxy }) => Promise<void>) => {
    const target = new URL(database.url!)
    const proxy = await startCommitAnswerProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 2, logger: testLogger() })
    try {
      const app = createApp({ config, db: handle.db, logger: testLogger(config.webhook.secrets), clock: systemClock, reactions })
      await run({ app, proxy })
    } finally {
      await handle.close()
      await proxy.close()
    }
  }

  const storedRows = (deliveryId: string) =>
    database.db.selectFrom('webhookDeliveries').select(['deliveryId', 'outcome']).where('deliveryId', '=', deliveryId).execute()

  /** The order's history rows, and the events the handler's stream gives it for the order (read without moving the stream). */
  const movesOf = async (externalReference: string) => {
    const order = (await findOrderByExternalReference(database.db, externalReference))!
    const history = await database.db
      .selectFrom('orderStatusHistory')
      .select(['fromStatus', 'toStatus', 'source'])
      .where('orderId', '=', order.id)
      .orderBy('id')
      .execute()
    await untilEventsReadable(database.db)
    const now = new Date()
    const { events } = await readReactionStream(database.db, {
      handler: HANDLER,
      leaseToken: 'commit-lost-test',
      now,
      leaseEnd: new Date(now.getTime() + 60_000),
      limit: 10_000,
    })
    const streamed = events.filter(({ event }) => Number(event.orderId) === Number(order.id)).map(({ event }) => event.type)
    return { tradeStatus: order.tradeStatus, history, streamed }
  }

  it('answers 503 for each delivery of the statement whose commit answer was lost; the retries are duplicates, each move recorded once', async () => {
    const refs = ['commit-lost-a', 'commit-lost-b', 'commit-lost-c']
    for (const ref of refs) await createOrder(database.db, { externalReference: ref }, settings)
    const deliveries = refs.map((ref) => ({ body: tradePayload(ref, 'funded'), deliveryId: `${ref}-${randomUUID()}` }))

    await throughProxy(async ({ app, proxy }) => {
      // the statement that holds the first delivery (and whatever was written with it) loses its commit's answer
      const lost = proxy.loseAnswer(deliveries[0]!.deliveryId, { commit: true })
      const answers = await Promise.all(deliveries.map((delivery) => sendWebhook(app, delivery)))
      expect(await lost).toEqual({ serverAnswered: true })

      expect([answers[0]!.status, answers[0]!.body]).toEqual([
        503,
        { error: { code: 'database_unavailable', message: 'The delivery could not be stored; retry later' } },
      ])
      for (const [index, answer] of answers.entries()) {
        // the others went in the same statement (503) or in one of their own (200): never anything else
        if (answer.status === 200) expect(answer.body).toEqual({ received: true })
        else expect([answer.status, answer.body.error?.code]).toEqual([503, 'database_unavailable'])
        // Postgres committed: every delivery is stored, once
        expect(await storedRows(deliveries[index]!.deliveryId)).toEqual([{ deliveryId: deliveries[index]!.deliveryId, outcome: 'applied' }])
      }
      const perhaps = logEntries().filter((entry) => entry.deliveryId === deliveries[0]!.deliveryId)
      expect(perhaps.map((entry) => entry.msg)).toEqual([PERHAPS_STORED_MESSAGE])

      // the platform sends each again, the same id and body: a duplicate, on a new connection
      for (const delivery of deliveries) {
        const retry = await sendWebhook(app, delivery)
        expect([delivery.deliveryId, retry.status, retry.body]).toEqual([delivery.deliveryId, 200, { received: true, duplicate: true }])
      }
      // the service goes on: a new delivery is stored and answered
      await createOrder(database.db, { externalReference: 'commit-lost-after' }, settings)
      expect((await sendWebhook(app, { body: tradePayload('commit-lost-after', 'funded') })).status).toBe(200)
    })

    for (const ref of refs) {
      expect([ref, await movesOf(ref)]).toEqual([
        ref,
        { tradeStatus: 'funded', history: [{ fromStatus: null, toStatus: 'funded', source: 'webhook' }], streamed: ['trade.funded'] },
      ])
    }
  })

  it('answers 503 when the connection is cut before the commit; the retry applies the delivery once', async () => {
    const ref = 'commit-lost-none'
    await createOrder(database.db, { externalReference: ref }, settings)
    const delivery = { body: tradePayload(ref, 'funded'), deliveryId: `${ref}-${randomUUID()}` }

    await throughProxy(async ({ app, proxy }) => {
      const lost = proxy.loseAnswer(delivery.deliveryId, { commit: false })
      const first = await sendWebhook(app, delivery)
      expect(await lost).toEqual({ serverAnswered: false })
      expect([first.status, first.body.error?.code]).toEqual([503, 'database_unavailable'])

      // the retry waits for the rolled-back statement's row lock, if its session still holds it, then applies
      const retry = await sendWebhook(app, delivery)
      expect([retry.status, retry.body]).toEqual([200, { received: true }])
      expect(await storedRows(delivery.deliveryId)).toEqual([{ deliveryId: delivery.deliveryId, outcome: 'applied' }])
      const again = await sendWebhook(app, delivery)
      expect([again.status, again.body]).toEqual([200, { received: true, duplicate: true }])
    })

    expect(await movesOf(ref)).toEqual({
      tradeStatus: 'funded',
      history: [{ fromStatus: null, toStatus: 'funded', source: 'webhook' }],
      streamed: ['trade.funded'],
    })
  })
})
