// The built-in RabbitMQ publisher against the real broker (TEST_AMQP_URL): every event confirmed is
// received, in per-order sequence, deduplicated by message_id; a cut connection and a broker down at
// start-up fail calls (the dispatcher retries them) and never the process. Connections that a test cuts
// go through a TCP proxy the test owns; the consumer connects straight to the broker.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync } from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import amqplib, { type ChannelModel } from 'amqplib'
import { afterEach, describe, expect, it } from 'vitest'
import {
  AmqpPublishError,
  type AmqpPublisher,
  createAmqpPublisher,
  describeBroker,
} from '../src/reactions/amqp-publisher.js'
import { forwardedPayload, type HandlerContext, type ReactionEvent } from '../src/reactions/reaction-event.js'
import { triesAgain } from '../src/reactions/plan-retry.js'
import { amqpUrl, describeRabbitMq, startConsumer, type TestConsumer, uniqueName } from './helpers/amqp-broker.js'
import { logLines, rememberSecret, testLogger } from './helpers/log-sink.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'

const logger = testLogger()
const STATUSES = ['funded', 'shipped', 'delivered', 'accepted', 'released']

function eventOf(orderId: number, sequence: number): ReactionEvent {
  const to = STATUSES[(sequence - 1) % STATUSES.length]!
  return {
    // stable and unique per (order, sequence), as the outbox's uuid is
    eventId: `00000000-0000-4000-8000-${String(orderId).padStart(6, '0')}${String(sequence).padStart(6, '0')}`,
    type: `trade.${to}`,
    orderId,
    externalReference: `order-${orderId}`,
    tradeId: `trd_${orderId}`,
    from: sequence === 1 ? 'created' : STATUSES[(sequence - 2) % STATUSES.length]!,
    to,
    source: 'webhook',
    sequence,
    occurredAt: new Date(Date.UTC(2026, 10, 23, 1, 0, 0) + orderId * 1000 + sequence),
  }
}

function context(overrides: Partial<HandlerContext> = {}): HandlerContext {
  return { signal: new AbortController().signal, attempt: 1, logger, ...overrides }
}

/** The error a call threw, failing the test when it did not throw one of ours. */
async function failureOf(call: Promise<void>): Promise<AmqpPublishError> {
  const error = await call.then(
    () => undefined,
    (thrown: unknown) => thrown,
  )
  expect(error, 'the publish throws').toBeInstanceOf(AmqpPublishError)
  return error as AmqpPublishError
}

/** The debug lines of the publisher written since `before`, each checked to hold every key once. */
function publishLines(before: number): Record<string, unknown>[] {
  const lines = logLines
    .slice(before)
    .join('')
    .split('\n')
    .filter((line) => line.includes('"msg":"reaction publish'))
  return lines.map((line) => {
    const entry = JSON.parse(line) as Record<string, unknown>
    // JSON.parse keeps the last of a key written twice: count them in the line as written
    for (const key of Object.keys(entry)) expect(line.split(`"${key}":`).length - 1, `${key} in ${line}`).toBe(1)
    return entry
  })
}

/**
 * Calls the handler until it resolves, as the dispatcher does with a job that threw (with a short
 * backoff here), counting the failures by code.
 */
async function publishUntilConfirmed(
  publisher: AmqpPublisher,
  event: ReactionEvent,
  failures: Map<string, number>,
): Promise<void> {
  for (let attempt = 1; ; attempt += 1) {
    try {
      await publisher.handler(event, context({ attempt }))
      return
    } catch (error) {
      if (!(error instanceof AmqpPublishError)) throw error
      failures.set(error.code, (failures.get(error.code) ?? 0) + 1)
      if (attempt > 1_000) throw error
      await new Promise((resolve) => setTimeout(resolve, Math.min(500, 20 * attempt)))
    }
  }
}

/** Publishes `perOrder` events of each of `orders` orders: each order's in sequence, all orders at once. */
async function publishOrders(
  publisher: AmqpPublisher,
  { orders, perOrder, failures, onConfirmed }: {
    orders: number
    perOrder: number
    failures: Map<string, number>
    onConfirmed?: (count: number) => void
  },
): Promise<void> {
  let confirmed = 0
  await Promise.all(
    Array.from({ length: orders }, async (_, index) => {
      for (let sequence = 1; sequence <= perOrder; sequence += 1) {
        await publishUntilConfirmed(publisher, eventOf(index + 1, sequence), failures)
        confirmed += 1
        onConfirmed?.(confirmed)
      }
    }),
  )
}

interface Delivery {
  distinct: number
  duplicates: number
  /** Orders whose first deliveries of each event were not 1, 2, 3 ... in arrival order. */
  outOfSequence: number[]
}

/** Deduplicates by message_id (first delivery wins), as a consumer does, and checks each order's sequence. */
function summarize(consumer: TestConsumer, orders: number, perOrder: number): Delivery {
  const seen = new Set<string>()
  const sequences = new Map<number, number[]>()
  let duplicates = 0
  for (const message of consumer.received) {
    if (seen.has(message.messageId)) {
      duplicates += 1
      continue
    }
    seen.add(message.messageId)
    const { data } = JSON.parse(message.body) as { data: { order_id: number; sequence: number } }
    sequences.set(data.order_id, [...(sequences.get(data.order_id) ?? []), data.sequence])
  }
  const expected = Array.from({ length: perOrder }, (_, index) => index + 1)
  const outOfSequence: number[] = []
  for (let orderId = 1; orderId <= orders; orderId += 1) {
    if (JSON.stringify(sequences.get(orderId)) !== JSON.stringify(expected)) outOfSequence.push(orderId)
  }
  return { distinct: seen.size, duplicates, outOfSequence }
}

function allIds(orders: number, perOrder: number): Set<string> {
  const ids = new Set<string>()
  for (let orderId = 1; orderId <= orders; orderId += 1)
    for (let sequence = 1; sequence <= perOrder; sequence += 1) ids.add(eventOf(orderId, sequence).eventId)
  return ids
}

const distinctIds = (received: { messageId: string }[]) => new Set(received.map((message) => message.messageId))

const cleanups: (() => Promise<void>)[] = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

async function consumer(options: Parameters<typeof startConsumer>[0]): Promise<TestConsumer> {
  const started = await startConsumer(options)
  cleanups.push(() => started.close())
  return started
}
function publisher(options: Partial<Parameters<typeof createAmqpPublisher>[0]> & { exchange: string }): AmqpPublisher {
  const created = createAmqpPublisher({ url: amqpUrl!, logger, ...options })
  cleanups.push(() => created.close())
  return created
}
async function proxy({ open = true } = {}): Promise<TcpProxy> {
  const url = new URL(amqpUrl!)
  const started = await startTcpProxy({ host: url.hostname, port: Number(url.port || 5672) }, { open })
  cleanups.push(() => started.close())
  return started
}

// the broker's own command line (its users and their rights: tests make a user and delete it after); a broker
// elsewhere (in a container) has none here, and that test is skipped
function rabbitmqctl(...args: string[]): void {
  execFileSync('rabbitmqctl', args, { stdio: 'pipe' })
}

function onPath(command: string): boolean {
  return (process.env.PATH ?? '').split(path.delimiter).some((directory) => existsSync(path.join(directory, command)))
}

describe('the AMQP publisher, without a broker', () => {
  it('names the broker without its user or password', () => {
    expect(describeBroker('amqps://partner:s3cret-Passw0rd@mq.example.com:5671/escrow')).toBe(
      'amqps://mq.example.com:5671/escrow',
    )
    expect(describeBroker('amqp://guest:guest@127.0.0.1')).toBe('amqp://127.0.0.1')
  })

  it('refuses a URL that is not amqp:// or amqps://', () => {
    expect(() => createAmqpPublisher({ url: 'http://127.0.0.1:5672', exchange: 'x', logger })).toThrow(
      'amqp:// or amqps://',
    )
  })

  it('fails with amqp_unreachable when nothing listens, and no error or log line holds the password', async () => {
    const password = 'never-logged-Passw0rd-8321'
    rememberSecret(password)
    const closedPort = await new Promise<number>((resolve) => {
      const server = net.createServer().listen(0, '127.0.0.1', () => {
        const { port } = server.address() as net.AddressInfo
        server.close(() => resolve(port))
      })
    })
    const unreachable = createAmqpPublisher({
      url: `amqp://partner:${password}@127.0.0.1:${closedPort}/`,
      exchange: 'partner-escrow',
      logger,
    })
    const error = await failureOf(unreachable.handler(eventOf(1, 1), context()))
    expect(error.code).toBe('amqp_unreachable')
    expect(error.message).toContain(`amqp://127.0.0.1:${closedPort}`)
    expect(error.message).toContain('ECONNREFUSED')
    expect(`${error.message} ${String(error.cause)}`).not.toContain(password)
    await unreachable.close()
    expect(logLines.join('')).not.toContain(password)
  })

  // a failure was logged "reaction published", and the job logger's eventId and attempt came twice in the line
  it('logs a failed publish as "reaction publish failed", each key once with the job logger\'s', async () => {
    const failing = createAmqpPublisher({
      url: 'amqp://127.0.0.1:1',
      exchange: 'partner-escrow',
      logger,
      connect: async () => {
        throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' })
      },
    })
    const before = logLines.length
    const jobLogger = logger.child({ jobId: 7, handler: 'amqp', eventId: eventOf(1, 1).eventId, attempt: 3 })
    expect((await failureOf(failing.handler(eventOf(1, 1), context({ attempt: 3, logger: jobLogger })))).code).toBe('amqp_unreachable')
    await failing.close()
    expect(publishLines(before)).toEqual([
      expect.objectContaining({ msg: 'reaction publish failed', error: 'amqp_unreachable', eventId: eventOf(1, 1).eventId, attempt: 3 }),
    ])
  })

  // a status of the platform's is up to 200 characters: `trade.` and 200 × ü is 406 bytes, and amqplib's refusal
  // of it read as an outage (amqp_unreachable), retried 10 times with the order's later events behind it
  it('a routing key past 255 bytes is amqp_routing_key_too_long, permanent (failed at once), and nothing is sent', async () => {
    let connects = 0
    const publisher = createAmqpPublisher({
      url: 'amqp://127.0.0.1:1',
      exchange: 'partner-escrow',
      logger,
      connect: async () => {
        connects += 1
        throw new Error('not to be called')
      },
    })
    const long: ReactionEvent = { ...eventOf(1, 1), type: `trade.${'ü'.repeat(200)}`, to: 'ü'.repeat(200) }
    const error = await failureOf(publisher.handler(long, context()))
    expect(error.code).toBe('amqp_routing_key_too_long')
    expect(error.message).toContain('406 bytes')
    expect(triesAgain(error, 1, 10)).toBe(false)
    expect(connects).toBe(0)
    // 255 bytes exactly is a key AMQP carries
    expect(triesAgain(await failureOf(publisher.handler({ ...long, type: `trade.${'x'.repeat(249)}` as const }, context())), 1, 10)).toBe(true)
    await publisher.close()
  })

  it('stops at once on an aborted signal: amqp_aborted', async () => {
    const aborted = createAmqpPublisher({ url: 'amqp://127.0.0.1:1', exchange: 'partner-escrow', logger })
    const controller = new AbortController()
    controller.abort(new Error('lease ended'))
    const error = await failureOf(aborted.handler(eventOf(1, 1), context({ signal: controller.signal })))
    expect(error.code).toBe('amqp_aborted')
    await aborted.close()
  })

  it('times out against a server that accepts and never answers: the call throws, retryable', async () => {
    const sockets = new Set<net.Socket>()
    const silent = net.createServer((socket) => sockets.add(socket.on('error', () => {})))
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
    const { port } = silent.address() as net.AddressInfo
    const stuck = createAmqpPublisher({ url: `amqp://127.0.0.1:${port}`, exchange: 'x', logger, timeoutMs: 300 })
    const error = await failureOf(stuck.handler(eventOf(1, 1), context()))
    expect(['amqp_timeout', 'amqp_unreachable']).toContain(error.code)
    await stuck.close()
    for (const socket of sockets) socket.destroy()
    await new Promise<void>((resolve) => silent.close(() => resolve()))
  })
})

describeRabbitMq('the AMQP publisher (RabbitMQ)', () => {
  it('publishes a confirmed, persistent message: routing key trade.<status>, message_id, the forwarder JSON', async () => {
    const exchange = uniqueName('test-exchange')
    // the publisher declares the exchange: the consumer only binds to it once it exists (until then the
    // message is returned, as no queue is bound)
    const amqp = publisher({ exchange })
    expect((await failureOf(amqp.handler(eventOf(7, 1), context()))).code).toBe('amqp_unroutable')
    const listening = await consumer({ exchange, pattern: 'trade.*', declareExchange: false })
    const event = eventOf(7, 2)
    await amqp.handler(event, context())
    await listening.waitFor((received) => received.length === 1)
    const [message] = listening.received
    expect(message).toMatchObject({
      messageId: event.eventId,
      routingKey: 'trade.shipped',
      deliveryMode: 2,
      contentType: 'application/json',
      headers: { order_id: 7, sequence: 2, publish_id: expect.stringMatching(/^[0-9a-f-]{36}$/) },
    })
    expect(JSON.parse(message!.body)).toEqual(forwardedPayload(event))
  })

  it('logs a confirmed publish as "reaction published", each key once with the job logger\'s', async () => {
    const exchange = uniqueName('test-exchange')
    await consumer({ exchange, pattern: 'trade.#' })
    const amqp = publisher({ exchange })
    const before = logLines.length
    const event = eventOf(8, 1)
    await amqp.handler(event, context({ attempt: 2, logger: logger.child({ jobId: 8, handler: 'amqp', eventId: event.eventId, attempt: 2 }) }))
    expect(publishLines(before)).toEqual([expect.objectContaining({ msg: 'reaction published', confirmed: true, eventId: event.eventId, attempt: 2 })])
  })

  // The README's field table said bind `trade.#` for every event, its consumer example bound `trade.*`: a topic's `*`
  // is one word, and a status of the platform's may have a dot in it (the table does not know every status it sends)
  it("delivers every event, a status with a dot in it too, to a queue bound as README's consumer example binds it", async () => {
    const readme = readFileSync(path.join(import.meta.dirname, '..', 'README.md'), 'utf8')
    const binding = /await channel\.bindQueue\('erp-orders', 'partner-escrow', '([^']+)'\)/.exec(readme)?.[1]
    expect(binding, "README's consumer example binds a queue").toBeDefined()
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange, pattern: binding! })
    const amqp = publisher({ exchange })
    const dotted = { ...eventOf(9, 1), type: 'trade.on.hold', to: 'on.hold' } satisfies ReactionEvent
    await amqp.handler(eventOf(8, 1), context())
    await amqp.handler(dotted, context())
    await listening.waitFor((received) => received.length === 2)
    expect(listening.received.map((message) => message.routingKey)).toEqual(['trade.funded', 'trade.on.hold'])
  })

  it('throws amqp_nacked when the broker refuses the message (a full queue that rejects publishes)', async () => {
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange })
    const full = uniqueName('test-full-queue')
    await listening.channel.assertQueue(full, {
      exclusive: true,
      arguments: { 'x-max-length': 0, 'x-overflow': 'reject-publish' },
    })
    await listening.channel.bindQueue(full, exchange, '#')
    const amqp = publisher({ exchange })
    const error = await failureOf(amqp.handler(eventOf(1, 1), context()))
    expect(error.code).toBe('amqp_nacked')
    // the channel stays usable: once the queue no longer refuses, the retry is confirmed
    await listening.channel.deleteQueue(full)
    await amqp.handler(eventOf(1, 1), context({ attempt: 2 }))
    // the consumer's own queue took the nacked copy too (a nack says some queue refused it): the retry is
    // a duplicate there, which message_id deduplicates
    await listening.waitFor((received) => received.length === 2)
    expect(distinctIds(listening.received)).toEqual(new Set([eventOf(1, 1).eventId]))
  })

  it('no queue bound: amqp_unroutable naming the exchange and routing key; once a queue is bound the retry lands in it', async () => {
    const exchange = uniqueName('test-exchange')
    const amqp = publisher({ exchange })
    const event = eventOf(3, 1)
    for (let attempt = 1; attempt <= 2; attempt += 1) {
      const error = await failureOf(amqp.handler(event, context({ attempt })))
      expect(error.code).toBe('amqp_unroutable')
      expect(error.message).toContain(`no queue is bound to exchange "${exchange}" for routing key trade.funded`)
    }
    const listening = await consumer({ exchange, pattern: 'trade.*', declareExchange: false })
    await amqp.handler(event, context({ attempt: 3 }))
    await listening.waitFor((received) => received.length === 1)
    // the returned copies reached no queue: the one message is the retry's
    await amqp.handler(eventOf(3, 2), context())
    await listening.waitFor((received) => received.length === 2)
    expect(listening.received.map((message) => message.messageId)).toEqual([event.eventId, eventOf(3, 2).eventId])
  })

  it('many publishes in flight on the one channel, the same message_id twice: only the returned ones fail', async () => {
    const exchange = uniqueName('test-exchange')
    // a partner that binds trade.funded only: trade.delivered has no queue
    const listening = await consumer({ exchange, pattern: 'trade.funded' })
    const amqp = publisher({ exchange })
    await amqp.handler(eventOf(1, 1), context())
    const pairs = 200
    // each pair: two calls for one event id at once, one routed and one not, in both orders, so that a
    // return matched by message_id (first call in flight with that id) would fail the routed call instead
    const calls = Array.from({ length: pairs }, (_, index) => {
      const event = eventOf(100 + index, 1)
      const routed: ReactionEvent = { ...event, type: 'trade.funded', to: 'funded' }
      const unroutable: ReactionEvent = { ...event, type: 'trade.delivered', to: 'delivered' }
      const ordered = index % 2 === 0 ? [routed, unroutable] : [unroutable, routed]
      return ordered.map((sent) =>
        amqp.handler(sent, context()).then(
          () => ({ type: sent.type, outcome: 'confirmed' }),
          (error: unknown) => ({ type: sent.type, outcome: (error as AmqpPublishError).code }),
        ),
      )
    })
    const outcomes = await Promise.all(calls.flat())
    const tally = new Map<string, number>()
    for (const { type, outcome } of outcomes) tally.set(`${type} ${outcome}`, (tally.get(`${type} ${outcome}`) ?? 0) + 1)
    expect(Object.fromEntries(tally)).toEqual({
      'trade.funded confirmed': pairs,
      'trade.delivered amqp_unroutable': pairs,
    })
    await listening.waitFor((received) => received.length === pairs + 1)
    expect(new Set(listening.received.map((message) => message.routingKey))).toEqual(new Set(['trade.funded']))
  })

  it('the exchange deleted mid-run: the next publish fails (unroutable once declared again) and is never confirmed as done', async () => {
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange, pattern: 'trade.*' })
    const amqp = publisher({ exchange })
    await amqp.handler(eventOf(5, 1), context())
    await listening.waitFor((received) => received.length === 1)
    // the partner's side deletes the exchange, and with it the queue's binding (the queue stays)
    await listening.channel.deleteExchange(exchange)
    const next = eventOf(5, 2)
    // the first call finds the exchange gone (the broker closes the channel); the retry declares it again,
    // bindings-less: the message is returned. None of them may resolve
    const codes: string[] = []
    const messages: string[] = []
    while (!codes.includes('amqp_unroutable')) {
      if (codes.length >= 20) throw new Error(`no amqp_unroutable after ${codes.join(', ')}`)
      const error = await failureOf(amqp.handler(next, context({ attempt: codes.length + 1 })))
      codes.push(error.code)
      messages.push(error.message)
    }
    // the first is refused with the broker's reason (404: no such exchange)
    expect(codes[0]).toBe('amqp_refused')
    expect(messages[0]).toContain(`NOT_FOUND - no exchange '${exchange}'`)
    for (const code of codes.slice(1, -1)) expect(['amqp_refused', 'amqp_unreachable']).toContain(code)
    // the partner binds its queue again: the retry lands
    await listening.channel.bindQueue(listening.queue, exchange, 'trade.*')
    await amqp.handler(next, context({ attempt: codes.length + 1 }))
    await listening.waitFor((received) => received.length === 2)
    expect(listening.received.map((message) => message.messageId)).toEqual([eventOf(5, 1).eventId, next.eventId])
  })

  it('throws amqp_refused when the exchange exists with another type, and never crashes', async () => {
    const exchange = uniqueName('test-exchange')
    await consumer({ exchange, exchangeType: 'direct' })
    const amqp = publisher({ exchange })
    const error = await failureOf(amqp.handler(eventOf(1, 1), context()))
    expect(error.code).toBe('amqp_refused')
    expect(error.message).toContain(exchange)
    // and again: every call opens a fresh connection and is refused the same way
    expect((await failureOf(amqp.handler(eventOf(1, 1), context()))).code).toBe('amqp_refused')
  })

  it('a wrong password is amqp_refused, saying so, never amqp_unreachable, and names no password', async () => {
    const password = `wrong-${randomBytes(8).toString('hex')}`
    rememberSecret(password)
    const url = new URL(amqpUrl!)
    url.password = password
    const amqp = publisher({ exchange: uniqueName('test-exchange'), url: url.toString() })
    const error = await failureOf(amqp.handler(eventOf(1, 1), context()))
    expect(error.code).toBe('amqp_refused')
    expect(error.message).toContain('refused the connection (check the user and password of AMQP_URL)')
    expect(error.message).toContain('ACCESS_REFUSED')
    expect(error.message).not.toContain(password)
  })

  it('a vhost that does not exist is amqp_refused naming the vhost, not "Expected ConnectionOpenOk"', async () => {
    const vhost = uniqueName('test-missing-vhost')
    const url = new URL(amqpUrl!)
    url.pathname = `/${vhost}`
    const amqp = publisher({ exchange: uniqueName('test-exchange'), url: url.toString() })
    const error = await failureOf(amqp.handler(eventOf(1, 1), context()))
    expect(error.code).toBe('amqp_refused')
    expect(error.message).toContain(`refused to open the vhost "${vhost}": it does not exist, or this user has no permission on it`)
    expect(error.message).not.toContain('ConnectionOpenOk')
  })

  // config.ts refuses these at start; a URL given to the publisher straight (a fork's) still gets amqplib's refusal
  it("an AMQP_URL query option amqplib cannot send (heartbeat=abc) is amqp_invalid_options, not amqp_unreachable, the broker being up", async () => {
    for (const query of ['heartbeat=abc', 'maxFrameSize=12']) {
      const url = new URL(amqpUrl!)
      url.search = query
      const amqp = publisher({ exchange: uniqueName('test-exchange'), url: url.toString() })
      const error = await failureOf(amqp.handler(eventOf(1, 1), context()))
      expect(error.code, query).toBe('amqp_invalid_options')
      expect(error.message, query).toMatch(/^amqplib refused the connection options for amqp:\/\/[^ ]+ \(AMQP_URL's query options, or a fork's socket options\): /)
      expect(error.message, query).not.toContain(new URL(amqpUrl!).password || 'never-a-password')
    }
  })

  it.skipIf(!onPath('rabbitmqctl'))('a user without the write right on the exchange: amqp_refused with the broker’s reason, not "channel closed"', async () => {
    const exchange = uniqueName('test-exchange')
    await consumer({ exchange, pattern: 'trade.*' })
    const user = `no-write-${randomBytes(4).toString('hex')}`
    const password = randomBytes(12).toString('hex')
    rememberSecret(password)
    rabbitmqctl('add_user', user, password)
    cleanups.push(async () => rabbitmqctl('delete_user', user))
    // configure the exchange (so declaring it passes), write nothing, read nothing
    rabbitmqctl('set_permissions', '-p', '/', user, `^${exchange}$`, '^$', '^$')
    const url = new URL(amqpUrl!)
    url.username = user
    url.password = password
    const amqp = publisher({ exchange, url: url.toString() })
    const error = await failureOf(amqp.handler(eventOf(2, 1), context()))
    expect(error.code).toBe('amqp_refused')
    expect(error.message).toContain(`ACCESS_REFUSED - access to exchange '${exchange}' in vhost '/' refused for user '${user}'`)
    expect(error.message).not.toContain(password)
  })

  // A broker's administrator often declares the exchanges and gives each application's user only the right to
  // write to its own: declaring the exchange, even one that exists as asked, takes the configure right. Every
  // publish of such a user failed with amqp_refused (ACCESS_REFUSED, 403).
  it.skipIf(!onPath('rabbitmqctl'))('publishes through an exchange its user may write to but not declare; names both rights when it is missing', async () => {
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange, pattern: 'trade.*' })
    const user = `publisher-${randomBytes(4).toString('hex')}`
    const password = randomBytes(12).toString('hex')
    rememberSecret(password)
    rabbitmqctl('add_user', user, password)
    cleanups.push(async () => rabbitmqctl('delete_user', user))
    // configure nothing, write the exchange only, read nothing
    rabbitmqctl('set_permissions', '-p', '/', user, '^$', `^${exchange}$`, '^$')
    const url = new URL(amqpUrl!)
    url.username = user
    url.password = password
    const amqp = publisher({ exchange, url: url.toString() })
    const event = eventOf(3, 1)
    await amqp.handler(event, context())
    await listening.waitFor((received) => received.length === 1)
    expect(listening.received[0]!.messageId).toBe(event.eventId)

    // an exchange that does not exist, which this user may not declare
    const missing = uniqueName('test-missing-exchange')
    rabbitmqctl('set_permissions', '-p', '/', user, '^$', `^${missing}$`, '^$')
    const error = await failureOf(publisher({ exchange: missing, url: url.toString() }).handler(event, context()))
    expect(error.code).toBe('amqp_refused')
    expect(error.message).toContain(`the topic exchange "${missing}" does not exist and this user may not declare it (it has no configure right on it)`)
    // and no log line holds it (rememberSecret above: the file's log sink refuses such a line)
    expect(error.message).not.toContain(password)
  })

  it('after close(), calls throw amqp_closed', async () => {
    const amqp = publisher({ exchange: uniqueName('test-exchange') })
    await amqp.close()
    expect((await failureOf(amqp.handler(eventOf(1, 1), context()))).code).toBe('amqp_closed')
  })

  it('10,000 events over 500 orders: every id received, in per-order sequence, exactly once after dedup', async () => {
    const orders = 500
    const perOrder = 20
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange })
    const amqp = publisher({ exchange })
    const failures = new Map<string, number>()
    const startedAt = performance.now()
    await publishOrders(amqp, { orders, perOrder, failures })
    const publishedMs = performance.now() - startedAt
    const expected = allIds(orders, perOrder)
    await listening.waitFor((received) => distinctIds(received).size === expected.size)
    const delivery = summarize(listening, orders, perOrder)
    process.stdout.write(
      `AMQP: ${expected.size} events over ${orders} orders published and confirmed in ${Math.round(publishedMs)} ms ` +
        `(${Math.round(expected.size / (publishedMs / 1000))}/s); received ${listening.received.length}, ` +
        `${delivery.distinct} distinct, ${delivery.duplicates} duplicates; failed calls ${JSON.stringify(Object.fromEntries(failures))}\n`,
    )
    expect([...distinctIds(listening.received)].sort()).toEqual([...expected].sort())
    expect(delivery.outOfSequence).toEqual([])
  })

  it('the connection cut mid-run: nothing lost, in sequence, the process up, publishing resumes', async () => {
    const orders = 100
    const perOrder = 20
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange })
    const cuttable = await proxy()
    const amqp = publisher({ exchange, url: cuttable.rewrite(amqpUrl!), timeoutMs: 5_000 })
    const failures = new Map<string, number>()
    let cutAt: number | undefined
    const cuts: Promise<void>[] = []
    const startedAt = performance.now()
    await publishOrders(amqp, {
      orders,
      perOrder,
      failures,
      onConfirmed: (confirmed) => {
        // cut twice, a quarter (FIN) and half-way (RST) through, each outage long enough for calls to fail
        if (confirmed === 500 || confirmed === 1_000) {
          cutAt ??= confirmed
          cuttable.cut({ reset: confirmed === 1_000 })
          cuts.push(new Promise((resolve) => setTimeout(resolve, 300)).then(() => cuttable.restore()))
        }
      },
    })
    await Promise.all(cuts)
    const publishedMs = performance.now() - startedAt
    const expected = allIds(orders, perOrder)
    await listening.waitFor((received) => distinctIds(received).size === expected.size)
    const delivery = summarize(listening, orders, perOrder)
    process.stdout.write(
      `AMQP, connection cut twice: ${expected.size} events confirmed in ${Math.round(publishedMs)} ms; ` +
        `failed calls retried ${JSON.stringify(Object.fromEntries(failures))}; received ${listening.received.length}, ` +
        `${delivery.distinct} distinct, ${delivery.duplicates} duplicates\n`,
    )
    expect(cutAt).toBe(500)
    // the cuts did fail calls in flight (the test would prove nothing otherwise) ...
    expect([...failures.values()].reduce((sum, count) => sum + count, 0)).toBeGreaterThan(0)
    for (const code of failures.keys()) expect(['amqp_unreachable', 'amqp_timeout']).toContain(code)
    // ... and nothing was lost or reordered
    expect([...distinctIds(listening.received)].sort()).toEqual([...expected].sort())
    expect(delivery.outOfSequence).toEqual([])
    // publishing goes on after the run on the re-opened connection
    await amqp.handler(eventOf(orders + 1, 1), context())
    await listening.waitFor((received) => received.some((message) => message.messageId === eventOf(orders + 1, 1).eventId))
  })

  it('no confirm within the timeout (the connection gone silent): amqp_timeout, and the retry opens a new one', async () => {
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange })
    const silent = await proxy()
    const amqp = publisher({ exchange, url: silent.rewrite(amqpUrl!), timeoutMs: 2_000 })
    const failures = new Map<string, number>()
    await publishUntilConfirmed(amqp, eventOf(1, 1), failures)
    silent.stall()
    const error = await failureOf(amqp.handler(eventOf(1, 2), context()))
    expect(error.code).toBe('amqp_timeout')
    // the stalled connection never answers again: only a new one can carry the retry
    await publishUntilConfirmed(amqp, eventOf(1, 2), failures)
    await listening.waitFor((received) => distinctIds(received).size === 2)
    expect([...distinctIds(listening.received)]).toEqual([eventOf(1, 1).eventId, eventOf(1, 2).eventId])
  })

  it('close() over a connection gone silent ends within the timeout, not when the broker would answer', async () => {
    const exchange = uniqueName('test-exchange')
    await consumer({ exchange })
    const silent = await proxy()
    const amqp = publisher({ exchange, url: silent.rewrite(amqpUrl!), timeoutMs: 1_000 })
    await amqp.handler(eventOf(5, 1), context())
    silent.stall()
    const outcome = await Promise.race([
      amqp.close().then(() => 'closed'),
      new Promise((resolve) => setTimeout(() => resolve('still waiting'), 30_000).unref()),
    ])
    // before, it waited for the broker's close-ok, which a silent path never brings (a service's stop until its bound)
    expect(outcome).toBe('closed')
  })

  it('a connection that opens after close() is closed at once, and its call throws amqp_closed', async () => {
    const exchange = uniqueName('test-exchange')
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    const opened: ChannelModel[] = []
    const connect = async (url: string, options: object) => {
      await held
      const connection = await amqplib.connect(url, options)
      opened.push(connection)
      return connection
    }
    const amqp = publisher({ exchange, connect })
    const call = failureOf(amqp.handler(eventOf(6, 1), context()))
    await amqp.close()
    release()
    expect((await call).code).toBe('amqp_closed')
    expect(opened).toHaveLength(1)
    // no channel opens on it any more: it was closed, not left open beside a closed publisher
    await expect(opened[0]!.createChannel()).rejects.toThrow(/closed/i)
  })

  it('a connection the broker blocked (a resource alarm): the calls that get no confirm say so, with its reason', async () => {
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange })
    const alarmed = await proxy()
    const connections: ChannelModel[] = []
    const connect = async (url: string, options: object) => {
      const connection = await amqplib.connect(url, options)
      connections.push(connection)
      return connection
    }
    const amqp = publisher({ exchange, url: alarmed.rewrite(amqpUrl!), timeoutMs: 1_000, connect })
    await amqp.handler(eventOf(2, 1), context())
    // RabbitMQ under a memory alarm: connection.blocked, and nothing more read from the connection
    connections[0]!.emit('blocked', 'low on memory')
    alarmed.stall()
    const calls = [amqp.handler(eventOf(3, 1), context()), amqp.handler(eventOf(4, 1), context())]
    const errors = await Promise.all(calls.map((call) => failureOf(call)))
    for (const error of errors) {
      expect(['amqp_timeout', 'amqp_unreachable']).toContain(error.code)
      expect(error.message).toContain('(the broker blocked this connection: low on memory)')
    }
    expect(errors.map((error) => error.code)).toContain('amqp_timeout')
    // the alarm lifted: a new connection publishes (the blocked one was given up)
    const failures = new Map<string, number>()
    await publishUntilConfirmed(amqp, eventOf(3, 1), failures)
    await listening.waitFor((received) => distinctIds(received).has(eventOf(3, 1).eventId))
  })

  it('the broker down at start-up: calls fail (retryable) until it is back, then are confirmed', async () => {
    const exchange = uniqueName('test-exchange')
    const listening = await consumer({ exchange })
    const gate = await proxy({ open: false })
    const amqp = publisher({ exchange, url: gate.rewrite(amqpUrl!) })
    for (let attempt = 1; attempt <= 3; attempt += 1) {
      const error = await failureOf(amqp.handler(eventOf(1, 1), context({ attempt })))
      expect(error.code).toBe('amqp_unreachable')
    }
    expect(listening.received).toEqual([])
    gate.restore()
    await amqp.handler(eventOf(1, 1), context({ attempt: 4 }))
    await amqp.handler(eventOf(1, 2), context())
    await listening.waitFor((received) => received.length === 2)
    expect(listening.received.map((message) => message.messageId)).toEqual([eventOf(1, 1).eventId, eventOf(1, 2).eventId])
  })
})
