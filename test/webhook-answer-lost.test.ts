// A delivery whose statement ran but whose answer the database connection lost on the way (reset, closed under it,
// its answer not come in time): the statement may have committed. It is answered 503 (the platform sends it again),
// and the log says it is perhaps stored: it used to say `webhook not stored` of a delivery that was.
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { PERHAPS_STORED_MESSAGE } from '../src/webhooks/webhook-endpoint.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

describe('a delivery whose statement committed but whose answer was lost', () => {
  const database = useTestDatabase()
  const config = testConfig()

  it('is answered 503, logged as perhaps stored, and its retry is answered as the duplicate it is', async () => {
    // the first statement runs, then its answer is lost as a connection closed under it loses it
    let lose = true
    const losing = database.db.withPlugin({
      transformQuery: (args) => args.node,
      transformResult: async (args) => {
        if (lose) {
          lose = false
          throw new Error('Connection terminated unexpectedly')
        }
        return args.result
      },
    })
    const app = createApp({ config, db: losing, logger: testLogger(config.webhook.secrets), clock: systemClock })
    const delivery = { body: tradePayload('answer-lost-1', 'funded'), deliveryId: 'answer-lost-1' }

    const first = await sendWebhook(app, delivery)
    expect({ status: first.status, code: first.body.error?.code }).toEqual({ status: 503, code: 'database_unavailable' })
    const lines = logEntries().filter((entry) => entry.deliveryId === 'answer-lost-1')
    expect(lines.map((entry) => entry.msg)).toEqual([PERHAPS_STORED_MESSAGE])
    // it was stored: the retry says so
    const stored = await database.db.selectFrom('webhookDeliveries').select('deliveryId').where('deliveryId', '=', 'answer-lost-1').execute()
    expect(stored).toHaveLength(1)
    const retry = await sendWebhook(app, delivery)
    expect({ status: retry.status, body: retry.body }).toEqual({ status: 200, body: { received: true, duplicate: true } })
  })

  it('a database that was not there at all is still "webhook not stored"', async () => {
    const refusing = database.db.withPlugin({
      transformQuery: (args) => args.node,
      transformResult: async () => {
        throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' })
      },
    })
    const app = createApp({ config, db: refusing, logger: testLogger(config.webhook.secrets), clock: systemClock })
    const answer = await sendWebhook(app, { body: tradePayload('never-sent-1', 'funded'), deliveryId: 'never-sent-1' })
    expect(answer.status).toBe(503)
    expect(logEntries().filter((entry) => entry.deliveryId === 'never-sent-1').map((entry) => entry.msg)).toEqual(['webhook not stored'])
  })
})
