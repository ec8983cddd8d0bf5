// The compiled `serve` stopped with SIGTERM while the forwarder's stream runs and transitions keep committing
// (Postgres): the stop lets the forwards in flight finish and writes back what its batches did, so the process
// that starts next forwards only what was left. Across the graceful restart the receiver sees every webhook-id
// exactly once. (A stop that finds the stream idle between batches, its done records held in memory, comes in a
// window of a few ms: reaction-stream-write-back.test.ts tests that write-back in process, through `release`.)
import { expect, it } from 'vitest'
import { unfinishedReactionJobs } from './helpers/reaction-jobs.js'
import { moveNewOrder } from './helpers/orders.js'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { stopChild, waitForLogLine } from './helpers/cli-process.js'
import { useForwardingServe } from './helpers/forwarding-serve.js'
import { eventually } from './helpers/reconcile-poller.js'
import { describePostgres } from './helpers/test-database.js'

const STATUSES = ['created', 'funded', 'delivered']
// committed before the first process starts: its first batch reads them all
const ORDERS_BEFORE = 10

describePostgres('the compiled serve stopped with SIGTERM mid-stream (Postgres)', () => {
  // the receiver answers each forward after 20 ms: forwards are in flight when the signal comes, and finish within the stop
  const setting = useForwardingServe('reactions-sigterm-', () => ({ status: 204, afterMs: 20 }))

  it('forwards every event exactly once across a graceful restart, while transitions keep committing', async () => {
    const { database, receiver } = setting
    const commitOrder = (reference: string) =>
      moveNewOrder(database.db, { externalReference: reference, statuses: STATUSES, handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    for (let i = 0; i < ORDERS_BEFORE; i++) await commitOrder(`before-${i}`)

    // the default slots take the writer's pace with room to spare: the stream's batches are short, and commits
    // land while a batch runs (read ahead into it)
    const env = setting.serveEnv()
    const first = setting.serve(env)
    await waitForLogLine(first, 'service listening')

    // transitions commit while the first process forwards, and go on until after it stopped
    let writing = true
    let written = 0
    const writer = (async () => {
      while (writing) {
        await commitOrder(`during-${written}`)
        written += 1
      }
    })()
    await eventually(() => receiver.received.length >= 60, 'the first process forwarded some events', 120_000)
    expect(await stopChild(first)).toBe(0)
    const beforeRestart = receiver.received.length
    await eventually(() => written >= 5, 'some transitions committed after the signal', 60_000)
    writing = false
    await writer

    const events = await database.db.selectFrom('orderStatusHistory').select('eventId').execute()
    const ids = events.map((event) => event.eventId).sort()
    // some events were left for the next process: the restart is what is tested
    expect(beforeRestart).toBeLessThan(ids.length)

    const second = setting.serve(env)
    await waitForLogLine(second, 'service listening')
    await eventually(() => receiver.received.length >= ids.length, 'every event was forwarded', 240_000)
    await eventually(async () => (await unfinishedReactionJobs(database.db)) === 0, 'no job is left', 60_000)
    expect(await stopChild(second)).toBe(0)

    const forwarded = receiver.received.map((request) => request.headers['webhook-id'])
    // each once: a record the stop did not write back would be read again, and its events forwarded twice
    expect([...forwarded].sort()).toEqual(ids)
    console.warn(
      `reactions, SIGTERM mid-stream: ${ids.length} events (${ORDERS_BEFORE * STATUSES.length} before the start, ` +
        `${written * STATUSES.length} while it ran and after), ${beforeRestart} forwarded before the restart, ` +
        `${forwarded.length} forwards in all`,
    )
  })
})
