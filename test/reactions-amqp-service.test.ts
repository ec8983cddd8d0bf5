// RabbitMQ publishing inside `serve`: with AMQP_URL set the composition root registers the publisher as
// the `amqp` reaction handler. Transitions ingested as webhooks reach a queue bound to the exchange
// through the outbox and the dispatcher, each order's in sequence, the event id as message_id; with the
// broker down at start-up the service starts and ingests, and the messages follow once it is back. With
// AMQP_EVENTS, only the types named are published.
// The broker is reached through a TCP proxy the test owns; the consumer connects straight to it.
import { afterEach, expect, it } from 'vitest'
import { createOrder } from './helpers/orders.js'
import { AMQP_HANDLER } from '../src/reactions/configured-reactions.js'
import type { RunningService } from '../src/service.js'
import { amqpUrl, describeRabbitMq, startConsumer, type TestConsumer, uniqueName } from './helpers/amqp-broker.js'
import { testLogger } from './helpers/log-sink.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'
import { reactionRecords } from './helpers/reaction-jobs.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const ORDERS = 20
const STATUSES = ['created', 'funded', 'delivered', 'released']

/** The platform's webhooks for one order: each of STATUSES in turn, signed, to the running service's webhook URL. */
async function sendStatuses(webhookUrl: string, reference: string): Promise<void> {
  for (const status of STATUSES) {
    const body = JSON.stringify(tradePayload(reference, status))
    const response = await fetch(webhookUrl, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-partner-delivery-id': `dlv-${reference}-${status}`,
        'x-partner-signature': signBody(body),
      },
      body,
    })
    expect(response.status).toBe(200)
  }
}

describeRabbitMq('RabbitMQ publishing in the service (RabbitMQ)', () => {
  let service: RunningService | undefined
  let database: TestDatabase | undefined
  let consumer: TestConsumer | undefined
  let gate: TcpProxy | undefined
  afterEach(async () => {
    await service?.stop()
    await database?.close()
    await consumer?.close()
    await gate?.close()
  })

  it('publishes every ingested transition, each order in sequence, once the broker down at start-up is back', async () => {
    const exchange = uniqueName('test-exchange')
    consumer = await startConsumer({ exchange })
    const broker = new URL(amqpUrl!)
    gate = await startTcpProxy({ host: broker.hostname, port: Number(broker.port || 5672) }, { open: false })
    // on Postgres, a schema of its own (the service migrates it); else the in-memory PGlite
    database = postgresUrl ? await createTestDatabase({ migrate: false }) : undefined
    const config = testConfig({
      PORT: '0',
      POLL_ENABLED: 'false',
      AMQP_URL: gate.rewrite(amqpUrl!),
      AMQP_EXCHANGE: exchange,
      AMQP_TIMEOUT_MS: '5000',
      ...(database?.url ? { DATABASE_URL: database.url } : {}),
    })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]) })
    await service.ready
    const { db } = service.database

    // the platform's webhooks: every order's statuses in turn, the orders side by side
    await Promise.all(
      Array.from({ length: ORDERS }, async (_, index) => {
        const reference = `amqp-svc-${index + 1}`
        await createOrder(db, { externalReference: reference })
        await sendStatuses(`${service!.url}${config.webhook.path}`, reference)
      }),
    )
    const history = (
      await db
        .selectFrom('orderStatusHistory')
        .select(['eventId', 'orderId', 'sequence'])
        .orderBy('orderId')
        .orderBy('sequence')
        .execute()
    ).map((row) => ({ ...row, sequence: Number(row.sequence) }))
    expect(history).toHaveLength(ORDERS * STATUSES.length)

    // the broker is still away: the amqp jobs fail and wait for their retry, and the service stays up
    const failedJobs = async () =>
      (
        await db
          .selectFrom('reactionJobs')
          .select('id')
          .where('handler', '=', AMQP_HANDLER)
          .where('attempts', '>', 0)
          .where('state', '=', 'pending')
          .execute()
      ).length
    for (let waited = 0; (await failedJobs()) === 0; waited += 50) {
      if (waited > 120_000) throw new Error('no amqp job failed while the broker was away')
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    const readiness = await fetch(`${service.url}/readyz`)
    expect(readiness.status).toBe(200)
    expect(consumer.received).toEqual([])

    gate.restore()
    const expectedIds = new Set(history.map((row) => row.eventId))
    await consumer.waitFor((received) => new Set(received.map((message) => message.messageId)).size === expectedIds.size)

    // deduplicated by message_id (first delivery wins), each order's events in sequence order
    const firstDeliveries = new Map<string, { orderId: number; sequence: number }>()
    for (const message of consumer.received) {
      if (firstDeliveries.has(message.messageId)) continue
      const { data } = JSON.parse(message.body) as { data: { order_id: number; sequence: number } }
      firstDeliveries.set(message.messageId, { orderId: data.order_id, sequence: data.sequence })
    }
    expect(new Set(firstDeliveries.keys())).toEqual(expectedIds)
    const arrived = new Map<number, number[]>()
    for (const { orderId, sequence } of firstDeliveries.values()) arrived.set(orderId, [...(arrived.get(orderId) ?? []), sequence])
    const sent = new Map<number, number[]>()
    for (const row of history) sent.set(row.orderId, [...(sent.get(row.orderId) ?? []), row.sequence])
    expect(arrived).toEqual(sent)
    // and each message's id is its transition's event id, at its routing key
    const byId = new Map(history.map((row) => [row.eventId, row]))
    for (const message of consumer.received) {
      const row = byId.get(message.messageId)!
      expect(JSON.parse(message.body).data).toMatchObject({ event_id: row.eventId, order_id: row.orderId, sequence: row.sequence })
      expect(message.routingKey).toBe(`trade.${STATUSES[row.sequence - 1]}`)
    }
    process.stdout.write(
      `AMQP in the service: ${history.length} transitions of ${ORDERS} orders ingested with the broker down; ` +
        `${consumer.received.length} messages received once it was back, ${firstDeliveries.size} distinct\n`,
    )
    // every amqp job ends done
    const states = await reactionRecords(db, AMQP_HANDLER)
    for (let waited = 0; states.some((job) => job.state !== 'done') && waited < 30_000; waited += 50) {
      await new Promise((resolve) => setTimeout(resolve, 50))
      states.splice(0, states.length, ...(await reactionRecords(db, AMQP_HANDLER)))
    }
    expect(states.map((job) => job.state)).toEqual(history.map(() => 'done'))
    await service.stop()
    service = undefined
  })

  it('an event no queue is bound for is retried (amqp_unroutable, counted by code), not lost, and lands once a queue is bound', async () => {
    const exchange = uniqueName('test-exchange')
    // the partner has bound trade.funded only, and the service publishes every type (the default)
    consumer = await startConsumer({ exchange, pattern: 'trade.funded' })
    database = postgresUrl ? await createTestDatabase({ migrate: false }) : undefined
    const config = testConfig({
      PORT: '0',
      POLL_ENABLED: 'false',
      AMQP_URL: amqpUrl!,
      AMQP_EXCHANGE: exchange,
      ...(database?.url ? { DATABASE_URL: database.url } : {}),
    })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]) })
    await service.ready
    const { db } = service.database
    const reference = 'amqp-unroutable-1'
    await createOrder(db, { externalReference: reference })
    await sendStatuses(`${service.url}${config.webhook.path}`, reference)
    const history = await db.selectFrom('orderStatusHistory').select(['eventId', 'sequence']).orderBy('sequence').execute()
    expect(history).toHaveLength(STATUSES.length)

    // trade.created comes back from the broker: its job waits for a retry, and holds the order's later events
    const createdJob = () =>
      db
        .selectFrom('reactionJobs')
        .select(['state', 'attempts', 'lastError'])
        .where('handler', '=', AMQP_HANDLER)
        .where('eventId', '=', history[0]!.eventId)
        .executeTakeFirst()
    let job = await createdJob()
    for (let waited = 0; !(job && job.attempts > 0); waited += 50) {
      if (waited > 60_000) throw new Error('the trade.created job never failed')
      await new Promise((resolve) => setTimeout(resolve, 50))
      job = await createdJob()
    }
    expect(job).toMatchObject({ state: 'pending' })
    expect(job!.lastError).toContain(`no queue is bound to exchange "${exchange}" for routing key trade.created`)
    const scrape = await (await fetch(`${service.adminUrl}${config.metrics.path}`)).text()
    expect(scrape).toMatch(/^reaction_failures_total\{handler="amqp",code="amqp_unroutable"\} [1-9]\d*$/m)
    expect(scrape).toMatch(/^reaction_attempts_total\{handler="amqp",result="retry"\} [1-9]\d*$/m)
    expect(consumer.received).toEqual([])

    // the partner binds every key: the retries land, in sequence, and every job ends done
    await consumer.channel.bindQueue(consumer.queue, exchange, '#')
    await consumer.waitFor((received) => new Set(received.map((message) => message.messageId)).size === history.length)
    const firstIds: string[] = []
    for (const message of consumer.received) if (!firstIds.includes(message.messageId)) firstIds.push(message.messageId)
    expect(firstIds).toEqual(history.map((row) => row.eventId))
    let records = await reactionRecords(db, AMQP_HANDLER)
    for (let waited = 0; records.length < history.length || records.some((record) => record.state !== 'done'); waited += 50) {
      if (waited > 60_000) throw new Error(`amqp records after 60 s: ${JSON.stringify(records.map((record) => record.state))}`)
      await new Promise((resolve) => setTimeout(resolve, 50))
      records = await reactionRecords(db, AMQP_HANDLER)
    }
  })

  it('with AMQP_EVENTS=trade.funded publishes the funded transitions only, to a queue that takes every key', async () => {
    const exchange = uniqueName('test-exchange')
    // bound to every routing key: whatever the service published would arrive here
    consumer = await startConsumer({ exchange, pattern: '#' })
    database = postgresUrl ? await createTestDatabase({ migrate: false }) : undefined
    const config = testConfig({
      PORT: '0',
      POLL_ENABLED: 'false',
      AMQP_URL: amqpUrl!,
      AMQP_EXCHANGE: exchange,
      AMQP_EVENTS: 'trade.funded',
      ...(database?.url ? { DATABASE_URL: database.url } : {}),
    })
    service = await startTestService({ config, logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]) })
    await service.ready
    const { db } = service.database
    const orders = 8
    for (let index = 1; index <= orders; index += 1) {
      const reference = `amqp-funded-${index}`
      await createOrder(db, { externalReference: reference })
      await sendStatuses(`${service.url}${config.webhook.path}`, reference)
    }
    const history = await db.selectFrom('orderStatusHistory').select(['eventId', 'toStatus']).execute()
    expect(history).toHaveLength(orders * STATUSES.length)
    const funded = new Set(history.filter((row) => row.toStatus === 'funded').map((row) => row.eventId))
    expect(funded.size).toBe(orders)

    // every amqp record done, and the queue holds the funded ones
    let records = await reactionRecords(db, AMQP_HANDLER)
    for (let waited = 0; records.length < orders || records.some((job) => job.state !== 'done'); waited += 50) {
      if (waited > 60_000) throw new Error(`amqp records after 60 s: ${JSON.stringify(records.map((job) => job.state))}`)
      await new Promise((resolve) => setTimeout(resolve, 50))
      records = await reactionRecords(db, AMQP_HANDLER)
    }
    await consumer.waitFor((received) => new Set(received.map((message) => message.messageId)).size >= orders)
    // the other transitions got no amqp job at all (so none is published later, or retried)
    expect(new Set(records.map((job) => job.eventId))).toEqual(funded)
    expect(new Set(consumer.received.map((message) => message.messageId))).toEqual(funded)
    expect(new Set(consumer.received.map((message) => message.routingKey))).toEqual(new Set(['trade.funded']))
  })
})
