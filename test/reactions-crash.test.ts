// The compiled `serve` killed with SIGKILL while reaction handlers (the forwarder) run (Postgres): after a
// restart every event is handled, and the receiver sees each webhook-id at least once and, deduplicated by
// it, every transition exactly once.
import { expect, it } from 'vitest'
import { unfinishedReactionJobs } from './helpers/reaction-jobs.js'
import { moveNewOrder } from './helpers/orders.js'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { stopChild, waitForLogLine } from './helpers/cli-process.js'
import { useForwardingServe } from './helpers/forwarding-serve.js'
import { eventually } from './helpers/reconcile-poller.js'
import { describePostgres } from './helpers/test-database.js'

const ORDERS = 60
const STATUSES = ['created', 'funded', 'delivered']

describePostgres('the compiled serve killed mid-handler (Postgres)', () => {
  // the receiver answers each forward after 50 ms, so handlers are in flight when the process is killed
  const setting = useForwardingServe('reactions-crash-', () => ({ status: 204, afterMs: 50 }))

  it('hands every event over after a restart, each webhook-id at least once and every transition once by it', async () => {
    const { database, receiver } = setting
    // the webhook-id of each forward, as it arrived
    const received = () => receiver.received.map((request) => request.headers['webhook-id'])
    // the transitions commit before the service runs, after the forwarder's stream began: they wait in it
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    for (let i = 0; i < ORDERS; i++) {
      await moveNewOrder(database.db, { externalReference: `crash-${i}`, statuses: STATUSES, handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })
    }
    const events = await database.db.selectFrom('orderStatusHistory').select('eventId').execute()
    expect(events).toHaveLength(ORDERS * STATUSES.length)

    const env = {
      ...setting.serveEnv(),
      REACTION_CONCURRENCY: '4',
      // the killed process's claims come back after this
      REACTION_LEASE_S: '2',
      // (a call may run at most the lease less its margin, 1.8 s: the receiver answers in 50 ms)
      FORWARD_TIMEOUT_MS: '1500',
    }
    const first = setting.serve(env)
    await waitForLogLine(first, 'service listening')
    await eventually(() => receiver.received.length >= 20, 'the first process forwarded some events', 120_000)
    await stopChild(first, 'SIGKILL')
    const beforeRestart = receiver.received.length
    const claimedByTheDead = await database.db
      .selectFrom('reactionJobs')
      .select((eb) => eb.fn.countAll<string>().as('n'))
      .where('state', '=', 'running')
      .executeTakeFirstOrThrow()

    const second = setting.serve(env)
    await waitForLogLine(second, 'service listening')
    await eventually(async () => (await unfinishedReactionJobs(database.db)) === 0, 'every job is done', 240_000)
    await stopChild(second)

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

// The lease on a handler's stream was REACTION_LEASE_S (300 s by default): a replica killed while it held it held
// back every replica's new transitions of the handler for those 300 s. It is at most 30 s now; a killed replica's
// running jobs still keep their own lease of REACTION_LEASE_S.
describePostgres('a replica killed while it read the stream, with the default lease (Postgres)', () => {
  const setting = useForwardingServe('reactions-crash-lease-', () => ({ status: 204, afterMs: 50 }))

  it('leaves new transitions to the next process within the stream lease, not REACTION_LEASE_S', async () => {
    const { database, receiver } = setting
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    const move = (prefix: string, count: number) =>
      Promise.all(
        Array.from({ length: count }, (_, i) =>
          moveNewOrder(database.db, { externalReference: `${prefix}-${i}`, statuses: STATUSES, handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() }),
        ),
      )
    await move('lease-before', 40)
    const env = { ...setting.serveEnv(), REACTION_CONCURRENCY: '4' }
    const first = setting.serve(env)
    await waitForLogLine(first, 'service listening')
    await eventually(() => receiver.received.length >= 10, 'the first process forwarded some events', 120_000)
    await stopChild(first, 'SIGKILL')
    const [stream] = await database.db.selectFrom('reactionStreams').select('leaseToken').execute()
    expect(stream!.leaseToken, 'the dead process held the stream').not.toBeNull()

    const second = setting.serve(env)
    await waitForLogLine(second, 'service listening')
    const restarted = Date.now()
    await move('lease-after', 5)
    const newIds = new Set(
      (await database.db
        .selectFrom('orderStatusHistory')
        .innerJoin('orders', 'orders.id', 'orderStatusHistory.orderId')
        .select('orderStatusHistory.eventId')
        .where('orders.externalReference', 'like', 'lease-after-%')
        .execute()).map((row) => row.eventId),
    )
    expect(newIds.size).toBe(5 * STATUSES.length)
    // 300 s before; the bound leaves the 30 s lease three times over for a loaded machine
    await eventually(
      () => receiver.received.filter((request) => newIds.has(String(request.headers['webhook-id']))).length >= newIds.size,
      'the new transitions are forwarded',
      90_000,
    )
    await stopChild(second)
    console.warn(`reactions, stream lease after SIGKILL: new transitions forwarded ${Math.round((Date.now() - restarted) / 1000)} s after the restart`)
  }, 300_000)
})
