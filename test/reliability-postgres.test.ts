// Faults that need a real Postgres: connections cut mid-load, a receiver killed with SIGKILL, and two
// replicas receiving every delivery at once.
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import request from 'supertest'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { openDatabase } from '../src/db/open-database.js'
import { createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { createOrder } from './helpers/orders.js'
import { freePort, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { testLogger } from './helpers/log-sink.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, signBody, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig({ LOG_LEVEL: 'warn' })

describePostgres('reliability under database and process faults (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })

  const storedIds = async (ids: string[]) =>
    new Set(
      (await database.db.selectFrom('webhookDeliveries').select('deliveryId').where('deliveryId', 'in', ids.length ? ids : ['-']).execute()).map(
        (row) => row.deliveryId,
      ),
    )

  it('answers 503 while connections are cut, never 200 for an unstored delivery, and recovers by itself', async () => {
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 5, logger: testLogger() })
    try {
      const app = createApp({ config, db: handle.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
      for (let i = 0; i < 20; i++) await createOrder(database.db, { externalReference: `cut-${i}` })
      const answers: { id: string; status: number; phase: string; duplicate: boolean; reference: string }[] = []
      const send = async (phase: string, count: number) => {
        await Promise.all(
          Array.from({ length: count }, async (_, i) => {
            const id = `cut-${phase}-${i}-${randomUUID()}`
            const reference = `cut-${i % 20}`
            const response = await sendWebhook(app, { body: tradePayload(reference, 'funded'), deliveryId: id })
            answers.push({ id, status: response.status, phase, duplicate: response.body?.duplicate === true, reference })
          }),
        )
      }
      await send('before', 40)
      const cutting = send('during', 60)
      setTimeout(() => proxy.cut(), 5)
      await cutting
      await send('cut', 30)
      proxy.restore()
      await send('after', 40)

      expect(answers.every((answer) => answer.status === 200 || answer.status === 503)).toBe(true)
      expect(answers.filter((answer) => answer.phase === 'cut').every((answer) => answer.status === 503)).toBe(true)
      expect(answers.filter((answer) => answer.phase === 'after').every((answer) => answer.status === 200)).toBe(true)
      const ok = answers.filter((answer) => answer.status === 200 && !answer.duplicate).map((answer) => answer.id)
      const stored = await storedIds(answers.map((answer) => answer.id))
      // every delivery answered 200 is stored; one answered as a duplicate (its body resent under a fresh id, which
      // the same body sent 2 to 8 times here is) has its body stored under another id
      expect(ok.filter((id) => !stored.has(id))).toEqual([])
      const duplicates = answers.filter((answer) => answer.status === 200 && answer.duplicate)
      const storedReferences = new Set(
        (await database.db.selectFrom('webhookDeliveries').select('externalReference').where('deliveryId', 'in', [...stored]).execute()).map(
          (row) => row.externalReference,
        ),
      )
      expect(duplicates.filter((answer) => !storedReferences.has(answer.reference))).toEqual([])
    } finally {
      await handle.close()
      await proxy.close()
    }
  })

  it('keeps every delivery it answered 200 when killed with SIGKILL, and accepts the unanswered ones on resend', async () => {
    const env = {
      DATABASE_URL: database.url!,
      PORT: '0',
      ADMIN_PORT: '0',
      POLL_ENABLED: 'false',
      LOG_LEVEL: 'warn',
      PARTNER_API_BASE_URL: 'http://127.0.0.1:1',
      PARTNER_API_KEY_ID: TEST_API_KEY_ID,
      PARTNER_API_SECRET: TEST_API_SECRET,
      WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
      SANDBOX_PORT: String(await freePort()),
    }
    for (let i = 0; i < 50; i++) await createOrder(database.db, { externalReference: `crash-${i}` })
    const start = async () => {
      const child = spawnCli(['serve'], { ...env, LOG_LEVEL: 'info' })
      const { url } = await waitForLogLine(child, 'service listening')
      return { child, url: String(url) }
    }
    const deliveries = Array.from({ length: 400 }, (_, i) => ({
      id: `crash-${i}-${randomUUID()}`,
      body: JSON.stringify(tradePayload(`crash-${i % 50}`, ['created', 'funded', 'delivered', 'released'][Math.floor(i / 100)]!)),
    }))
    const first = await start()
    const answered = new Map<string, number>()
    let sent = 0
    const post = async (url: string, delivery: (typeof deliveries)[number]) =>
      fetch(`${url}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': delivery.id, 'x-partner-signature': signBody(delivery.body) },
        body: delivery.body,
      })
    const load = (async () => {
      // ten at a time, in lifecycle order, until the process dies under it
      for (let i = 0; i < deliveries.length; i += 10) {
        const batch = deliveries.slice(i, i + 10)
        sent += batch.length
        const results = await Promise.allSettled(batch.map((delivery) => post(first.url, delivery)))
        results.forEach((result, k) => {
          if (result.status === 'fulfilled') answered.set(batch[k]!.id, result.value.status)
        })
        if (results.some((result) => result.status === 'rejected')) return
      }
    })()
    while (answered.size < 150) await new Promise((resolve) => setTimeout(resolve, 5))
    first.child.kill('SIGKILL')
    await once(first.child, 'exit')
    await load

    const ok = [...answered].filter(([, status]) => status === 200).map(([id]) => id)
    expect(ok.length).toBeGreaterThanOrEqual(150)
    const stored = await storedIds(ok)
    expect(ok.filter((id) => !stored.has(id))).toEqual([])
    // each answered delivery's effect is there: its order reached at least that status
    for (const delivery of deliveries.filter((d) => answered.get(d.id) === 200)) {
      const { external_reference: ref } = JSON.parse(delivery.body)
      const history = await orderHistory(database.db, (await findOrderByExternalReference(database.db, ref))!.id)
      expect(history.length).toBeGreaterThan(0)
    }

    const second = await start()
    try {
      const unanswered = deliveries.slice(0, sent).filter((delivery) => answered.get(delivery.id) !== 200)
      for (const delivery of unanswered) expect((await post(second.url, delivery)).status).toBe(200)
      const all = await storedIds(deliveries.slice(0, sent).map((delivery) => delivery.id))
      expect(all.size).toBe(sent)
    } finally {
      second.child.kill('SIGTERM')
      await once(second.child, 'exit')
    }
  })

  it('applies each delivery exactly once when two replicas receive every delivery at once', async () => {
    const other = database.openAnother()
    try {
      const logger = testLogger(config.webhook.secrets)
      const replicas = [database.db, other.db].map((db) => createApp({ config, db, logger, clock: systemClock }))
      for (let i = 0; i < 20; i++) await createOrder(database.db, { externalReference: `pair-${i}` })
      const statuses = ['created', 'funded', 'delivered', 'released']
      const answers = []
      for (const status of statuses) {
        answers.push(
          ...(await Promise.all(
            Array.from({ length: 20 }, async (_, i) => {
              const body = JSON.stringify(tradePayload(`pair-${i}`, status))
              const id = `pair-${i}-${status}`
              const signature = signBody(body)
              const both = await Promise.all(
                replicas.map((app) =>
                  request(app).post('/webhooks/partner').set('content-type', 'application/json').set('x-partner-delivery-id', id).set('x-partner-signature', signature).send(body),
                ),
              )
              return both.map((response) => ({ status: response.status, duplicate: response.body.duplicate === true }))
            }),
          )),
        )
      }
      for (const pair of answers) {
        expect(pair.map((answer) => answer.status)).toEqual([200, 200])
        expect(pair.filter((answer) => answer.duplicate)).toHaveLength(1)
      }
      for (let i = 0; i < 20; i++) {
        const order = await findOrderByExternalReference(database.db, `pair-${i}`)
        expect(order?.tradeStatus).toBe('released')
        expect((await orderHistory(database.db, order!.id)).map((change) => change.toStatus)).toEqual(statuses)
      }
    } finally {
      await other.close()
    }
  })
})
