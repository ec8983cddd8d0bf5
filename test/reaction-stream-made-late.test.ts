// A reaction handler's stream is a row the service made only as it started. Found in a restore review: with the
// service pointed at a new, empty database and `migrate` run from outside, no handler got a transition stored after
// (none forwarded within 60 s) until the replicas were restarted; likewise a database restored without the rows. A
// running service now makes the row it finds missing, as its start does: the handler takes the transitions from its
// last sight of the stream on, none committed before (a restored history is not handed over again), and the row a
// replica or a restore made first is kept (ON CONFLICT DO NOTHING).
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import { describe, expect, it } from 'vitest'
import { migrateToLatest } from '../src/db/migrate.js'
import type { ReactionEvent } from '../src/reactions/reaction-event.js'
import { createMissingReactionStream, ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import type { RunningService } from '../src/service.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { describePostgres, postgresUrl, useTestDatabase } from './helpers/test-database.js'
import { startTestService } from './helpers/test-service.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const HANDLER = 'late-ledger'
const MADE = "reaction stream made: the database had no row for this handler's stream (replaced and migrated, or restored without it); it takes the transitions committed from this replica's last read of it on"

/** A service with one handler that records what it is handed, and a signed delivery sender for it. */
async function startRecording(database: { url: string | undefined }) {
  const handed: ReactionEvent[] = []
  const config = testConfig({ ...(postgresUrl ? { DATABASE_URL: database.url! } : {}), PORT: '0', POLL_ENABLED: 'false' })
  const service = await startTestService({
    config,
    logger: testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET]),
    registerReactions: (reactions) => reactions.on('trade.*', HANDLER, async (event) => void handed.push(event)),
  })
  await service.ready
  const deliver = async (reference: string, status: string) => {
    const body = JSON.stringify(tradePayload(reference, status))
    const headers = { 'content-type': 'application/json', 'x-partner-delivery-id': `dlv-${randomBytes(6).toString('hex')}`, 'x-partner-signature': signBody(body) }
    return (await fetch(`${service.url}${config.webhook.path}`, { method: 'POST', headers, body })).status
  }
  const seen = () => handed.map((event) => `${event.externalReference}:${event.to}`)
  return { service, deliver, seen }
}

describe(`a reaction stream missing under a running service (${postgresUrl ? 'Postgres' : 'PGlite'})`, () => {
  // on Postgres, a schema of its own for the service; on PGlite the service's own embedded database
  const database = useTestDatabase()
  const streamRows = (service: RunningService) => service.database.db.selectFrom('reactionStreams').select('handler').execute()

  it('hands the transitions stored after a new, empty database was migrated from outside to the handler, without a restart', async () => {
    const { service, deliver, seen } = await startRecording(database)
    const { db } = service.database
    try {
      await createOrder(db, { externalReference: 'before-replaced' })
      expect(await deliver('before-replaced', 'funded')).toBe(200)
      await eventually(() => seen().length === 1, 'the first transition was handed over')

      // the database replaced under the service: its schema gone, then made again by `migrate` from outside
      const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(db)
      // the service's own statements lock its tables as the drop does, in another order: Postgres may end the drop as
      // a deadlock's victim (seen in CI), and an operator would run it again
      await eventually(async () => {
        try {
          await sql`drop schema ${sql.id(rows[0]!.schema)} cascade`.execute(db)
          return true
        } catch (error) {
          if ((error as { code?: string }).code === '40P01') return false
          throw error
        }
      }, 'the schema is dropped')
      await sql`create schema ${sql.id(rows[0]!.schema)}`.execute(db)
      await migrateToLatest(db)
      expect(await streamRows(service)).toEqual([])
      const before = logEntries().length

      await createOrder(db, { externalReference: 'after-replaced' })
      expect(await deliver('after-replaced', 'funded')).toBe(200)
      // before: never (the row was made at the start only)
      await eventually(() => seen().includes('after-replaced:funded'), 'the transition stored after the migration was handed over')
      expect(await deliver('after-replaced', 'delivered')).toBe(200)
      await eventually(() => seen().includes('after-replaced:delivered'), 'the next one too')
      expect(seen()).toEqual(['before-replaced:funded', 'after-replaced:funded', 'after-replaced:delivered'])
      expect(await streamRows(service)).toEqual([{ handler: HANDLER }])
      expect(logEntries().slice(before).filter((line) => line.msg === MADE)).toMatchObject([{ handler: HANDLER }])
    } finally {
      await service.stop()
    }
  })

  it('makes a row gone from a running database (restored without it) again from where the stream was: the transition whose commit found it gone is handed over, none handled before again', async () => {
    const { service, deliver, seen } = await startRecording(database)
    const { db } = service.database
    try {
      const recorded = async () => (await db.selectFrom('reactionStreamBatches').select('events').execute()).reduce((sum, row) => sum + Number(row.events), 0)
      const recordedBefore = await recorded()
      await createOrder(db, { externalReference: 'handled-before' })
      await createOrder(db, { externalReference: 'stored-after' })
      expect(await deliver('handled-before', 'funded')).toBe(200)
      expect(await deliver('handled-before', 'delivered')).toBe(200)
      await eventually(() => seen().length === 2, 'the first transitions were handed over')
      // the record of those first attempts written back, so the row's place is past them
      await eventually(async () => (await recorded()) === recordedBefore + 2, 'the batch is written back')

      await db.deleteFrom('reactionStreams').execute()
      // its commit wakes the stream's read, which finds the row gone: made from the start, the history was handed over
      // again; made from now, this transition was not handed over at all
      expect(await deliver('stored-after', 'funded')).toBe(200)
      await eventually(() => seen().includes('stored-after:funded'), 'the transition stored after the row went was handed over')
      expect(await deliver('stored-after', 'delivered')).toBe(200)
      await eventually(() => seen().includes('stored-after:delivered'), 'the next one too')
      expect(seen()).toEqual(['handled-before:funded', 'handled-before:delivered', 'stored-after:funded', 'stored-after:delivered'])
    } finally {
      await service.stop()
    }
  })

  it('keeps the row another replica or a restore made first, and never starts one after now', async () => {
    const { db } = database
    const now = new Date()
    const { rows } = await sql<{ horizon: string }>`select pg_snapshot_xmin(pg_current_snapshot())::text as horizon`.execute(db)
    const horizon = BigInt(rows[0]!.horizon)
    // a horizon past now (another server's counter) is not taken: the row starts at most at now's
    const first = await createMissingReactionStream(db, { handler: 'made-late', now, from: String(horizon + 1_000_000n) })
    expect(first.created).toBe(true)
    expect(BigInt(first.position!)).toBeLessThanOrEqual(horizon + 10n)
    const second = await createMissingReactionStream(db, { handler: 'made-late', now, from: '1' })
    expect(second).toEqual({ created: false, position: null })
    const row = await db.selectFrom('reactionStreams').select(['position', 'historyId']).where('handler', '=', 'made-late').executeTakeFirstOrThrow()
    expect([String(row.position), String(row.historyId)]).toEqual([first.position, '0'])
    // an earlier horizon is taken as it is
    const earlier = await createMissingReactionStream(db, { handler: 'made-earlier', now, from: '5' })
    expect(earlier).toEqual({ created: true, position: '5' })
    // the start's own statement leaves a row made late as it is
    await ensureReactionStreams(db, ['made-late'], now)
    expect(String((await db.selectFrom('reactionStreams').select('position').where('handler', '=', 'made-late').executeTakeFirstOrThrow()).position)).toBe(first.position)
  })
})

describePostgres('a pg_restore of a dump without the stream rows under the running service (Postgres)', () => {
  const database = useTestDatabase()

  it('makes the row once the restore is whole, and hands over the transitions stored after it, none of the restored history again', async () => {
    const schema = new URL(database.url!).searchParams.get('options')!.replace('-c search_path=', '')
    const server = new URL(postgresUrl!)
    server.search = ''
    const { service, deliver, seen } = await startRecording(database)
    const directory = mkdtempSync(path.join(tmpdir(), 'stream-made-late-'))
    try {
      await createOrder(database.db, { externalReference: 'dumped' })
      await createOrder(database.db, { externalReference: 'after-restore' })
      expect(await deliver('dumped', 'funded')).toBe(200)
      await eventually(() => seen().length === 1, 'the first transition was handed over')
      const dump = path.join(directory, 'service.dump')
      execFileSync('pg_dump', ['--format=custom', `--schema=${schema}`, `--exclude-table-data=${schema}.reaction_streams`, `--file=${dump}`, server.toString()])

      await sql`drop schema ${sql.id(schema)} cascade`.execute(database.db)
      // (a row the service made while the restore loaded the tables would make it fail here, on the stream's key)
      execFileSync('pg_restore', [`--dbname=${server.toString()}`, dump])
      expect(await deliver('after-restore', 'funded')).toBe(200)
      await eventually(() => seen().includes('after-restore:funded'), 'the transition stored after the restore was handed over')
      expect(seen()).toEqual(['dumped:funded', 'after-restore:funded'])
      expect(await database.db.selectFrom('reactionStreams').select('handler').execute()).toEqual([{ handler: HANDLER }])
    } finally {
      await service.stop()
      rmSync(directory, { recursive: true, force: true })
    }
  })
})
