// Embedded PGlite on its own thread (src/db/pglite-thread.ts): what crosses between the threads comes back
// as PGlite gave it (rows, errors with their SQLSTATE, notifications, a dump), transactions commit or roll
// back as Kysely's dialect asks, the serving thread runs while the database works, and a thread that stops
// fails every statement as "unavailable" instead of leaving it waiting.
import { setTimeout as delay } from 'node:timers/promises'
import { Kysely, PGliteDialect, sql } from 'kysely'
import { afterEach, describe, expect, it } from 'vitest'
import { describeDatabaseError } from '../src/db/database-errors.js'
import { PgliteThread } from '../src/db/pglite-thread.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { pgliteTemplate } from './helpers/test-database.js'

const open: PgliteThread[] = []
// every thread starts from the suite's initialised cluster, as a test database does: an initdb of its own cost
// each test 8-15 s of a core
function start(options: Partial<ConstructorParameters<typeof PgliteThread>[0]> = {}): PgliteThread {
  const thread = new PgliteThread({ location: 'memory://', startParams: [], template: pgliteTemplate(false), ...options })
  open.push(thread)
  return thread
}

afterEach(async () => {
  await Promise.all(open.splice(0).map((thread) => thread.close().catch(() => {})))
})

describe('PGlite on its own thread', () => {
  it('gives rows back with their types, and errors with their SQLSTATE and fields', async () => {
    const db = start()
    const { rows } = await db.query<{ n: number; at: Date; doc: unknown; big: string }>(
      `select 1 as n, timestamptz '2026-01-02 03:04:05+00' as at, '{"a":[1,"b"]}'::jsonb as doc, 9007199254740993::int8::text as big`,
      [],
      { rowMode: 'object' },
    )
    expect(rows).toEqual([{ n: 1, at: new Date('2026-01-02T03:04:05Z'), doc: { a: [1, 'b'] }, big: '9007199254740993' }])

    await db.query('create table t (id text primary key)')
    await db.query('insert into t values ($1)', ['a'])
    const duplicate = await db.query('insert into t values ($1)', ['a']).catch((error: unknown) => error)
    expect(duplicate).toBeInstanceOf(Error)
    expect(duplicate).toMatchObject({ code: '23505', severity: 'ERROR', table: 't', constraint: 't_pkey' })
    expect(describeDatabaseError(duplicate).kind).toBe('refused_data')
    const refused = await db.query('select $1::int', ['not a number']).catch((error: unknown) => error)
    expect(describeDatabaseError(refused)).toMatchObject({ kind: 'refused_data', code: '22P02' })
  })

  it('commits a transaction whose callback resolves, rolls back one that throws, and runs other statements after it', async () => {
    const db = start()
    await db.query('create table t (id int)')
    await db.transaction(async (tx) => {
      await tx.query('insert into t values (1)')
    })
    const failed = db.transaction(async (tx) => {
      await tx.query('insert into t values (2)')
      throw new Error('changed my mind')
    })
    await expect(failed).rejects.toThrow('changed my mind')
    await db.transaction(async (tx) => {
      await tx.query('insert into t values (3)')
      await tx.rollback()
    })
    // a statement sent while a transaction is open waits for its end: it sees the committed row
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    const open = db.transaction(async (tx) => {
      await tx.query('insert into t values (4)')
      await held
    })
    await delay(20)
    const outside = db.query<{ ids: number[] }>('select array_agg(id order by id) as ids from t', [], { rowMode: 'object' })
    release()
    await open
    expect((await outside).rows[0]!.ids).toEqual([1, 4])
  })

  it('delivers notifications until unlistened, and starts a second thread from a dump of the first', async () => {
    const db = start()
    const payloads: string[] = []
    const unlisten = await db.listen('wake', (payload) => payloads.push(payload))
    await db.query(`select pg_notify('wake', 'one')`)
    await expect.poll(() => payloads).toEqual(['one'])
    await unlisten()
    await db.query(`select pg_notify('wake', 'two')`)
    await db.query('select 1')
    expect(payloads).toEqual(['one'])

    await db.query('create table kept (v text)')
    await db.query(`insert into kept values ('from the dump')`)
    const copy = start({ template: await db.dumpDataDir() })
    const { rows } = await copy.query('select v from kept', [], { rowMode: 'object' })
    expect(rows).toEqual([{ v: 'from the dump' }])
  })

  it('refuses a value that cannot be copied to the thread, and goes on serving', async () => {
    const db = start()
    await expect(db.query('select $1::text', [() => 'a function'])).rejects.toThrow(/could not be cloned/)
    const { rows } = await db.query('select 2 as n', [], { rowMode: 'object' })
    expect(rows).toEqual([{ n: 2 }])
  })

  it('collects its garbage on request, keeping its data and open transactions, and refuses once closed', async () => {
    const db = start()
    await db.query('create table t (id int)')
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    const open = db.transaction(async (tx) => {
      await tx.query('insert into t values (1)')
      await held
      await tx.query('insert into t values (2)')
    })
    await db.collectGarbage()
    release()
    await open
    expect((await db.query<{ n: number }>('select count(*)::int as n from t', [], { rowMode: 'object' })).rows).toEqual([{ n: 2 }])
    await db.close()
    await expect(db.collectGarbage()).rejects.toThrow('PGlite is closed')
  })

  it('fails a Kysely transaction begun as it closes with the reason, its first statement’s error, leaving nothing unhandled', async () => {
    const thread = start()
    await thread.waitReady
    const db = new Kysely<Record<string, never>>({ dialect: new PGliteDialect({ pglite: thread }) })
    const unhandled: unknown[] = []
    const onUnhandled = (reason: unknown) => unhandled.push(reason)
    process.on('unhandledRejection', onUnhandled)
    try {
      // in use (Kysely's connection made), then closed: as the stop of a service still migrating finds it
      await sql`select 1`.execute(db)
      await thread.close()
      // Kysely's dialect waits for the transaction's callback to start: before, a begin that failed left that wait
      // unanswered and its own rejection unhandled (the stop of a `serve` still migrating crashed on it)
      const statements: string[] = []
      const outcome = await db
        .transaction()
        .execute(async (trx) => {
          statements.push('first')
          await sql`select 1`.execute(trx)
          statements.push('after')
        })
        .catch((error: unknown) => error)
      expect(outcome).toBeInstanceOf(Error)
      expect((outcome as Error).message).toBe('PGlite is closed')
      expect(statements).toEqual(['first'])
      await new Promise((resolve) => setImmediate(resolve))
      expect(unhandled).toEqual([])
    } finally {
      process.off('unhandledRejection', onUnhandled)
    }
  })

  it('keeps the serving thread free while a statement runs', async () => {
    const db = start()
    await db.waitReady
    const order: string[] = []
    const sleeping = db.query('select pg_sleep(1)').then(() => order.push('statement'))
    await delay(1)
    order.push('timer')
    await sleeping
    // on the serving thread, PGlite's WebAssembly would have held the timer until the statement ended
    expect(order).toEqual(['timer', 'statement'])
  })

  it('fails the statement in flight and every later one as unavailable when the thread stops, and logs it once', async () => {
    const logger = testLogger()
    const db = start({ script: new URL('./helpers/stopping-pglite-worker.mjs', import.meta.url), logger })
    await db.waitReady
    const inFlight = await db.query('select 1').catch((error: unknown) => error)
    expect(inFlight).toBeInstanceOf(Error)
    expect((inFlight as Error).message).toMatch(/^PGlite is closed: the embedded database's thread exited with code 7/)
    expect(describeDatabaseError(inFlight).kind).toBe('unavailable')
    const later = await db.query('select 1').catch((error: unknown) => error)
    expect(describeDatabaseError(later).kind).toBe('unavailable')
    expect(db.closed).toBe(true)
    await db.close()
    const stops = logEntries().filter((entry) => entry.msg === 'the embedded database stopped')
    expect(stops).toHaveLength(1)
    expect(stops[0]).toMatchObject({ level: 50, reason: 'exited with code 7' })
  })

  it('runs under a watch mode that posts its own messages on the same channel', async () => {
    const db = start({ script: new URL('./helpers/watched-pglite-worker.mjs', import.meta.url) })
    await db.waitReady
    const { rows } = await db.query<{ n: number }>('select 1 as n', [], { rowMode: 'object' })
    expect(rows).toEqual([{ n: 1 }])
    expect(db.closed).toBe(false)
  })

  it('rejects the start when the template is not a data directory, and every call after it with the same reason', async () => {
    const db = start({ template: new Blob(['not a tarball']) })
    await expect(db.waitReady).rejects.toThrow('PGlite failed to initialize properly')
    await expect(db.query('select 1')).rejects.toThrow('PGlite failed to initialize properly')
    expect(db.closed).toBe(true)
    await db.close()
  })
})
