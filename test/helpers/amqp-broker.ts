// The RabbitMQ the "(RabbitMQ)" tests publish to: TEST_AMQP_URL (CI sets it). Each test declares its own
// exchange and queue under a random name and deletes them after; the shared broker is never stopped.
import { randomBytes } from 'node:crypto'
import amqp, { type Channel, type ChannelModel } from 'amqplib'
import { describe } from 'vitest'

export const amqpUrl = process.env.TEST_AMQP_URL || undefined

if (!amqpUrl && !process.env.QUIET_AMQP_SKIP) {
  process.env.QUIET_AMQP_SKIP = '1'
  console.warn('TEST_AMQP_URL is not set: tests named "(RabbitMQ)" are SKIPPED; CI runs them.')
}

/** describe() for tests that need a real RabbitMQ. */
export const describeRabbitMq: typeof describe = amqpUrl ? describe : (describe.skip as typeof describe)

export function uniqueName(prefix: string): string {
  return `${prefix}-${Date.now()}-${randomBytes(4).toString('hex')}`
}

export interface ReceivedMessage {
  messageId: string
  routingKey: string
  deliveryMode: number | undefined
  contentType: string | undefined
  headers: Record<string, unknown>
  body: string
}

/**
 * A consumer on its own connection (straight to the broker, never through a test's proxy): a queue
 * bound to the exchange with `pattern`, recording every message in the order it arrived.
 */
export interface TestConsumer {
  readonly exchange: string
  readonly queue: string
  readonly received: ReceivedMessage[]
  /** The raw channel, for a test that declares something of its own (deleted with the exchange). */
  readonly channel: Channel
  /** Resolves once `predicate` holds for the messages received, polling; rejects after `timeoutMs`. */
  waitFor(predicate: (received: ReceivedMessage[]) => boolean, timeoutMs?: number): Promise<void>
  /** Deletes the queue and the exchange, and closes the connection. */
  close(): Promise<void>
}

export async function startConsumer({
  exchange,
  pattern = '#',
  declareExchange = true,
  exchangeType = 'topic',
}: {
  exchange: string
  pattern?: string
  /** false: a test declares the exchange itself (to prove the publisher's declaration). */
  declareExchange?: boolean
  /** Another type than the publisher's, for the test of a refused declaration. */
  exchangeType?: 'topic' | 'direct'
}): Promise<TestConsumer> {
  const connection: ChannelModel = await amqp.connect(amqpUrl!)
  connection.on('error', () => {})
  const channel = await connection.createChannel()
  channel.on('error', () => {})
  if (declareExchange) await channel.assertExchange(exchange, exchangeType, { durable: true })
  const queue = uniqueName('test-queue')
  await channel.assertQueue(queue, { durable: false, exclusive: true })
  await channel.bindQueue(queue, exchange, pattern)
  const received: ReceivedMessage[] = []
  await channel.consume(
    queue,
    (message) => {
      if (!message) return
      received.push({
        messageId: String(message.properties.messageId),
        routingKey: message.fields.routingKey,
        deliveryMode: message.properties.deliveryMode as number | undefined,
        contentType: message.properties.contentType as string | undefined,
        headers: (message.properties.headers ?? {}) as Record<string, unknown>,
        body: message.content.toString('utf8'),
      })
    },
    { noAck: true },
  )
  return {
    exchange,
    queue,
    received,
    channel,
    async waitFor(predicate, timeoutMs = 120_000) {
      const deadline = Date.now() + timeoutMs
      while (!predicate(received)) {
        if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms; ${received.length} messages received`)
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
    },
    async close() {
      await channel.deleteQueue(queue).catch(() => {})
      await channel.deleteExchange(exchange).catch(() => {})
      await connection.close().catch(() => {})
    },
  }
}
