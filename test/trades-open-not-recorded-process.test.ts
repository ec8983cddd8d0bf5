// `trades open` stopped by signals once its create is answered with a trade of the order's own that the recording
// does not link: the order gone meanwhile (a row of another reference under its id), or its create taken over by
// another command (pending under another mark: the order is flagged trade_mismatch). The compiled CLI as its own
// process, on Postgres through DATABASE_URL and on embedded PGlite. The first signal said "the platform has answered:
// recording and printing its answer" of both, and the command then failed `[trade_not_recorded]`, exit 1, with no word
// of the signal. Now, until the recording has read the order under its lock, a signal says it is reading it, and from
// then on what it found and records; the command ends saying the stop, exit 130. And a third signal before the
// recording has decided, for an order linked to another trade meanwhile, no longer sends the operator to `trades link`
// alone, which that order refuses. An answer whose trade another order holds, which the recording finds only once it
// has applied the answer, is said as that, with the unknown mark (it was one of an "if" list that named every case).
// An answer that is the record of another order, before the recording has read the order, said "recording the mark of
// order R's create as unknown (…; should another trade have been linked …, the trade_mismatch flag instead)" of an
// order gone or whose create was taken over, of which the recording writes nothing, or the flag: now it says the
// recording reads the order to decide what to record (Postgres only, where the read can be held). A signal while the
// create is at the platform said it waited "to record and print" the answer, of which nothing is printed as a record
// when the order is gone or its create taken over: now "to record it and say what was recorded".
//
// What happens meanwhile is done by a trigger on the create's sent stamp (the write as the create leaves), as the test
// cannot write to an embedded database its command holds: one gives the order's row another reference (the order
// gone), one writes another mark after the stamp (another command's --retry taking the create over), one links the
// order to tr_linked (its first create's webhook). The recording is held:
// - after it has decided, at its write of the flag: on Postgres by a SHARE lock of the orders table, on PGlite by a
//   BEFORE UPDATE trigger that sleeps until the test lets it go (helpers/pglite-statement-hold.ts);
// - after it has found the trade another order's, at its unknown mark: on Postgres by a trigger waiting on an advisory
//   lock the test's session holds outside a transaction (a table lock would hold the answer's application too);
// - before it has decided, at its read of the order under its lock (SELECT … FOR UPDATE): on Postgres by an EXCLUSIVE
//   lock of the table, in a transaction with no transaction id. PGlite has no lock a test can hold, and a recording that
//   finds the order gone writes nothing to hold there: its signal comes while the create is at the platform.
import { type Kysely, sql } from 'kysely'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { describeEmbedded, endedAfterAll, startedCli } from './helpers/cli-process.js'
import { useHoldingPlatform } from './helpers/holding-platform.js'
import { ordersShareLock } from './helpers/orders-share-lock.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { holdStatementOnPglite, type StatementHold } from './helpers/pglite-statement-hold.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { FIRST_IN_FLIGHT, says } from './helpers/signals-in-flight.js'
import { stopThreeTimes } from './helpers/stop-three-times.js'
import { postgresUrl } from './helpers/test-database.js'

const platform = useHoldingPlatform()
const { children, cleanups } = endedAfterAll()

const openArgs = (ref: string) => ['trades', 'open', ref, '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1']

type Started = ReturnType<typeof startedCli>
type Ended = Awaited<ReturnType<Started['ended']>>

const ANOTHER_CTRL_C =
  '(another Ctrl-C ends the process now: before its COMMIT is sent, nothing of the answer is recorded; once it is sent, ' +
  'whether it was recorded is not known, and the line says where to look)'
const BEFORE_COMMIT =
  'was committed: the platform answered, and nothing of its answer was recorded (its transaction is rolled back, its COMMIT not sent)'
const STOPPED_NOT_RECORDED = 'stopped by a signal after the call: the platform’s answer is not recorded (above)\n'

/** The lines while the recording reads the order under its lock, before it has decided what it writes. */
const deciding = (ref: string) => `the platform has answered: reading order ${ref} to record its answer`
const decidingFirst = (ref: string) => `${deciding(ref)}, then saying what was recorded and stopping\n`
const decidingSecond = (ref: string) => `${deciding(ref)} ${ANOTHER_CTRL_C}\n`

const takenOver = (ref: string) => `the platform has answered, and order ${ref}'s create was taken over by another command`
const takenOverFirst = (ref: string) => `${takenOver(ref)}: recording the order's trade_mismatch flag and saying so, then stopping\n`

/** The first signal's line of an answer of another order while the recording reads the order, before it has decided. */
const otherDecidingFirst = (ref: string) =>
  'the call to the platform is over, and its outcome is not known (the platform may or may not have done it); its ' +
  `answer is the record of another order: reading order ${ref} to decide what to record, then saying what was recorded ` +
  `and stopping; \`orders show '${ref}'\` shows what the order records of its create; do not send the create again ` +
  'before checking the platform\n'

/** What the command says of an answer of another order that it does not record (the order gone, or its create taken over). */
// an answer of another order: no trade created for this one, none to link (it said "created trade tr_other for order R"
// and advised `trades link R tr_other`)
const otherNotRecorded = (ref: string, meanwhile: 'gone' | 'taken over', markedAt: Date | undefined) =>
  `The platform answered order ${ref}'s create with the record of another order (trade tr_other): whether the create ` +
  'made a trade for this order is not known, and nothing records it: ' +
  (meanwhile === 'gone'
    ? `there is no order ${ref} any more (deleted, or the database restored or failed over to a copy without it, while ` +
      `the create was at the platform). Look on the platform for a trade of reference ${ref}: its webhook links it once ` +
      `an order ${ref} exists again. Do not send the create again before checking there: \`trades open '${ref}'\` may ` +
      'make a second trade. [trade_not_recorded]\n'
    : `order ${ref}'s create is no longer this command's (its create state is now pending, marked at ` +
      `${markedAt!.toISOString()}: another command took it over, the database was restored or failed over to a copy ` +
      "from before the mark, or the row was changed by hand), so this command links nothing. The create that took it " +
      "over links the order's trade: the order is flagged trade_mismatch and polled no more. Check the order's trades " +
      `on the platform, cancel any not linked, then \`reconcile --requeue '${ref}'\`. [trade_not_recorded]\n`)

const goneFailure = (ref: string) =>
  `The platform created trade tr_gone for order ${ref}, but nothing records it: there is no order ${ref} any more ` +
  '(deleted, or the database restored or failed over to a copy without it, while the create was at the platform). Its ' +
  `webhook links the trade once an order ${ref} exists again; else link it then with \`trades link '${ref}' tr_gone\`. ` +
  `Check the platform before any retry: \`trades open '${ref}'\` would make a second trade. [trade_not_recorded]\n`

const takenOverFailure = (ref: string, markedAt: string) =>
  `The platform created trade tr_taken for order ${ref}, but nothing records it: order ${ref}'s create is no longer ` +
  `this command's (its create state is now pending, marked at ${markedAt}: another command took it over, the database ` +
  'was restored or failed over to a copy from before the mark, or the row was changed by hand), so this command links ' +
  'nothing. The create that took it over may make a second trade, and links it: the order is flagged trade_mismatch ' +
  'and polled no more. Check its trades on the platform, cancel the one not linked (this one, unless that create ' +
  `failed: then link this one with \`trades link '${ref}' tr_taken\`), then \`reconcile --requeue '${ref}'\`. ` +
  '[trade_not_recorded]\n'

/** A trigger that runs `body` (plpgsql) on order `ref`'s row as its create's sent stamp is written (its wait turned positive). */
async function atTheSentStamp(db: Kysely<Database>, ref: string, name: string, at: 'before' | 'after', body: string): Promise<void> {
  await sql`create function ${sql.id(name)}() returns trigger language plpgsql as $$ begin ${sql.raw(body)} end $$`.execute(db)
  await sql`create trigger ${sql.id(name)} ${sql.raw(at)} update on orders for each row
    when (new.external_reference = ${sql.lit(ref)} and old.trade_create_wait_ms < 0 and new.trade_create_wait_ms > 0)
    execute function ${sql.id(name)}()`.execute(db)
}

/** The order's row takes another reference as the create leaves: the order the create was sent for is gone. */
const goneMeanwhile = (db: Kysely<Database>, ref: string) =>
  atTheSentStamp(db, ref, 'test_gone_meanwhile', 'before', `new.external_reference := '${ref} (another)'; return new;`)

/**
 * Once the sent stamp is written (and returned to the command as its mark: an after trigger's write comes after the
 * statement's RETURNING), another mark a second later: another command's --retry that took the create over.
 */
const takenOverMeanwhile = (db: Kysely<Database>, ref: string) =>
  atTheSentStamp(db, ref, 'test_taken_over_meanwhile', 'after', "update orders set updated_at = new.updated_at + interval '1 second' where id = new.id; return null;")

/** The order linked to tr_linked as the create leaves: its first create's webhook. */
const linkedMeanwhile = (db: Kysely<Database>, ref: string) =>
  atTheSentStamp(
    db,
    ref,
    'test_linked_meanwhile',
    'before',
    "new.trade_id := 'tr_linked'; new.trade_status := 'created'; new.trade_reference := 'TRD-LINKED'; return new;",
  )

/** The database, with another order already linked to tr_elsewhere (a trade the platform may answer a create with). */
function seeded(kind: 'pglite' | 'postgres'): Promise<{ env: Record<string, string>; read: Reader }> {
  const seed = (db: Kysely<Database>) => insertOrders(db, [{ externalReference: 'elsewhere', tradeId: 'tr_elsewhere', tradeStatus: 'created' }])
  return seededCliDatabase(kind, { prefix: 'trades-open-not-recorded-', env: { PARTNER_API_BASE_URL: platform.url }, seed, cleanups })
}

const ELSEWHERE_REF = 'trade elsewhere'
/** What the order's unknown mark is held by, on PGlite (the condition on the new row) and Postgres (a trigger's). */
const ELSEWHERE_MARK = `new.external_reference = '${ELSEWHERE_REF}' and new.trade_create_state = 'unknown'`

/**
 * The answer is the order's own reference with a trade another order holds: the recording finds it only once it has
 * applied the answer, then marks the create unknown. One signal while that mark is held, then `release`.
 */
async function expectTheTradeElsewhere(ended: Ended, read: Reader): Promise<void> {
  const ref = ELSEWHERE_REF
  expectStopped(
    ended,
    `the platform has answered, and trade tr_elsewhere is another order's: recording the mark of order ${ref}'s create ` +
      'as unknown and saying so, then stopping\n' +
      `The platform answered for order ${ref} (a trade create) with the record of trade tr_elsewhere for external ` +
      `reference ${ref}: another trade or order. Nothing was linked, and whether the create made a trade is not known: ` +
      'it is marked unknown; check the platform, then send it again only on purpose with --retry. [answer_mismatch]\n' +
      'stopped by a signal during the call, whose answer was not the record it was sent for: its outcome is not known (above)\n',
  )
  expect(await read((db) => findOrderByExternalReference(db, ref))).toMatchObject({ tradeId: null, tradeCreateState: 'unknown' })
}

const NOT_RECORDED_LOG = "trade created on the platform but not recorded: the order is gone or its create is no longer this command's; nothing links the trade"
// the answer another order's record: no trade of this order's was made that anyone knows of
const OTHER_NOT_RECORDED_LOG =
  "trade create answered with another order's record, not recorded: the order is gone or its create is no longer this command's; what the create did is not known"

/**
 * Ended by the signals with `stderr`, exit 130, nothing printed. An answer nothing records is logged at error level
 * too (the CLI's one log level), as one JSON line among the command's lines: `logged` says whether it was, and
 * `loggedMsg` with what words.
 */
function expectStopped(ended: Ended, stderr: string, { logged = false, loggedMsg = NOT_RECORDED_LOG } = {}): void {
  expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
  expect(ended.stdout).toBe('')
  const lines = ended.stderr.split(/(?<=\n)/)
  const logLines = lines.filter((line) => line.startsWith('{'))
  expect(lines.filter((line) => !line.startsWith('{')).join('')).toBe(stderr)
  expect(logLines.map((line) => (JSON.parse(line) as { msg: string }).msg)).toEqual(logged ? [loggedMsg] : [])
}

/** One signal once the recording is held, then `release`; how the command ended. */
async function oneSignal(command: Started, release: () => Promise<void> | void): Promise<Ended> {
  command.child.kill('SIGINT')
  // its line whole, whatever it says (the test compares it)
  await says(command, '\n')
  await release()
  return command.ended()
}

type Mode = 'one signal' | 'three signals'
const MODES: Mode[] = ['one signal', 'three signals']

/** How a test holds the recording: taken before the answer (a table lock), waited on once answered, let go. */
interface RecordingHold {
  take?: () => Promise<void>
  waitedOn: (command: Started) => Promise<unknown>
  release: () => Promise<void> | void
}

/** The command, whose statements no statement timeout ends while the test holds one: only the signals stop it. */
const heldCommand = (ref: string, env: Record<string, string>) => startedCli(openArgs(ref), { ...env, DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }, children)

/**
 * The create at the platform answered with `trade`, the recording held, then one signal (the hold let go once its
 * line is out) or three; how the command ended.
 */
async function answeredWhileHeld(
  command: Started,
  ref: string,
  trade: { trade_id: string; external_reference: string },
  hold: RecordingHold,
  mode: Mode = 'one signal',
): Promise<Ended> {
  try {
    const request = await platform.requestOf(command, ref)
    await hold.take?.()
    request.respond(200, tradeRecord(trade))
    await hold.waitedOn(command)
    if (mode === 'one signal') return await oneSignal(command, hold.release)
    await stopThreeTimes(command)
    return await command.ended()
  } finally {
    if (!command.closed()) command.child.kill('SIGKILL')
    await hold.release()
  }
}

/** Postgres: the orders table locked from before the answer (SHARE holds the flag; EXCLUSIVE the read of the order). */
async function tableLock(env: Record<string, string>, read: Reader, waits: string, mode?: 'exclusive'): Promise<RecordingHold> {
  const lock = await ordersShareLock(env.DATABASE_URL!, read, mode ? { mode } : undefined)
  cleanups.unshift(() => lock.end())
  return {
    take: () => lock.take(),
    waitedOn: (command) => lock.waitedOn(waits, () => (command.closed() ? command.stderr() : undefined)),
    release: () => lock.release(),
  }
}

/** PGlite: a trigger that sleeps until let go (holdStatementOnPglite). */
function triggerHold(held: StatementHold, runs: string): RecordingHold {
  return {
    waitedOn: (command) =>
      eventually(() => {
        if (command.closed()) throw new Error(`the command ended before ${runs}: ${command.stderr()}`)
        return held.held()
      }, runs, 120_000),
    release: () => held.release(),
  }
}

/** A signal while the create is at the platform, the order gone or its create taken over meanwhile (both databases). */
function signalledInFlight(kind: 'pglite' | 'postgres'): void {
  it('the order gone meanwhile, one signal while the create is at the platform: the failure, then the stop; exit 130', async () => {
    const ref = 'gone in flight'
    const { env, read } = await seeded(kind)
    await read((db) => goneMeanwhile(db, ref))
    const ended = await answeredInFlight(startedCli(openArgs(ref), env, children), ref, 'tr_gone')
    expectStopped(ended, FIRST_IN_FLIGHT + goneFailure(ref) + STOPPED_NOT_RECORDED, { logged: true })
    expect(await read((db) => findOrderByExternalReference(db, ref))).toBeUndefined()
  })

  it('its create taken over meanwhile, one signal while the create is at the platform: the line promises no print; the failure, then the stop; exit 130', async () => {
    const ref = 'taken over in flight'
    const { env, read } = await seeded(kind)
    await read((db) => takenOverMeanwhile(db, ref))
    const ended = await answeredInFlight(startedCli(openArgs(ref), env, children), ref, 'tr_taken')
    const order = await read((db) => findOrderByExternalReference(db, ref))
    expectStopped(ended, FIRST_IN_FLIGHT + takenOverFailure(ref, order!.updatedAt.toISOString()) + STOPPED_NOT_RECORDED, { logged: true })
    expect(order).toMatchObject({ tradeId: null, tradeCreateState: 'pending', attention: 'trade_mismatch' })
  })
}

/** One signal while the create is at the platform, then its answer (a trade of the order's own); how it ended. */
async function answeredInFlight(command: Started, ref: string, tradeId: string): Promise<Ended> {
  try {
    const request = await platform.requestOf(command, ref)
    command.child.kill('SIGINT')
    await says(command, FIRST_IN_FLIGHT)
    request.respond(200, tradeRecord({ trade_id: tradeId, external_reference: ref }))
    return await command.ended()
  } finally {
    if (!command.closed()) command.child.kill('SIGKILL')
  }
}

/** What the signals say of a create taken over, its recording held at the flag, and what the order records. */
async function expectTakenOver(ended: Ended, mode: Mode, ref: string, read: Reader): Promise<void> {
  const order = await read((db) => findOrderByExternalReference(db, ref))
  if (mode === 'three signals') {
    expectStopped(
      ended,
      takenOverFirst(ref) +
        `${takenOver(ref)}: recording the order's trade_mismatch flag ${ANOTHER_CTRL_C}\n` +
        `Stopped by a third signal before the record of trade tr_taken, created by the platform for order ${ref} ` +
        `${BEFORE_COMMIT}; \`orders show '${ref}'\` shows the other command's create (and the trade_mismatch flag, if ` +
        "recorded): check the order's trades on the platform, cancel the one not linked (tr_taken, unless that create " +
        `failed: then link it with \`trades link '${ref}' tr_taken\`), then \`reconcile --requeue '${ref}'\` if the order ` +
        'is flagged [stopped]\n',
    )
    return
  }
  expectStopped(ended, takenOverFirst(ref) + takenOverFailure(ref, order!.updatedAt.toISOString()) + STOPPED_NOT_RECORDED, { logged: true })
  // what the recording writes, as without the signal: the flag, the other command's mark left as it is
  expect(order).toMatchObject({ tradeId: null, tradeCreateState: 'pending', attention: 'trade_mismatch', nextPollAt: null })
}

const READ_WAITS = 'the read of the order waits on the lock'
const ANOTHER_ORDERS = { trade_id: 'tr_other', external_reference: 'someone else' }

describe.skipIf(!postgresUrl)('trades open answered with its own trade, which the recording does not link, stopped by signals (Postgres)', () => {
  for (const mode of MODES) {
    it(`its create taken over meanwhile, ${mode} while the flag is written: the lines name the take-over and the flag; exit 130`, async () => {
      const ref = `taken over ${mode === 'one signal' ? 'one' : 'three'}`
      const { env, read } = await seeded('postgres')
      await read((db) => takenOverMeanwhile(db, ref))
      const hold = await tableLock(env, read, 'the flag waits on the lock')
      const ended = await answeredWhileHeld(heldCommand(ref, env), ref, { trade_id: 'tr_taken', external_reference: ref }, hold, mode)
      await expectTakenOver(ended, mode, ref, read)
    })
  }

  it('the order gone meanwhile, one signal while the recording waits to read it: the line says it reads the order; the failure, then the stop; exit 130', async () => {
    const ref = 'gone held'
    const { env, read } = await seeded('postgres')
    await read((db) => goneMeanwhile(db, ref))
    const hold = await tableLock(env, read, READ_WAITS, 'exclusive')
    const ended = await answeredWhileHeld(heldCommand(ref, env), ref, { trade_id: 'tr_gone', external_reference: ref }, hold)
    expectStopped(ended, decidingFirst(ref) + goneFailure(ref) + STOPPED_NOT_RECORDED, { logged: true })
    expect(await read((db) => findOrderByExternalReference(db, ref))).toBeUndefined()
  })

  signalledInFlight('postgres')

  for (const meanwhile of ['gone', 'taken over'] as const) {
    it(`answered with the record of another order, the order ${meanwhile} meanwhile, one signal while the recording waits to read it: the line says it reads the order to decide, never "recording the mark"; exit 130`, async () => {
      const ref = `other ${meanwhile}`
      const { env, read } = await seeded('postgres')
      await read((db) => (meanwhile === 'gone' ? goneMeanwhile(db, ref) : takenOverMeanwhile(db, ref)))
      const hold = await tableLock(env, read, READ_WAITS, 'exclusive')
      const ended = await answeredWhileHeld(heldCommand(ref, env), ref, ANOTHER_ORDERS, hold)
      const order = await read((db) => findOrderByExternalReference(db, ref))
      expectStopped(ended, otherDecidingFirst(ref) + otherNotRecorded(ref, meanwhile, order?.updatedAt) + STOPPED_NOT_RECORDED, {
        logged: true,
        loggedMsg: OTHER_NOT_RECORDED_LOG,
      })
      // what the recording writes, as without the signal: nothing of an order gone; the flag, the other command's mark
      // left as it is, of one taken over
      if (meanwhile === 'gone') expect(order).toBeUndefined()
      else expect(order).toMatchObject({ tradeId: null, tradeCreateState: 'pending', attention: 'trade_mismatch' })
    })
  }

  it('answered with the record of another order, the order gone meanwhile, three signals while the recording waits to read it: the lines say it reads the order to decide; the third that nothing was recorded; exit 130', async () => {
    const ref = 'other gone three'
    const { env, read } = await seeded('postgres')
    await read((db) => goneMeanwhile(db, ref))
    const hold = await tableLock(env, read, READ_WAITS, 'exclusive')
    expectStopped(
      await answeredWhileHeld(heldCommand(ref, env), ref, ANOTHER_ORDERS, hold, 'three signals'),
      otherDecidingFirst(ref) +
        'the call to the platform is over, and its outcome is not known (the platform may or may not have done it); its ' +
        `answer is the record of another order: reading order ${ref} to decide what to record (another Ctrl-C ends the ` +
        'process now, and says what it leaves)\n' +
        `Stopped by a third signal before the record of the answer to order ${ref}'s create (trade tr_other, another ` +
        `order's) ${BEFORE_COMMIT}; \`orders show '${ref}'\` shows what the order records of its create; do not send the ` +
        'create again before checking the platform [stopped]\n',
    )
    // the order's row, under another reference, as the trigger left it: nothing of the answer recorded
    expect(await read((db) => findOrderByExternalReference(db, `${ref} (another)`))).toMatchObject({ tradeCreateState: 'pending', attention: null })
  })

  it('linked to another trade meanwhile, three signals while the recording waits to read the order: the third names the other trade’s case, not only `trades link`; exit 130', async () => {
    const ref = 'linked held'
    const { env, read } = await seeded('postgres')
    await read((db) => linkedMeanwhile(db, ref))
    const hold = await tableLock(env, read, READ_WAITS, 'exclusive')
    expectStopped(
      await answeredWhileHeld(heldCommand(ref, env), ref, { trade_id: 'tr_second', external_reference: ref }, hold, 'three signals'),
      decidingFirst(ref) +
        decidingSecond(ref) +
        `Stopped by a third signal before the record of trade tr_second, created by the platform for order ${ref} ` +
        `${BEFORE_COMMIT}; \`orders show '${ref}'\` says whether the order has the trade; if it has none, \`trades link ` +
        `'${ref}' tr_second\` links it (never \`trades open --retry\`: it would make a second trade); if it has another, ` +
        'the platform may hold two trades for it: cancel the one not linked [stopped]\n',
    )
    // nothing of the answer recorded: the order keeps the trade linked meanwhile, which `trades link` would not replace
    expect(await read((db) => findOrderByExternalReference(db, ref))).toMatchObject({ tradeId: 'tr_linked', attention: null })
  })

  it('its trade another order’s, one signal while the unknown mark is written: the line names that and the mark; exit 130', async () => {
    const key = 47_151
    const { env, read } = await seeded('postgres')
    // a table lock would hold the answer's application too, before the recording has found the trade elsewhere: the
    // mark alone waits, in a trigger, on an advisory lock the test's session holds outside a transaction (no transaction id)
    const holder = new pg.Client({ connectionString: env.DATABASE_URL! })
    await holder.connect()
    cleanups.unshift(() => holder.end())
    const holderPid = Number((await holder.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid)
    await holder.query(`create function test_hold_mark() returns trigger language plpgsql as $$ begin perform pg_advisory_xact_lock(${key}); return new; end $$`)
    await holder.query(`create trigger test_hold_mark before update on orders for each row when (${ELSEWHERE_MARK}) execute function test_hold_mark()`)
    await holder.query('select pg_advisory_lock($1::bigint)', [key])
    let released = false
    const hold: RecordingHold = {
      waitedOn: (command) =>
        eventually(async () => {
          if (command.closed()) throw new Error(`the command ended before its mark waited: ${command.stderr()}`)
          const { rows } = await read((db) =>
            sql<{ waiting: number }>`select count(*)::int as waiting from pg_stat_activity where ${holderPid}::int = any(pg_blocking_pids(pid))`.execute(db),
          )
          return rows[0]!.waiting > 0
        }, 'the unknown mark waits on the lock', 120_000),
      release: async () => {
        if (released) return
        released = true
        await holder.query('select pg_advisory_unlock_all()')
      },
    }
    const ended = await answeredWhileHeld(heldCommand(ELSEWHERE_REF, env), ELSEWHERE_REF, { trade_id: 'tr_elsewhere', external_reference: ELSEWHERE_REF }, hold)
    await expectTheTradeElsewhere(ended, read)
  })
})

describeEmbedded('trades open answered with its own trade, which the recording does not link, stopped by signals (embedded PGlite)', () => {
  for (const mode of MODES) {
    it(`its create taken over meanwhile, ${mode} while the flag is written: the lines name the take-over and the flag; exit 130`, async () => {
      const ref = `taken over ${mode === 'one signal' ? 'one' : 'three'}`
      const { env, read } = await seeded('pglite')
      await read((db) => takenOverMeanwhile(db, ref))
      const held = await read((db) =>
        holdStatementOnPglite(db, env.DATA_DIR!, {
          name: 'test_hold_flag',
          table: 'orders',
          when: `new.external_reference = '${ref}' and new.attention = 'trade_mismatch'`,
          at: 'before update',
        }),
      )
      const command = startedCli(openArgs(ref), env, children)
      const ended = await answeredWhileHeld(command, ref, { trade_id: 'tr_taken', external_reference: ref }, triggerHold(held, 'the flag runs the trigger'), mode)
      await expectTakenOver(ended, mode, ref, read)
    })
  }

  signalledInFlight('pglite')

  it('its trade another order’s, one signal while the unknown mark is written: the line names that and the mark; exit 130', async () => {
    const { env, read } = await seeded('pglite')
    const held = await read((db) => holdStatementOnPglite(db, env.DATA_DIR!, { name: 'test_hold_mark', table: 'orders', when: ELSEWHERE_MARK, at: 'before update' }))
    const command = startedCli(openArgs(ELSEWHERE_REF), env, children)
    const hold = triggerHold(held, 'the mark runs the trigger')
    const ended = await answeredWhileHeld(command, ELSEWHERE_REF, { trade_id: 'tr_elsewhere', external_reference: ELSEWHERE_REF }, hold)
    await expectTheTradeElsewhere(ended, read)
  })
})
