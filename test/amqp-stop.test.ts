// The compiled `serve` publishing to RabbitMQ stopped while the path to the broker is silent (no byte either
// way, no FIN, no RST): the broker's answer to closing the connection never comes, and the stop must not
// wait for it (it did, until its bound, and exited 1).
import type { ChildProcess } from 'node:child_process'
import { rmSync } from 'node:fs'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { AMQP_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { amqpUrl, startConsumer, type TestConsumer, uniqueName } from './helpers/amqp-broker.js'
import { postgresServeEnv, signalAndClose, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { moveNewOrder } from './helpers/orders.js'
import { untilEventsReadable } from './helpers/reaction-jobs.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const describeBoth: typeof describe = amqpUrl ? describePostgres : (describe.skip as typeof describe)

describeBoth('the compiled serve stopped while its broker path is silent (Postgres, RabbitMQ)', () => {
  let database: TestDatabase
  let consumer: TestConsumer
  let proxy: TcpProxy
  let child: ChildProcess | undefined
  const exchange = uniqueName('stop-exchange')
  const dataDir = migratedDataDir('amqp-stop-')

  beforeAll(async () => {
    database = await createTestDatabase()
    consumer = await startConsumer({ exchange })
    const broker = new URL(amqpUrl!)
    proxy = await startTcpProxy({ host: broker.hostname, port: Number(broker.port || 5672) })
  })
  afterAll(async () => {
    if (child?.exitCode === null) child.kill('SIGKILL')
    await proxy?.close()
    await consumer?.close()
    await database?.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it('exits 0 within its bound', async () => {
    // a transition waiting in the publisher's stream when the service starts
    await ensureReactionStreams(database.db, [AMQP_HANDLER], new Date())
    await moveNewOrder(database.db, { externalReference: 'amqp-stop-1', statuses: ['created'], handlersFor: () => [AMQP_HANDLER], now: () => new Date() })
    // readable by the stream before the wait for its message starts: a transaction open anywhere on the server (another
    // file's, another suite's) withholds it until that ends, and a wait that counted that time failed with 0 messages
    // and a service that had done nothing wrong (helpers/reaction-jobs.ts; a bound on a hang, as for a log line)
    await untilEventsReadable(database.db, 240_000)
    child = spawnCli(
      ['serve'],
      { ...postgresServeEnv({ databaseUrl: database.url!, dataDir }), AMQP_URL: proxy.rewrite(amqpUrl!), AMQP_EXCHANGE: exchange },
    )
    const lines: string[] = []
    child.stdout!.on('data', (chunk: Buffer) => lines.push(...chunk.toString().split('\n').filter(Boolean)))
    await waitForLogLine(child, 'service listening')
    // published over the proxy: the connection is open (a wait that ends without it says what the service logged)
    await consumer.waitFor((received) => received.length === 1, 60_000).catch((error: Error) => {
      throw new Error(`${error.message}; the service's last lines:\n${lines.slice(-12).join('\n')}`, { cause: error })
    })
    proxy.stall()
    expect(await signalAndClose(child), `the stop's last lines:\n${lines.slice(-6).join('\n')}`).toEqual({ code: 0, signal: null })
  })
})
