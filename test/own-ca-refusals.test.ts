// A server whose certificate a company's own CA signed (the test CA of test/fixtures/tls), reached by a process
// that was not given that CA: the partner API client and the RabbitMQ publisher say the certificate was refused
// and what to do (NODE_EXTRA_CA_CERTS), where they said only a code, or that the server was unreachable. (The
// forwarder, through the compiled serve: test/forward-own-ca-process.test.ts.)
import { randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import tls from 'node:tls'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { z } from 'zod'
import { PartnerNotSentError } from '../src/partner-api/partner-api-error.js'
import { PartnerApiTransport } from '../src/partner-api/partner-api-transport.js'
import { AmqpPublishError, createAmqpPublisher } from '../src/reactions/amqp-publisher.js'
import type { ReactionEvent } from '../src/reactions/reaction-event.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'

const fixtures = path.join(import.meta.dirname, 'fixtures/tls')
const HINT = 'if a CA of your own signed it, give the service NODE_EXTRA_CA_CERTS=/path/to/ca.pem (read at start)'
const logger = testLogger()
let server: tls.Server
let port: number

beforeAll(async () => {
  // completes the handshake for a client that trusts the CA, and then says nothing
  server = tls.createServer({ cert: readFileSync(path.join(fixtures, 'server.crt')), key: readFileSync(path.join(fixtures, 'server.key')) }, () => {})
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  port = (server.address() as AddressInfo).port
})
afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()))
})

/** One event published, and what the publish threw. */
function publishOne(publisher: ReturnType<typeof createAmqpPublisher>, reference: string): Promise<unknown> {
  const event: ReactionEvent = {
    eventId: randomUUID(),
    type: 'trade.funded',
    orderId: 1,
    externalReference: reference,
    tradeId: `trd_${reference}`,
    from: 'created',
    to: 'funded',
    source: 'webhook',
    sequence: 1,
    occurredAt: new Date(),
  }
  return publisher.handler(event, { signal: new AbortController().signal, attempt: 1, logger }).catch((thrown: unknown) => thrown)
}

it('the partner API client: the call was not sent, as the platform’s certificate was not accepted, and what to do', async () => {
  const transport = new PartnerApiTransport({
    baseUrl: `https://localhost:${port}`,
    keyId: 'pk_own_ca',
    secret: 'apisec_own_ca_test_5f0c2a7e91',
    timeoutMs: 10_000,
    clock: new FakeClock(Date.now()),
    logger,
    retry: { maxAttempts: 1 },
  })
  const error = await transport.call('GET', '/trades/trd_1', undefined, z.looseObject({})).catch((thrown: unknown) => thrown)
  expect(error).toBeInstanceOf(PartnerNotSentError)
  expect((error as Error).message).toBe(
    `GET /api/partner/v1/trades/trd_1 was not sent: the platform's TLS certificate was not accepted (UNABLE_TO_VERIFY_LEAF_SIGNATURE); ${HINT}`,
  )
})

it('the RabbitMQ publisher at amqps://: unreachable, as the broker’s certificate was not accepted, and what to do', async () => {
  const publisher = createAmqpPublisher({ url: `amqps://localhost:${port}/`, exchange: 'partner-escrow', logger })
  const error = await publishOne(publisher, 'own-ca-1')
  await publisher.close()
  expect(error).toBeInstanceOf(AmqpPublishError)
  expect(error).toMatchObject({ code: 'amqp_unreachable' })
  expect((error as Error).message).toBe(
    `the broker amqps://localhost:${port} is unreachable: its TLS certificate was not accepted (UNABLE_TO_VERIFY_LEAF_SIGNATURE); ${HINT}`,
  )
})

// an amqps:// URL on the broker's plain port: the error was OpenSSL's own text, ending in a line feed
const amqpUrl = process.env.TEST_AMQP_URL
it.skipIf(!amqpUrl)('the RabbitMQ publisher at amqps:// on the broker’s plain port: says so, and which URL to give (RabbitMQ)', async () => {
  const plain = new URL(amqpUrl!)
  const url = `amqps://${plain.username}:${plain.password}@${plain.hostname}:${plain.port || 5672}/`
  const publisher = createAmqpPublisher({ url, exchange: 'partner-escrow', logger, timeoutMs: 5_000 })
  try {
    const error = await publishOne(publisher, 'plain-1')
    expect(error).toBeInstanceOf(AmqpPublishError)
    expect(error).toMatchObject({ code: 'amqp_unreachable' })
    expect((error as Error).message).toBe(
      `the broker amqps://${plain.hostname}:${plain.port || 5672} answered without TLS: its port takes plain AMQP; give AMQP_URL amqp://, or amqps:// with the broker's TLS port (5671 by default)`,
    )
  } finally {
    await publisher.close()
  }
})
