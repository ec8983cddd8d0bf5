// A transaction left open anywhere on the server holds every handler's stream back (the readable end is the
// snapshot's xmin): events committed after it began wait until it ends. Another application's transaction held
// every stream for minutes with nothing in the log to say why. The dispatcher now says so once the wait passes
// HELD_BACK_WARN_MS (here 200 ms), naming the oldest open transaction on the server, never its query.
// Only a transaction with an id holds a stream back (a snapshot's xmin is the oldest id still running), so the one
// named is the one with the oldest id: a session's, or a prepared transaction's; what a role without
// pg_read_all_stats cannot see of another role's session is said; a password in its application name is masked;
// and the end of a hold that was said is said too.
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { createDispatcher, type Dispatcher } from '../src/reactions/dispatcher.js'
import { ensureReactionStreams, oldestOpenTransaction } from '../src/reactions/reaction-stream.repository.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { logEntries, logLines, testLogger } from './helpers/log-sink.js'
import { moveNewOrder } from './helpers/orders.js'
import { TEST_DISPATCHER_SETTINGS } from './helpers/reaction-jobs.js'
import { eventually } from './helpers/reconcile-poller.js'
import { canRunOwnPostgres, startOwnPostgres } from './helpers/own-postgres.js'
import { createTestDatabase, describePostgres, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const MESSAGE = /^reaction stream held back: /

const MOVING = 'reaction stream moving again'
const PASSWORD = 'hunter2'

describePostgres('a stream held back by an open transaction (Postgres)', () => {
  let database: TestDatabase
  let dispatcher: Dispatcher | undefined
  const blocker = new pg.Client({ connectionString: postgresUrl, application_name: `DATABASE_URL=postgres://u:${PASSWORD}@h/db` })
  // a REPEATABLE READ session that only reads: a snapshot (backend_xmin), no id
  const reader = new pg.Client({ connectionString: postgresUrl, application_name: 'held-back-reader' })

  beforeAll(async () => {
    database = await createTestDatabase()
    await blocker.connect()
    await reader.connect()
  })
  afterAll(async () => {
    await dispatcher?.stop()
    await blocker.end()
    await reader.end()
    await database.close()
  })

  const startDispatcher = async (db: DatabaseHandle['db'], handler: string, handled: string[]) => {
    const reactions = createReactionRegistry().on('trade.*', handler, async (event) => {
      handled.push(event.eventId)
    })
    await ensureReactionStreams(db, reactions.names, new Date())
    return {
      reactions,
      start: async () => {
        dispatcher = createDispatcher({
          db,
          handler: reactions.handler,
          streams: reactions,
          clock: systemClock,
          logger: testLogger(),
          settings: { ...TEST_DISPATCHER_SETTINGS, heldBackWarnMs: 200 },
        })
        await dispatcher.start()
      },
    }
  }
  const warned = (handler: string) => logEntries().filter((entry) => MESSAGE.test(String(entry.msg)) && entry.handler === handler)
  const named = (entry: Record<string, unknown>) => entry.oldestTransaction as Record<string, unknown> | undefined

  it('names the session with the oldest transaction id, not an older snapshot; masks its password; says when the hold ends', async () => {
    const handled: string[] = []
    const { reactions, start } = await startDispatcher(database.db, 'recorder', handled)
    // the reader's transaction begins first: it was named, though it holds nothing back
    await reader.query('begin isolation level repeatable read')
    await reader.query('select 1')
    const readerPid = (await reader.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid
    // a transaction with an id of its own, open from before the transitions commit
    await blocker.query('begin')
    await blocker.query('select pg_current_xact_id()')
    const blockerPid = (await blocker.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid
    await moveNewOrder(database.db, { externalReference: 'held-back-1', statuses: ['created', 'funded'], handlersFor: reactions.handlersFor, now: () => new Date() })
    await start()

    // the oldest id on the whole server: the blocker's once an older one of a test running beside this one ended
    await eventually(() => warned('recorder').some((line) => named(line)?.pid === blockerPid), 'the blocker is named', 60_000)
    expect(handled).toEqual([])
    expect(warned('recorder').filter((line) => named(line)?.pid === readerPid)).toEqual([])
    const line = warned('recorder').find((entry) => named(entry)?.pid === blockerPid)!
    expect(named(line)).toEqual(
      expect.objectContaining({
        kind: 'session',
        pid: blockerPid,
        application: 'DATABASE_URL=postgres://u:***@h/db',
        state: 'idle in transaction',
        openForS: expect.any(Number),
        xidAge: expect.any(Number),
      }),
    )
    expect(line.heldForS).toEqual(expect.any(Number))
    expect(JSON.stringify(line)).not.toContain('pg_current_xact_id')
    expect(logLines.join('')).not.toContain(PASSWORD)

    await blocker.query('commit')
    await reader.query('commit')
    await eventually(() => handled.length === 2, 'the events are handed over once the transaction ended', 30_000)
    await eventually(() => logEntries().some((entry) => entry.msg === MOVING && entry.handler === 'recorder'), 'the end of the hold is said', 30_000)
    const moving = logEntries().filter((entry) => entry.msg === MOVING && entry.handler === 'recorder')
    expect(moving).toEqual([expect.objectContaining({ level: 30, handler: 'recorder', heldForS: expect.any(Number) })])
    await dispatcher?.stop()
    dispatcher = undefined
  })

  it("says the view is restricted, and names what it can see, when the service's role cannot read other roles' sessions", async () => {
    const role = `helper_rx_other_${randomBytes(4).toString('hex')}`
    const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(database.db)
    const schema = rows[0]!.schema
    const admin = new pg.Client({ connectionString: postgresUrl })
    await admin.connect()
    let restricted: DatabaseHandle | undefined
    try {
      // a role of its own, without pg_read_all_stats, that the service's connections take (SET ROLE)
      await admin.query(`create role ${role} nologin`)
      await admin.query(`grant usage on schema ${schema} to ${role}`)
      await admin.query(`grant all on all tables in schema ${schema} to ${role}`)
      await admin.query(`grant all on all sequences in schema ${schema} to ${role}`)
      const url = new URL(database.url!)
      url.searchParams.set('options', `${url.searchParams.get('options') ?? ''} -c role=${role}`)
      restricted = openDatabase({ databaseUrl: url.toString(), poolSize: 2 })
      const handled: string[] = []
      const { reactions, start } = await startDispatcher(restricted.db, 'restricted', handled)
      await blocker.query('begin')
      await blocker.query('select pg_current_xact_id()')
      const { pid: blockerPid, user: blockerUser } = (await blocker.query<{ pid: number; user: string }>('select pg_backend_pid() as pid, current_user as user')).rows[0]!
      await moveNewOrder(database.db, { externalReference: 'held-back-2', statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date() })
      await start()
      await eventually(() => warned('restricted').some((line) => named(line)?.pid === blockerPid), 'the blocker is named', 60_000)
      const line = warned('restricted').find((entry) => named(entry)?.pid === blockerPid)!
      expect(line.msg).toMatch(/pg_stat_activity hides other roles' sessions' state and age from the service's role: grant it pg_read_all_stats to see them$/)
      expect(named(line)).toEqual(
        expect.objectContaining({ kind: 'session', pid: blockerPid, user: blockerUser, database: expect.any(String), state: null, openForS: null, restricted: true, xidAge: expect.any(Number) }),
      )
      expect(named(line)!.application).toBe('DATABASE_URL=postgres://u:***@h/db')
      await blocker.query('commit')
      await eventually(() => handled.length === 1, 'the event is handed over once the transaction ended', 30_000)
    } finally {
      await dispatcher?.stop()
      dispatcher = undefined
      await blocker.query('rollback').catch(() => {})
      await restricted?.close()
      await admin.query(`drop owned by ${role}`)
      await admin.query(`drop role ${role}`)
      await admin.end()
    }
  })

  it('names a prepared transaction when its id is the oldest (its gid, database, owner, when prepared)', async () => {
    // max_prepared_transactions is 0 on many servers (the default), and a test must not change it: pg_prepared_xacts
    // is stood in for by a temporary view of the same name, which this session's lookups find first
    const single = openDatabase({ databaseUrl: database.url!, poolSize: 1 })
    try {
      await sql`create temporary view pg_prepared_xacts as
        select ((pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1) % 4294967296)::text::xid as transaction,
          'settlement-42'::text as gid, now() - interval '1 hour' as prepared, 'billing'::name as owner, 'ledger'::name as database`.execute(single.db)
      const oldest = await oldestOpenTransaction(single.db)
      expect(oldest).toEqual({
        kind: 'prepared',
        gid: 'settlement-42',
        database: 'ledger',
        owner: 'billing',
        preparedAt: expect.any(Date),
        openForS: expect.closeTo(3_600, 0),
        xidAge: expect.any(Number),
      })
    } finally {
      await single.close()
    }
  })

  // on a server of its own where the shared one has none (max_prepared_transactions 0, its default, and a change needs a
  // restart): a transaction prepared for real, as a two-phase commit of another application leaves it
  it('names a real prepared transaction that holds the streams back', async (context) => {
    const { rows } = await sql<{ setting: string }>`select current_setting('max_prepared_transactions') as setting`.execute(database.db)
    const shared = Number(rows[0]!.setting) > 0
    if (!shared && !canRunOwnPostgres) context.skip('max_prepared_transactions is 0 on this server, and no server of the test\'s own can run here')
    const own = shared ? undefined : await startOwnPostgres({ max_prepared_transactions: '4' })
    const target = own ? await createTestDatabase({ kind: 'postgres', serverUrl: own.url, poolSize: 4 }) : database
    const preparer = new pg.Client({ connectionString: own?.url ?? postgresUrl })
    await preparer.connect()
    const gid = `helper-rx-${randomBytes(4).toString('hex')}`
    try {
      const handled: string[] = []
      const { reactions, start } = await startDispatcher(target.db, 'prepared', handled)
      await preparer.query('begin')
      await preparer.query('select pg_current_xact_id()')
      await preparer.query(`prepare transaction '${gid}'`)
      try {
        await moveNewOrder(target.db, { externalReference: 'held-back-3', statuses: ['created'], handlersFor: reactions.handlersFor, now: () => new Date() })
        await start()
        await eventually(() => warned('prepared').some((line) => named(line)?.gid === gid), 'the prepared transaction is named', 60_000)
        expect(named(warned('prepared').find((line) => named(line)?.gid === gid)!)).toEqual(
          expect.objectContaining({ kind: 'prepared', gid, owner: 'root', preparedAt: expect.any(String), xidAge: expect.any(Number) }),
        )
        expect(handled).toEqual([])
      } finally {
        await preparer.query(`rollback prepared '${gid}'`)
      }
      await eventually(() => handled.length === 1, 'the event is handed over once it ended', 30_000)
    } finally {
      await dispatcher?.stop()
      dispatcher = undefined
      await preparer.end()
      if (own) {
        await target.close()
        await own.stop()
      }
    }
  })
})
