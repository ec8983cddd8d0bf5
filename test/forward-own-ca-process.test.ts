// The compiled `serve` forwarding to an HTTPS receiver whose certificate a company's own CA signed (the test CA of
// test/fixtures/tls), as README's "Your own certificate authority" tells: without NODE_EXTRA_CA_CERTS the
// certificate is refused, nothing reaches the receiver and the job's error names the reason; with it, given at
// start, the same job is forwarded. NODE_TLS_REJECT_UNAUTHORIZED is never needed.
import { readFileSync, rmSync } from 'node:fs'
import path from 'node:path'
import type { ChildProcess } from 'node:child_process'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { forwardingServeEnv, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { moveNewOrder } from './helpers/orders.js'
import { unfinishedReactionJobs } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const tls = path.join(import.meta.dirname, 'fixtures/tls')

describePostgres("the compiled serve forwarding to a receiver with a certificate of the company's own CA", () => {
  let database: TestDatabase
  let receiver: ForwardReceiver
  const dataDir = migratedDataDir('forward-own-ca-')
  const children: ChildProcess[] = []

  beforeAll(async () => {
    database = await createTestDatabase()
    receiver = await startForwardReceiver(() => 204, { cert: readFileSync(path.join(tls, 'server.crt')), key: readFileSync(path.join(tls, 'server.key')) })
  })
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null) child.kill('SIGKILL')
    await receiver.close()
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it('refuses the certificate without NODE_EXTRA_CA_CERTS, naming why, and forwards the same job with it', async () => {
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    await moveNewOrder(database.db, { externalReference: 'own-ca-1', statuses: ['funded'], handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })
    const [event] = await database.db.selectFrom('orderStatusHistory').select('eventId').execute()
    const env = forwardingServeEnv({ databaseUrl: database.url!, dataDir, forwardUrl: receiver.url })

    const untrusting = spawnCli(['serve'], env, { built: true })
    children.push(untrusting)
    await waitForLogLine(untrusting, 'service listening', 120_000)
    // the first attempt failed and was written for later, with its reason
    let lastError: string | null | undefined
    await eventually(async () => {
      const job = await database.db.selectFrom('reactionJobs').select('lastError').where('handler', '=', FORWARDER_HANDLER).executeTakeFirst()
      lastError = job?.lastError
      return typeof lastError === 'string'
    }, 'the refused forward is recorded with its error', 60_000)
    expect(lastError).toContain(
      `the forward receiver ${new URL(receiver.url).origin} is unreachable: its TLS certificate was not accepted (UNABLE_TO_VERIFY_LEAF_SIGNATURE); ` +
        'if a CA of your own signed it, give the service NODE_EXTRA_CA_CERTS=/path/to/ca.pem (read at start)',
    )
    expect(await stopChild(untrusting)).toBe(0)
    expect(receiver.received).toEqual([])

    const trusting = spawnCli(['serve'], { ...env, NODE_EXTRA_CA_CERTS: path.join(tls, 'ca.crt') }, { built: true })
    children.push(trusting)
    await waitForLogLine(trusting, 'service listening', 120_000)
    // the retry is due after the first backoff (5 s, with jitter)
    await eventually(async () => (await unfinishedReactionJobs(database.db)) === 0, 'the job is done', 60_000)
    expect(await stopChild(trusting)).toBe(0)
    expect(receiver.received.map((request) => request.headers['webhook-id'])).toEqual([event!.eventId])
  })
})
