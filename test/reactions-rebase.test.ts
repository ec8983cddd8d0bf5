// Stream positions are transaction ids of one database server's counter. Restored onto a server whose counter is
// lower (pg_dump and pg_restore, logical replication), they stay ahead of it: an order's new event takes its last,
// old position, above every snapshot's xmin, and waits for good; the service said only "reaction stream held back",
// every minute, naming nothing. Here a restore is simulated by moving every stored position far ahead of the
// server's counter (as a fresh server sees them), then the dispatcher says what happened and what to run (an error
// line and reaction_stream_positions_ahead, no held-back warning), and `reactions rebase` moves the positions back
// below the counter: every event not yet taken is handed over once, in its order's sequence, and new ones too.
import { type Kysely, sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import type { Database } from '../src/db/database.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import { ensureReactionStreams, readReactionStream, streamPositionsAheadQuery } from '../src/reactions/reaction-stream.repository.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { runCommand } from './helpers/cli-in-process.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { TEST_DISPATCHER_SETTINGS } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const AHEAD = /^reaction stream positions are ahead of this database server's transaction counter: .*run `partner-escrow reactions rebase`$/
const HELD_BACK = /^reaction stream held back: /
// what a fresh server's counter is behind the restored positions (an epoch and more)
const RESTORE_OFFSET = '1000000000000'

/** Every stored position moved `offset` ahead: what a restore onto a server with a counter that much lower leaves. */
async function moveAllPositions(db: Kysely<Database>, offset: string) {
  const ahead = (column: string) => sql`(${sql.ref(column)}::text::numeric + ${offset}::numeric)::text::xid8`
  await sql`update reaction_streams set position = ${ahead('position')}`.execute(db)
  await sql`update order_status_history set stream_position = ${ahead('stream_position')} where stream_position is not null`.execute(db)
  await sql`update orders set last_event_position = ${ahead('last_event_position')} where last_event_position is not null`.execute(db)
  await sql`update reaction_stream_batches set to_position = ${ahead('to_position')}`.execute(db)
}

async function positions(db: Kysely<Database>) {
  const { rows } = await sql<{ id: string; position: string }>`
    select id::text, stream_position::text as position from order_status_history where stream_position is not null order by id`.execute(db)
  return rows
}

describe('stream positions of another server (a restore), and `reactions rebase`', () => {
  let database: TestDatabase
  let dispatcher: Dispatcher | undefined
  // what the handler got, in the order it got it: `reference:status`
  const handled: string[] = []
  const reactions = createReactionRegistry().on('trade.*', 'recorder', async (event) => {
    handled.push(`${event.externalReference}:${event.to}`)
  })
  const move = async (externalReference: string, status: string) => {
    const order = await database.db.selectFrom('orders').select('id').where('externalReference', '=', externalReference).executeTakeFirstOrThrow()
    const result = await applyObservation(
      database.db,
      { target: { orderId: order.id }, tradeId: `trd_${externalReference}`, status, source: 'api', observedAt: new Date() },
      { staleAfterS: 3_600, handlersFor: reactions.handlersFor },
    )
    expect(result.outcome).toBe('applied')
  }
  const start = async (hooks: { onPositionsAhead?: (aheadBy: number) => void } = {}) => {
    dispatcher = createDispatcher({
      db: database.db,
      handler: reactions.handler,
      streams: reactions,
      clock: systemClock,
      logger: testLogger(),
      listen: database.listen,
      // one handler call at a time; the held-back warning after 50 ms, so its path runs at once
      settings: { ...TEST_DISPATCHER_SETTINGS, concurrency: 1, heldBackWarnMs: 50 },
      ...hooks,
    })
    await dispatcher.start()
  }
  const stop = async () => {
    await dispatcher?.stop()
    dispatcher = undefined
  }

  beforeAll(async () => {
    database = await createTestDatabase()
    await ensureReactionStreams(database.db, reactions.names, new Date())
  })
  afterAll(async () => {
    await stop()
    await database.close()
  })

  it('reads the largest history position from the stream index, not the table', async () => {
    const compiled = streamPositionsAheadQuery().compile(database.db)
    const { rows } = await sql<{ 'QUERY PLAN': string }>`explain ${sql.raw(compiled.sql)}`.execute(database.db)
    const plan = rows.map((row) => Object.values(row)[0]).join('\n')
    expect(plan).toMatch(/Index Only Scan Backward using order_status_history_stream_idx/)
    expect(plan).not.toMatch(/Seq Scan on order_status_history/)
  })

  it('says what happened and what to run, hands nothing over meanwhile, and after the rebase hands over every event once, in order', async () => {
    // before the "restore": two transitions handed over, then four more committed while no dispatcher ran
    await moveNewOrder(database.db, { externalReference: 'rb-1', statuses: ['created', 'funded'], handlersFor: reactions.handlersFor, now: () => new Date() })
    await start()
    await eventually(() => handled.length === 2, 'the first transitions are handed over', 60_000)
    await stop()
    expect(handled).toEqual(['rb-1:created', 'rb-1:funded'])
    await moveNewOrder(database.db, { externalReference: 'rb-2', statuses: ['created', 'funded'], handlersFor: reactions.handlersFor, now: () => new Date() })
    await move('rb-1', 'delivered')
    await move('rb-2', 'delivered')

    // the restore: every position far ahead of this server's counter
    await moveAllPositions(database.db, RESTORE_OFFSET)
    // a transition after it, of an order with events not taken yet: it takes the order's last, restored position
    await move('rb-2', 'released')
    // and a new order's first transition: it has no position of its own, so takes at least the streams' places
    // (taking the server's counter, it fell below every place, read by no handler ever)
    await moveNewOrder(database.db, { externalReference: 'rb-4', statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date() })
    const before = await positions(database.db)
    const { rows: next } = await sql<{ next: string }>`select pg_snapshot_xmax(pg_current_snapshot())::text as next`.execute(database.db)
    expect(before.every((row) => BigInt(row.position) > BigInt(next[0]!.next))).toBe(true)

    // the service: the error at its start, the metric, and the stream held back with no "held back" warning
    const metrics = createMetrics({}, { defaultMetrics: false })
    const hooks = metrics.reactionHooks(reactions.names)
    const looks: number[] = []
    const firstLine = logEntries().length
    await start({
      onPositionsAhead: (aheadBy) => {
        looks.push(aheadBy)
        hooks.onPositionsAhead(aheadBy)
      },
    })
    const linesSince = () => logEntries().slice(firstLine)
    await eventually(() => linesSince().some((entry) => AHEAD.test(String(entry.msg))), 'the positions are said to be ahead', 60_000)
    const [error] = linesSince().filter((entry) => AHEAD.test(String(entry.msg)))
    expect(error).toEqual(expect.objectContaining({ level: 50, largestPosition: expect.any(String), nextTransactionId: expect.any(String), aheadBy: expect.any(Number) }))
    expect(error!.aheadBy as number).toBeGreaterThan(1e11)
    expect(await metrics.registry.getSingleMetricAsString('reaction_stream_positions_ahead')).toMatch(/^reaction_stream_positions_ahead \d{12,}$/m)
    // past the held-back warning's time the stream, withheld, looks again at the positions (twice) instead of warning
    await eventually(() => looks.length >= 3, 'the held-back path looks at the positions', 60_000)
    expect(linesSince().filter((entry) => HELD_BACK.test(String(entry.msg)))).toEqual([])
    // (said once: at most once a minute)
    expect(linesSince().filter((entry) => AHEAD.test(String(entry.msg)))).toHaveLength(1)
    expect(handled).toEqual(['rb-1:created', 'rb-1:funded'])

    // a dry run says what it would do, and changes nothing
    const dryRun = await runCommand(['reactions', 'rebase', '--dry-run'], database.db)
    expect(dryRun).toEqual(expect.objectContaining({ code: 0, stderr: '' }))
    expect(dryRun.stdout).toMatch(/^would shift every reaction stream position back by \d+ transaction ids, in their order: the largest from \d+ to \d+, below this server's next transaction id \d+\n {2}1 stream place\(s\), 8 event\(s\), 3 order\(s\), \d+ batch record\(s\)\n/)
    expect(dryRun.stdout).toContain('nothing was changed (--dry-run)')
    expect(await positions(database.db)).toEqual(before)

    // from here on a held-back warning may be true: another session on a shared server can hold its transaction open
    const rebasedAt = logEntries().length
    const rebase = await runCommand(['reactions', 'rebase'], database.db)
    expect(rebase).toEqual(expect.objectContaining({ code: 0, stderr: '' }))
    expect(rebase.stdout).toMatch(/^shifted every reaction stream position back by \d+ transaction ids/)
    expect(rebase.stdout).toContain('the handlers now get every transition they had not taken, in order, and the new ones')
    const after = await positions(database.db)
    // one shift: the same order, the same distances between the positions not clamped
    const shift = BigInt(before.at(-1)!.position) - BigInt(after.at(-1)!.position)
    for (const [i, row] of after.entries()) {
      expect(row.id).toBe(before[i]!.id)
      expect(row.position === '0' || BigInt(before[i]!.position) - BigInt(row.position) === shift).toBe(true)
    }

    // the metric, and with it the alert, reads 0 again within seconds, not at the next minute's look
    await eventually(
      async () => /^reaction_stream_positions_ahead 0$/m.test(await metrics.registry.getSingleMetricAsString('reaction_stream_positions_ahead')),
      'the metric reads 0 after the rebase',
      60_000,
    )
    // the running dispatcher gets every event it had not taken, each once, each order's in sequence; and new ones
    await eventually(() => handled.length === 8, 'the withheld transitions are handed over', 60_000)
    await moveNewOrder(database.db, { externalReference: 'rb-3', statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date() })
    await move('rb-1', 'released')
    await eventually(() => handled.length === 10, 'new transitions are handed over', 60_000)
    const ofOrder = (reference: string) => handled.filter((entry) => entry.startsWith(`${reference}:`))
    expect(new Set(handled).size).toBe(handled.length)
    expect(ofOrder('rb-1')).toEqual(['rb-1:created', 'rb-1:funded', 'rb-1:delivered', 'rb-1:released'])
    expect(ofOrder('rb-2')).toEqual(['rb-2:created', 'rb-2:funded', 'rb-2:delivered', 'rb-2:released'])
    expect(ofOrder('rb-3')).toEqual(['rb-3:created'])
    expect(ofOrder('rb-4')).toEqual(['rb-4:created'])
    // while the positions were ahead, nothing read as held back (a transaction's to end)
    expect(logEntries().slice(firstLine, rebasedAt).filter((entry) => HELD_BACK.test(String(entry.msg)))).toEqual([])

    // nothing ahead any more: the command says so and changes nothing
    const again = await runCommand(['reactions', 'rebase'], database.db)
    expect(again).toEqual(expect.objectContaining({ code: 0, stderr: '' }))
    expect(again.stdout).toMatch(/^no stream position is ahead of this server's transaction counter \(largest \d+, next transaction id \d+\): nothing to rebase\n$/)
    await stop()
    expect(handled).toHaveLength(10)
  })

  it('refuses, changing nothing, when the events not read yet span more ids than fit below the counter', async () => {
    // a stream far behind the others (a handler long gone): its place stays where it was, the rest moves ahead
    await ensureReactionStreams(database.db, ['gone'], new Date())
    await moveAllPositions(database.db, RESTORE_OFFSET)
    await sql`update reaction_streams set position = '1'::xid8, history_id = 0 where handler = 'gone'`.execute(database.db)
    const before = await positions(database.db)
    const refused = await runCommand(['reactions', 'rebase'], database.db)
    expect(refused.code).toBe(1)
    expect(refused.stderr).toMatch(/the stream gone is at \d+ .*nothing was changed.*\[rebase_no_room\]/s)
    expect(await positions(database.db)).toEqual(before)
    // the stream of the handler that is gone deleted, as the refusal says, the rebase goes through
    await database.db.deleteFrom('reactionStreams').where('handler', '=', 'gone').execute()
    const rebase = await runCommand(['reactions', 'rebase'], database.db)
    expect(rebase.code).toBe(0)
    // and a read finds the stream's place below the server's counter again, with nothing left to read
    const read = await readReactionStream(database.db, { handler: 'recorder', leaseToken: 'probe', now: new Date(), leaseEnd: new Date(Date.now() + 1_000), limit: 10 })
    expect(read).toEqual(expect.objectContaining({ leased: true, events: [] }))
  })
})
