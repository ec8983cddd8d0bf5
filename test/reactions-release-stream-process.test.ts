// `reactions release-stream` after a replica was killed while calls it had handed off were running (Postgres, the
// compiled `serve` and CLI). Found from outside: the command gave the stream's lease back, but the handed-off jobs
// (running rows under that lease) stayed running until their own lease ran out, REACTION_LEASE_S, holding back their
// orders' later events. Now it gives them back too, pending and due now, and says how many.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import { expect, it } from 'vitest'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { postgresServeEnv, runCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { useForwardingServe } from './helpers/forwarding-serve.js'
import { moveNewOrder } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { describePostgres } from './helpers/test-database.js'

const ORDERS = 3

// the receiver holds every forward of the first process open (its calls are handed off, then it is killed), and
// answers the second's
let answering = false

describePostgres('reactions release-stream after a replica holding handed-off jobs was killed (Postgres)', () => {
  const setting = useForwardingServe('release-stream-process-', () => (answering ? 204 : 'hang'))

  it('gives back the jobs the killed holder had handed off, which then run, and warns that the lease had not run out', async () => {
    const { database, receiver } = setting
    const env = {
      ...setting.serveEnv(),
      // jobs and calls that outlast the test: only the release gives the jobs back
      REACTION_LEASE_S: '3600',
      FORWARD_TIMEOUT_MS: '600000',
    }
    const jobs = () => database.db.selectFrom('reactionJobs').select(['eventId', 'state', 'attempts', 'leaseToken']).orderBy('id').execute()
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    const first = setting.serve(env)
    await waitForLogLine(first, 'service listening')
    for (let i = 0; i < ORDERS; i++) {
      await moveNewOrder(database.db, { externalReference: `handed-off-${i}`, statuses: ['created'], handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })
    }
    // every call held open, so the batch was written back with them running under the stream's lease
    await receiver.waitFor(ORDERS)
    await eventually(async () => (await jobs()).filter((job) => job.state === 'running').length === ORDERS, 'the calls were handed off', 60_000)
    await stopChild(first, 'SIGKILL')
    const [stream] = await database.db.selectFrom('reactionStreams').select('leaseToken').execute()
    expect((await jobs()).map((job) => job.leaseToken)).toEqual(Array(ORDERS).fill(stream!.leaseToken))
    // a holder killed with its clock far ahead: its lease would hold the stream back for a day
    await sql`update reaction_streams set lease_expires_at = now() + interval '1 day'`.execute(database.db)

    const dataDir = mkdtempSync(path.join(tmpdir(), 'release-stream-cli-'))
    try {
      const released = await runCli(['reactions', 'release-stream', FORWARDER_HANDLER], postgresServeEnv({ databaseUrl: database.url!, dataDir }))
      expect(released.code, released.stderr).toBe(0)
      // before: still running, for REACTION_LEASE_S
      expect((await jobs()).map((job) => [job.state, job.attempts, job.leaseToken])).toEqual(Array(ORDERS).fill(['pending', 1, null]))
      expect(released.stdout).toMatch(/^released the lease on reaction stream forwarder, held until .* s from now by the database's clock\): the next replica to read it takes it\n/)
      expect(released.stdout).toContain(`\ngave back ${ORDERS} jobs its holder had handed off (running under that lease): pending, due now, attempts as they were\n`)
      expect(released.stderr).toContain('warning: that lease had not run out: if the replica holding it still runs, the batch it is reading and the jobs it handed off run again elsewhere')
    } finally {
      rmSync(dataDir, { recursive: true, force: true })
    }

    // the next process claims them at once and runs them: each event's second call, with its webhook-id
    answering = true
    const second = setting.serve(env)
    try {
      await waitForLogLine(second, 'service listening')
      await eventually(async () => (await jobs()).every((job) => job.state === 'done'), 'the jobs given back ran', 60_000)
      const ids = (await jobs()).map((job) => job.eventId).sort()
      const forwarded = receiver.received.map((request) => request.headers['webhook-id'])
      expect(forwarded.slice(ORDERS).sort()).toEqual(ids)
      expect((await jobs()).map((job) => job.attempts)).toEqual(Array(ORDERS).fill(2))
    } finally {
      await stopChild(second)
    }
  }, 300_000)
})
