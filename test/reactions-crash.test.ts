// The compiled `serve` killed with SIGKILL while reaction handlers (the forwarder) run (Postgres): after a
// restart every event is handled, and the receiver sees each webhook-id at least once and, deduplicated by
// it, every transition exactly once.
import { once } from 'node:events'
import { rmSync } from 'node:fs'
import type { ChildProcess } from 'node:child_process'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { unfinishedReactionJobs } from './helpers/reaction-jobs.js'
import { moveNewOrder } from './helpers/orders.js'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { forwardingServeEnv, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const ORDERS = 60
const STATUSES = ['created', 'funded', 'delivered']

describePostgres('the compiled serve killed mid-handler (Postgres)', () => {
  let database: TestDatabase
  let receiver: ForwardReceiver
  // the webhook-id of each forward, as it arrived
  const received = () => receiver.received.map((request) => request.headers['webhook-id'])
  const dataDir = migratedDataDir('reactions-crash-')
  const children: ChildProcess[] = []

  beforeAll(async () => {
    database = await createTestDatabase()
    // answers each forward after 50 ms, so handlers are in flight when the process is killed
    receiver = await startForwardReceiver(() => ({ status: 204, afterMs: 50 }))
  })
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null) child.kill('SIGKILL')
    await receiver.close()
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it('hands every event over after a restart, each webhook-id at least once and every transition once by it', async () => {
    // the transitions commit before the service runs, after the forwarder's stream began: they wait in it
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    for (let i = 0; i < ORDERS; i++) {
      await moveNewOrder(database.db, { externalReference: `crash-${i}`, statuses: STATUSES, handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })
    }
    const events = await database.db.selectFrom('orderStatusHistory').select('eventId').execute()
    expect(events).toHaveLength(ORDERS * STATUSES.length)

    const env = {
      ...forwardingServeEnv({ databaseUrl: database.url!, dataDir, forwardUrl: receiver.url }),
      REACTION_CONCURRENCY: '4',
      // the killed process's claims come back after this
      REACTION_LEASE_S: '2',
      // (a call may run at most the lease less its margin, 1.8 s: the receiver answers in 50 ms)
      FORWARD_TIMEOUT_MS: '1500',
    }
    const first = spawnCli(['serve'], env, { built: true })
    children.push(first)
    await waitForLogLine(first, 'service listening', 120_000)
    await eventually(() => receiver.received.length >= 20, 'the first process forwarded some events', 120_000)
    first.kill('SIGKILL')
    await once(first, 'exit')
    const beforeRestart = receiver.received.length
    const claimedByTheDead = await database.db
      .selectFrom('reactionJobs')
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .where('state', '=', 'running')
      .executeTakeFirstOrThrow()

    const second = spawnCli(['serve'], env, { built: true })
    children.push(second)
    await waitForLogLine(second, 'service listening', 120_000)
    await eventually(async () => (await unfinishedReactionJobs(database.db)) === 0, 'every job is done', 240_000)
    second.kill('SIGTERM')
    await once(second, 'exit')

    const ids = new Set(events.map((event) => event.eventId))
    const seen = new Set(received())
    expect([...seen].sort()).toEqual([...ids].sort())
    expect(receiver.received.length).toBeGreaterThanOrEqual(ids.size)
    console.warn(
      `reactions, SIGKILL mid-handler: ${ids.size} events; ${beforeRestart} forwards before the kill with ` +
        `${claimedByTheDead.n} jobs left running by the dead process; ${receiver.received.length} forwards in all ` +
        `(${receiver.received.length - ids.size} repeats, each with its webhook-id), ${seen.size} distinct`,
    )
  })
})
