// A trade call (`trades fund`) stopped by a third signal while the COMMIT that records the platform's answer waits
// for its own answer: the compiled CLI as its own process, against the sandbox platform (which drops every webhook),
// on Postgres through DATABASE_URL and on embedded PGlite. Once the platform has answered, the first signal says the
// answer is being recorded and the second that a third ends the process; the third ended it at once, killed by the
// signal and without a word, though the record of the answer may or may not have been made. Now it says so, and where
// to look, exit 130.
//
// The COMMIT is held by a deferred constraint trigger on the order's row, run at COMMIT:
// - on Postgres it waits on an advisory lock the test's session holds as a session lock, taken outside a transaction
//   (no transaction id of the test's); the test sees the COMMIT wait in pg_stat_activity;
// - on PGlite (Postgres in a worker thread of the command's process: src/db/pglite-thread.ts) it writes a file into
//   the data directory, which the test waits for, then sleeps until the test writes another there
//   (helpers/pglite-statement-hold.ts): the worker is held in the COMMIT while the main thread takes the signals. The process ends with the COMMIT unfinished, so on PGlite
//   the record is not made (the line says it may or may not be: the end of the process may come before or after it).
import { type Kysely, sql } from 'kysely'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { seededCliDatabase } from './helpers/cli-database.js'
import { describeEmbedded, startedCli } from './helpers/cli-process.js'
import { useDroppingSandbox } from './helpers/dropping-sandbox.js'
import { eventually } from './helpers/reconcile-poller.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { holdStatementOnPglite } from './helpers/pglite-statement-hold.js'
import { stopThreeTimes } from './helpers/stop-three-times.js'
import { ordersShareLock } from './helpers/orders-share-lock.js'
import { postgresUrl } from './helpers/test-database.js'

const sandbox = useDroppingSandbox()
const { children, cleanups } = sandbox

/** An order linked to a trade of the sandbox, created and not funded, and the environment of a CLI run on it. */
async function seeded(kind: 'pglite' | 'postgres', ref: string) {
  const { trade_id: tradeId } = await sandbox.client.createTrade({ title: 'Used bicycle', amount: '120.00', currency: 'EUR', seller_id: 's_1', external_reference: ref })
  const seed = (db: Kysely<Database>) => insertOrders(db, [{ externalReference: ref, tradeId, tradeStatus: 'created', nextPollAt: new Date(Date.now() + 86_400_000) }])
  const { env, read } = await seededCliDatabase(kind, { prefix: 'trades-commit-', env: { PARTNER_API_BASE_URL: sandbox.url }, seed, cleanups })
  return { env, read, tradeId }
}

function expectTheLine(ended: { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }, ref: string, tradeId: string) {
  expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
  expect(ended.stdout).toBe('')
  expect(ended.stderr).toBe(
    'the platform has answered: recording and printing its answer, then stopping\n' +
      'the platform has answered: recording its answer (another Ctrl-C ends the process now: before its COMMIT is sent, ' +
      'nothing of the answer is recorded; once it is sent, whether it was recorded is not known, and the line says where to look)\n' +
      `Stopped by a third signal while the record of the platform's answer to the fund call on trade ${tradeId} for order ${ref} ` +
      'was being committed: the platform answered, and the record may or may not have been made (its COMMIT was sent and ' +
      `not yet answered; on Postgres the database finishes it without this process); \`orders show '${ref}'\` shows what ` +
      `the order records, and \`trades get '${ref}'\` the platform's record (the poller brings the order to it); do not ` +
      'send the call again: the platform did it [stopped]\n',
  )
}

describe.skipIf(!postgresUrl)('the compiled trades fund stopped by a third signal while its answer’s COMMIT waits (Postgres)', () => {
  it('says the record may or may not have been made and where to look, exit 130 [stopped]; it is, once the COMMIT goes', async () => {
    const ref = 'fund committing'
    const key = 47_131
    const { env, read, tradeId } = await seeded('postgres', ref)
    const holder = new pg.Client({ connectionString: env.DATABASE_URL! })
    await holder.connect()
    cleanups.unshift(() => holder.end())
    const holderPid = Number((await holder.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid)
    await holder.query(
      `create function test_hold_commit() returns trigger language plpgsql as $$ begin perform pg_advisory_xact_lock(${key}); return null; end $$`,
    )
    await holder.query(
      'create constraint trigger test_hold_commit after update on orders deferrable initially deferred for each row ' +
        `when (new.external_reference = '${ref}') execute function test_hold_commit()`,
    )
    await holder.query('select pg_advisory_lock($1::bigint)', [key])
    // seen from another session: a session's own look at pg_stat_activity holds a snapshot while it runs
    const { rows: horizon } = await read((db) => sql`select backend_xid as xid, backend_xmin as xmin from pg_stat_activity where pid = ${holderPid}::int`.execute(db))
    expect(horizon).toEqual([{ xid: null, xmin: null }])
    // no statement of the command's ends at its statement timeout while the test holds it: only the signals stop it
    const command = startedCli(['trades', 'fund', ref], { ...env, DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }, children)
    try {
      await eventually(async () => {
        if (command.closed()) throw new Error(`the command ended before its COMMIT waited: ${command.stderr()}`)
        const { rows } = await read((db) =>
          sql<{ waiting: number }>`select count(*)::int as waiting from pg_stat_activity where ${holderPid}::int = any(pg_blocking_pids(pid)) and query = 'commit'`.execute(db),
        )
        return rows[0]!.waiting > 0
      }, 'the record’s COMMIT waits on the lock', 120_000)
      await stopThreeTimes(command)
    } finally {
      if (!command.closed()) command.child.kill('SIGKILL')
      await holder.query('select pg_advisory_unlock($1::bigint)', [key])
    }
    expectTheLine(await command.ended(), ref, tradeId)
    // the COMMIT went on without the process
    await eventually(async () => (await read((db) => findOrderByExternalReference(db, ref)))?.tradeStatus === 'funded', 'the answer is recorded once the lock goes', 120_000)
    await holder.query('drop trigger test_hold_commit on orders')
    await holder.query('drop function test_hold_commit()')
  })
})

// Before the COMMIT is sent, the end of the process rolls the recording back: said so, not "may or may not". The
// recording's UPDATE waits on a SHARE lock of the orders table the test holds in a transaction with no transaction id.
describe.skipIf(!postgresUrl)('the compiled trades fund stopped by a third signal before its answer’s COMMIT is sent (Postgres)', () => {
  it('says nothing of the answer was recorded and where to look, exit 130 [stopped]; nothing is, once the lock goes', async () => {
    const ref = 'fund before commit'
    const { env, read, tradeId } = await seeded('postgres', ref)
    const lock = await ordersShareLock(env.DATABASE_URL!, read)
    cleanups.unshift(() => lock.end())
    await lock.take()
    const command = startedCli(['trades', 'fund', ref], { ...env, DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }, children)
    try {
      await lock.waitedOn('the recording waits on the lock', () => (command.closed() ? command.stderr() : undefined))
      await stopThreeTimes(command)
    } finally {
      if (!command.closed()) command.child.kill('SIGKILL')
      await lock.release()
    }
    const ended = await command.ended()
    expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
    expect(ended.stdout).toBe('')
    expect(ended.stderr).toMatch(
      new RegExp(
        `\nStopped by a third signal before the record of the platform's answer to the fund call on trade ${tradeId} for order ${ref} ` +
          'was committed: the platform answered, and nothing of its answer was recorded \\(its transaction is rolled back, its ' +
          `COMMIT not sent\\); \`orders show '${ref}'\` shows what the order records, .* \\[stopped\\]\n$`,
      ),
    )
    // the command's session, its process gone, ends with its transaction rolled back
    await lock.othersEnded()
    expect(await read((db) => findOrderByExternalReference(db, ref))).toMatchObject({ tradeStatus: 'created' })
  })
})

describeEmbedded('the compiled trades fund stopped by a third signal while its answer’s COMMIT is in flight (embedded PGlite)', () => {
  it('says the record may or may not have been made and where to look, exit 130 [stopped]', async () => {
    const ref = 'fund committing on pglite'
    const { env, read, tradeId } = await seeded('pglite', ref)
    const hold = await read((db) =>
      holdStatementOnPglite(db, env.DATA_DIR!, { name: 'test_hold_commit', table: 'orders', when: `new.external_reference = '${ref}'`, at: 'deferred' }),
    )
    expect(hold.held()).toBe(false)
    const command = startedCli(['trades', 'fund', ref], env, children)
    try {
      await eventually(() => {
        if (command.closed()) throw new Error(`the command ended before its COMMIT was held: ${command.stderr()}`)
        return hold.held()
      }, 'the record’s COMMIT runs the trigger', 120_000)
      await stopThreeTimes(command)
    } finally {
      if (!command.closed()) command.child.kill('SIGKILL')
      hold.release()
    }
    expectTheLine(await command.ended(), ref, tradeId)
    // the process ended inside the COMMIT: on PGlite, nothing carries it through
    expect(await read((db) => findOrderByExternalReference(db, ref))).toMatchObject({ tradeStatus: 'created' })
    await read(hold.drop)
  })
})
