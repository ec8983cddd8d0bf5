// The compiled `serve` stopped with SIGTERM while the forwarder's stream runs and transitions keep committing
// (Postgres): the stop lets the forwards in flight finish and writes back every batch's record, those held in
// memory and those a read-ahead joined included, so the process that starts next forwards only what was left.
// Across the graceful restart the receiver sees every webhook-id exactly once.
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

const STATUSES = ['created', 'funded', 'delivered']
// committed before the first process starts: its first batch reads them all
const ORDERS_BEFORE = 10

describePostgres('the compiled serve stopped with SIGTERM mid-stream (Postgres)', () => {
  let database: TestDatabase
  let receiver: ForwardReceiver
  const dataDir = migratedDataDir('reactions-sigterm-')
  const children: ChildProcess[] = []

  beforeAll(async () => {
    database = await createTestDatabase()
    // answers each forward after 20 ms: forwards are in flight when the signal comes, and finish within the stop
    receiver = await startForwardReceiver(() => ({ status: 204, afterMs: 20 }))
  })
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null) child.kill('SIGKILL')
    await receiver.close()
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  const commitOrder = (reference: string) =>
    moveNewOrder(database.db, { externalReference: reference, statuses: STATUSES, handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })

  it('forwards every event exactly once across a graceful restart, while transitions keep committing', async () => {
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    for (let i = 0; i < ORDERS_BEFORE; i++) await commitOrder(`before-${i}`)

    // the default slots take the writer's pace with room to spare: the stream's batches are short, their records
    // are held in memory and go with a later one's, and commits land while a batch runs (read ahead into it)
    const env = forwardingServeEnv({ databaseUrl: database.url!, dataDir, forwardUrl: receiver.url })
    const first = spawnCli(['serve'], env, { built: true })
    children.push(first)
    await waitForLogLine(first, 'service listening', 120_000)

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
    first.kill('SIGTERM')
    const [code] = (await once(first, 'exit')) as [number | null]
    expect(code).toBe(0)
    const beforeRestart = receiver.received.length
    await eventually(() => written >= 5, 'some transitions committed after the signal', 60_000)
    writing = false
    await writer

    const events = await database.db.selectFrom('orderStatusHistory').select('eventId').execute()
    const ids = events.map((event) => event.eventId).sort()
    // some events were left for the next process: the restart is what is tested
    expect(beforeRestart).toBeLessThan(ids.length)

    const second = spawnCli(['serve'], env, { built: true })
    children.push(second)
    await waitForLogLine(second, 'service listening', 120_000)
    await eventually(() => receiver.received.length >= ids.length, 'every event was forwarded', 240_000)
    await eventually(async () => (await unfinishedReactionJobs(database.db)) === 0, 'no job is left', 60_000)
    second.kill('SIGTERM')
    expect(((await once(second, 'exit')) as [number | null])[0]).toBe(0)

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
