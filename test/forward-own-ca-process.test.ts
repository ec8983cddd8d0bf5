// The compiled `serve` forwarding to an HTTPS receiver whose certificate a company's own CA signed (the test CA of
// test/fixtures/tls), as README's "Your own certificate authority" tells: without NODE_EXTRA_CA_CERTS the
// certificate is refused, nothing reaches the receiver and the job's error names the reason; with it, given at
// start, the same job is forwarded. NODE_TLS_REJECT_UNAUTHORIZED is never needed.
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { expect, it } from 'vitest'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { stopChild, waitForLogLine } from './helpers/cli-process.js'
import { useForwardingServe } from './helpers/forwarding-serve.js'
import { moveNewOrder } from './helpers/orders.js'
import { unfinishedReactionJobs } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { describePostgres } from './helpers/test-database.js'

const tls = path.join(import.meta.dirname, 'fixtures/tls')

describePostgres("the compiled serve forwarding to a receiver with a certificate of the company's own CA", () => {
  const setting = useForwardingServe('forward-own-ca-', () => 204, { cert: readFileSync(path.join(tls, 'server.crt')), key: readFileSync(path.join(tls, 'server.key')) })

  it('refuses the certificate without NODE_EXTRA_CA_CERTS, naming why, and forwards the same job with it', async () => {
    const { database, receiver } = setting
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    await moveNewOrder(database.db, { externalReference: 'own-ca-1', statuses: ['funded'], handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })
    const [event] = await database.db.selectFrom('orderStatusHistory').select('eventId').execute()
    const env = setting.serveEnv()

    const untrusting = setting.serve(env)
    await waitForLogLine(untrusting, 'service listening')
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

    const trusting = setting.serve({ ...env, NODE_EXTRA_CA_CERTS: path.join(tls, 'ca.crt') })
    await waitForLogLine(trusting, 'service listening')
    // the retry is due after the first backoff (5 s, with jitter)
    await eventually(async () => (await unfinishedReactionJobs(database.db)) === 0, 'the job is done', 60_000)
    expect(await stopChild(trusting)).toBe(0)
    expect(receiver.received.map((request) => request.headers['webhook-id'])).toEqual([event!.eventId])
  })
})
