// A stop signal during a command's own work (a statement waiting on a lock another session holds, a long requeue, a
// webhook whose receiver never answers): the command ended killed by the signal, without a word (exit 143 for
// SIGTERM, 130 for SIGINT, each a shell's number for a signal, not the command's). Now it says it was stopped and what
// that means, and exits 130 with [stopped]: a command of one transaction did nothing; `reconcile --requeue-open`,
// which commits a slice of 10,000 orders at a time, stops after the slice in flight and says how many it requeued
// (on Postgres and on embedded PGlite).
import { type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { type Kysely, sql } from 'kysely'
import pg from 'pg'
import { afterAll, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { MIGRATION_LOCK_KEY } from '../src/db/migrate.js'
import { type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { describeEmbedded, killLeftovers, receiverEnv, startedCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { holdStatementOnPglite } from './helpers/pglite-statement-hold.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { tradePayload } from './helpers/webhook-delivery.js'

const children: ChildProcess[] = []
const cleanups: (() => Promise<void>)[] = []
const scratch = mkdtempSync(path.join(tmpdir(), 'cli-stop-work-'))
afterAll(async () => {
  killLeftovers(children)
  for (const cleanup of cleanups.splice(0)) await cleanup()
  rmSync(scratch, { recursive: true, force: true })
})

const started = (args: string[], env: Record<string, string>) => startedCli(args, env, children)

type Started = ReturnType<typeof started>

/**
 * Resolves once `check` holds. Fails at once, with what the command wrote, when the command ends first: a wait for
 * its signal's line from a command that had ended without it lasted the whole bound, and held the test's locks.
 */
async function until(check: () => Promise<boolean> | boolean, what: string, command?: Started): Promise<void> {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; ) {
    if (await check()) return
    const closed = command?.closed()
    if (closed) throw new Error(`the command ended (${JSON.stringify(closed)}) before ${what}; it wrote: ${command!.stderr()}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error(`timed out: ${what}`)
}

describePostgres('a stop signal during a command’s work on Postgres', () => {
  let database: TestDatabase
  // another session: one in a transaction sees pg_stat_activity as it was at the transaction's first look
  let watcher: pg.Client
  const application = `cli-stop-work-${process.pid}`

  async function setUp(): Promise<Record<string, string>> {
    database ??= await createTestDatabase({ kind: 'postgres' })
    if (!watcher) {
      cleanups.push(() => database.close())
      watcher = new pg.Client({ connectionString: database.url! })
      await watcher.connect()
      cleanups.unshift(() => watcher.end())
    }
    const url = new URL(database.url!)
    url.searchParams.set('application_name', application)
    // no statement of the command's ends at its statement timeout while the test holds it: only the signal stops it
    return { ...receiverEnv(path.join(scratch, 'data')), DATABASE_URL: url.toString(), DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }
  }

  /**
   * A session of the test's that holds what the command is to wait on: a lock taken by a transaction's only statement
   * (LOCK TABLE, an advisory lock), which gives it no transaction id and keeps no snapshot, so it holds back no
   * vacuum's or stream's horizon however long it is held. A row lock (FOR UPDATE) takes a transaction id: held over
   * the command's start, and 120 s when the command never took the signal, it held back the horizon of every stream in
   * the cluster, and another file's stream read nothing.
   */
  async function gate(): Promise<{ client: pg.Client; pid: number }> {
    const client = new pg.Client({ connectionString: database.url! })
    // released by pg_terminate_backend (release below), which the client hears as an error
    client.on('error', () => {})
    await client.connect()
    const { rows } = await client.query<{ pid: number }>('select pg_backend_pid() as pid')
    return { client, pid: rows[0]!.pid }
  }

  /** What holds back the cluster's horizon in a session: its transaction id and its snapshot's xmin (none for a gate). */
  async function horizonOf(session: { pid: number }): Promise<unknown> {
    const { rows } = await watcher.query(`select backend_xid as xid, backend_xmin as xmin from pg_stat_activity where pid = $1`, [session.pid])
    return rows[0]
  }

  /**
   * Lets everything go, also when the test failed half-way: the command killed if it still runs, and the gates'
   * sessions ended by the server, which drops their locks, granted or still asked for (a session that waits on a lock
   * reads no Terminate from its client until it is granted).
   */
  async function release(gates: { client: pg.Client; pid: number }[], command: Started | undefined): Promise<void> {
    if (command && !command.closed()) command.child.kill('SIGKILL')
    await watcher.query('select pg_terminate_backend(pid) from unnest($1::int[]) as pid', [gates.map((each) => each.pid)])
    await Promise.all(gates.map((each) => each.client.end().catch(() => {})))
  }

  /**
   * True once a statement of the command's (`like`, when given) waits on a lock `session` holds. Any lock wait of the
   * file's application name was taken for it before: an earlier case's command, ended while it waited, leaves its
   * session waiting until it is granted (the server reads nothing from a client then), and the migrate case's, queued on
   * the migration lock (the whole database's) behind another file's migrations, was taken for the requeue's second
   * slice: its signal went to a command still starting, which ended by it without a word.
   */
  async function commandWaitsOn(session: { pid: number }, like = '%'): Promise<boolean> {
    const { rows } = await watcher.query<{ n: number }>(
      `select count(*)::int as n from pg_stat_activity where application_name = $1 and $2 = any(pg_blocking_pids(pid)) and query like $3`,
      [application, session.pid, like],
    )
    return rows[0]!.n > 0
  }

  it.each([
    ['orders list', ['orders', 'list'], 'SIGTERM'],
    ['orders create', ['orders', 'create', '--external-reference', 'stop-locked'], 'SIGINT'],
  ] as const)('%s waiting on a table lock: says it did nothing, exit 130 [stopped]', async (_, args, signal) => {
    const env = await setUp()
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('begin; lock table orders')
      command = started([...args], env)
      await until(() => commandWaitsOn(holder), 'the command waits on the lock', command)
      command.child.kill(signal)
      await until(() => command!.closed() !== undefined, 'the command ends')
    } finally {
      await release([holder], command)
    }
    const ended = await command.ended()
    expect(ended.stderr).toMatch(/Stopped by a signal before the command was done: nothing was done \(.*\) \[stopped\]\n$/)
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
    const { rows } = await watcher.query(`select 1 from orders where external_reference = 'stop-locked'`)
    expect(rows).toEqual([])
  })

  // A one-transaction command's COMMIT, once sent, is carried through by the server without the client: a signal
  // while it waited for its answer said that nothing was done, and the order was there once the COMMIT went. The
  // COMMIT is held by a deferred constraint trigger (run at COMMIT) that waits on an advisory lock the test's session
  // holds as a session lock: taken outside a transaction, so the test holds no transaction id nor snapshot meanwhile.
  it('orders create stopped while its COMMIT waits: says the order may or may not have been made and where to look, exit 130 [stopped]; it is, once the COMMIT goes', async () => {
    const env = await setUp()
    const reference = 'stop-committing'
    const key = 47_301
    await watcher.query(
      `create or replace function test_hold_commit() returns trigger language plpgsql as $$ begin perform pg_advisory_xact_lock(${key}); return null; end $$`,
    )
    await watcher.query(
      `create constraint trigger test_hold_commit after insert on orders deferrable initially deferred for each row ` +
        `when (new.external_reference = '${reference}') execute function test_hold_commit()`,
    )
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('select pg_advisory_lock($1::bigint)', [key])
      expect(await horizonOf(holder)).toEqual({ xid: null, xmin: null })
      command = started(['orders', 'create', '--external-reference', reference], env)
      await until(() => commandWaitsOn(holder, 'commit'), 'the command’s COMMIT waits on the lock', command)
      command.child.kill('SIGINT')
      await until(() => command!.closed() !== undefined, 'the command ends')
      // the COMMIT goes on without the command: once the lock goes, the order is made
      await holder.client.query('select pg_advisory_unlock($1::bigint)', [key])
      await until(async () => (await watcher.query(`select 1 from orders where external_reference = $1`, [reference])).rows.length === 1, 'the order is made')
    } finally {
      await release([holder], command)
      await watcher.query('drop trigger if exists test_hold_commit on orders')
      await watcher.query('drop function if exists test_hold_commit()')
    }
    const ended = await command.ended()
    expect(ended.stderr).toBe(
      "Stopped by a signal while the order's creation was being committed: it may or may not have been made (its COMMIT was sent " +
        `and not yet answered; on Postgres the database finishes it without this process); \`orders show ${reference}\` says whether the order exists [stopped]\n`,
    )
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
  })

  it('migrate waiting on the migration lock: says it did nothing, exit 130 [stopped]', async () => {
    const env = await setUp()
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('begin')
      await holder.client.query('select pg_advisory_xact_lock($1::bigint)', [MIGRATION_LOCK_KEY])
      command = started(['migrate'], env)
      await until(() => commandWaitsOn(holder), 'migrate waits on the lock', command)
      command.child.kill('SIGTERM')
      await until(() => command!.closed() !== undefined, 'migrate ends')
    } finally {
      await release([holder], command)
    }
    const ended = await command.ended()
    expect(ended.stderr).toMatch(/nothing was done .*\[stopped\]\n$/)
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
  })

  // 25,000 open orders, three slices of 10,000. The first gate holds the first slice back before it begins; the
  // second, asked for while that slice waits, queues behind it and is granted as it commits, so the second slice
  // waits on it: the signal comes with one slice committed and one in flight, whatever the machine's speed. Each
  // gate is a table lock no update goes past (SHARE, SHARE ROW EXCLUSIVE): the command's reads go on, and its handler
  // of the signal is on before its first slice (a lock wait seen earlier, while it opened the database, would have
  // sent the signal to the opening's own handler).
  it('reconcile --requeue-open stops after the batch in flight and says how many it requeued, exit 130 [stopped]', async () => {
    const env = await setUp()
    await watcher.query(`delete from orders`)
    await watcher.query(
      `insert into orders (external_reference, trade_id, next_poll_at)
       select 'open-' || g, 'trd_open_' || g, now() + interval '1 day' from generate_series(1, 25000) g`,
    )
    const first = await gate()
    const second = await gate()
    let command: Started | undefined
    try {
      await first.client.query('begin; lock table orders in share mode')
      expect(await horizonOf(first)).toEqual({ xid: null, xmin: null })
      command = started(['reconcile', '--requeue-open', '--within', '0'], env)
      await until(() => commandWaitsOn(first, '%with locked as%'), 'the first slice waits on the first gate', command)
      const secondTaken = second.client.query('begin; lock table orders in share row exclusive mode')
      secondTaken.catch(() => {})
      // asked for after the slice's own lock: in the lock's queue behind it
      await until(() => waitsOn(second, first), 'the second gate waits behind the first slice')
      await first.client.query('commit')
      await secondTaken
      expect(await horizonOf(second)).toEqual({ xid: null, xmin: null })
      await until(() => commandWaitsOn(second, '%with locked as%'), 'the second slice waits on the second gate', command)
      command.child.kill('SIGTERM')
      await until(() => command!.stderr().includes('stopping after the batch in flight'), 'the command takes the signal', command)
      await second.client.query('commit')
      await until(() => command!.closed() !== undefined, 'the command ends')
    } finally {
      await release([first, second], command)
    }
    const ended = await command.ended()
    // on Postgres the batch in flight at a second signal may still commit (its statement runs on without the process)
    expect(ended.stderr).toContain(
      'stopping after the batch in flight (a second Ctrl-C ends the process now, without the count: that batch may still commit)\n',
    )
    expect(ended.stderr).toMatch(/stopped by a signal after the batch in flight: 20,000 of 25,000 open orders were requeued \(above\); .*\[stopped\]\n$/)
    expect(ended.stdout).toContain('20,000 open order(s) due now')
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
    const { rows } = await watcher.query<{ n: number }>(`select count(*)::int as n from orders where next_poll_at <= now()`)
    expect(rows).toEqual([{ n: 20_000 }])
  })

  // 5,000 open orders, one slice, held back by a gate: the signal comes with the last slice in flight. It said
  // "stopping after the batch in flight" and then ended as if no signal had come, exit 0, every order requeued.
  it('reconcile --requeue-open stopped during its last batch says that batch committed and nothing was left undone, exit 0', async () => {
    const env = await setUp()
    await watcher.query(`delete from orders`)
    await watcher.query(
      `insert into orders (external_reference, trade_id, next_poll_at)
       select 'open-' || g, 'trd_open_' || g, now() + interval '1 day' from generate_series(1, 5000) g`,
    )
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('begin; lock table orders in share mode')
      command = started(['reconcile', '--requeue-open', '--within', '0'], env)
      await until(() => commandWaitsOn(holder, '%with locked as%'), 'the only slice waits on the gate', command)
      command.child.kill('SIGTERM')
      await until(() => command!.stderr().includes('stopping after the batch in flight'), 'the command takes the signal', command)
      await holder.client.query('commit')
      await until(() => command!.closed() !== undefined, 'the command ends')
    } finally {
      await release([holder], command)
    }
    const ended = await command.ended()
    expect(ended.stdout).toContain('5,000 open order(s) due now')
    expect(ended.stderr).toMatch(/stopping after the batch in flight .*\n.*the stop signal came during the last batch, which committed: nothing was left undone\n$/)
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 0, signal: null })
    const { rows } = await watcher.query<{ n: number }>(`select count(*)::int as n from orders where next_poll_at <= now()`)
    expect(rows).toEqual([{ n: 5_000 }])
  })

  /** A failed reaction job of an order of its own; returns its id. */
  async function failedJob(reference: string): Promise<string> {
    const { rows: orders } = await watcher.query<{ id: number }>(
      `insert into orders (external_reference, trade_id, next_poll_at) values ($1, $2, now() + interval '1 day') returning id`,
      [reference, `trd_${reference}`],
    )
    const orderId = orders[0]!.id
    cleanups.unshift(async () => {
      await watcher.query('delete from reaction_jobs where order_id = $1', [orderId])
      await watcher.query('delete from order_status_history where order_id = $1', [orderId])
      await watcher.query('delete from orders where id = $1', [orderId])
    })
    const { rows } = await watcher.query<{ id: string }>(
      `with event as (
         insert into order_status_history (order_id, from_status, to_status, source, sequence) values ($1, 'created', 'funded', 'webhook', 1)
         returning event_id, order_id, sequence)
       insert into reaction_jobs (event_id, order_id, sequence, handler, state, attempts, run_at)
       select event_id, order_id, sequence, 'ledger', 'failed', 3, now() from event returning id::text`,
      [orderId],
    )
    return rows[0]!.id
  }

  async function jobState(id: string): Promise<string | undefined> {
    const { rows } = await watcher.query<{ state: string }>('select state from reaction_jobs where id = $1', [id])
    return rows[0]?.state
  }

  // One update outside a transaction: on Postgres it runs on without the process that sent it, and a client killed
  // while its update waited on a lock saw it commit once the lock went. It said "nothing was done", exit 130, and the
  // job was skipped as soon as the lock was released. Now it waits for its update, and says so.
  it('reactions skip waiting on a table lock: finishes its update, prints its result, says nothing was left undone, exit 0', async () => {
    const env = await setUp()
    const id = await failedJob(`stop-skip-${process.pid}`)
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('begin; lock table reaction_jobs in share mode')
      expect(await horizonOf(holder)).toEqual({ xid: null, xmin: null })
      command = started(['reactions', 'skip', id], env)
      await until(() => commandWaitsOn(holder, 'update "reaction_jobs"%'), 'the skip waits on the lock', command)
      command.child.kill('SIGTERM')
      await until(() => command!.stderr().includes(`stopping once the skip of job ${id} is done`), 'the command takes the signal', command)
      await holder.client.query('commit')
      await until(() => command!.closed() !== undefined, 'the command ends')
    } finally {
      await release([holder], command)
    }
    const ended = await command.ended()
    expect(ended.stdout).toBe(`job ${id} skipped\n`)
    expect(ended.stderr).toMatch(/the stop signal came while the skip of job \d+ was in flight; the command has finished, its result above: nothing was left undone\n$/)
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 0, signal: null })
    expect(await jobState(id)).toBe('skipped')
  })

  it('reactions skip stopped again while its update waits: says the skip may or may not have been made, exit 130 [stopped]; it is, once the lock goes', async () => {
    const env = await setUp()
    const id = await failedJob(`stop-skip-again-${process.pid}`)
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('begin; lock table reaction_jobs in share mode')
      command = started(['reactions', 'skip', id], env)
      await until(() => commandWaitsOn(holder, 'update "reaction_jobs"%'), 'the skip waits on the lock', command)
      command.child.kill('SIGTERM')
      await until(() => command!.stderr().includes('stopping once'), 'the command takes the signal', command)
      // another signal than the first: not taken for its copy, whatever the time between them
      command.child.kill('SIGINT')
      await until(() => command!.closed() !== undefined, 'the command ends')
      expect(await jobState(id)).toBe('failed')
    } finally {
      await release([holder], command)
    }
    const ended = await command.ended()
    expect(ended.stderr).toMatch(
      new RegExp(`Stopped by a second signal before the skip of job ${id} was known to be done: it may or may not have been made .*; \`reactions show ${id}\` shows its state \\[stopped\\]\n$`),
    )
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
    // what the line says: the update sent runs on without the process, and commits once the lock goes
    await until(async () => (await jobState(id)) === 'skipped', 'the skip sent is made')
  })

  // A second signal ended both without a word (killed by it): prune's batch in flight, and reconcile --once's claim
  // or give-back, run on without the process on Postgres. Each now says what may be left, exit 130.
  it('prune stopped again while its batch waits: says that batch may or may not have been pruned, exit 130 [stopped]', async () => {
    const env = await setUp()
    const received = new Date(Date.now() - 400 * 86_400_000)
    await watcher.query(
      `insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, outcome, raw_body)
       select 'stop-prune-' || n, 'sha-' || n, $1, 'trade.funded', 'applied', '{}' from generate_series(1, 20) n`,
      [received],
    )
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('begin; lock table webhook_deliveries in share mode')
      expect(await horizonOf(holder)).toEqual({ xid: null, xmin: null })
      command = started(['prune'], env)
      await until(() => commandWaitsOn(holder), 'a batch waits on the lock', command)
      command.child.kill('SIGTERM')
      await until(() => command!.stderr().includes('stopping after the batch in flight'), 'the command takes the signal', command)
      command.child.kill('SIGINT')
      await until(() => command!.closed() !== undefined, 'the command ends')
    } finally {
      await release([holder], command)
    }
    const ended = await command.ended()
    expect(ended.stderr).toMatch(/Stopped by a second signal during a batch: it may or may not have been pruned .*; `prune --dry-run` counts what is left \[stopped\]\n$/)
    expect({ code: ended.code, signal: ended.signal, stdout: ended.stdout }).toEqual({ code: 130, signal: null, stdout: '' })
  })

  it('reconcile --once stopped again while its claim waits: says its claimed orders wait out their lease, exit 130 [stopped]', async () => {
    const env = await setUp()
    const reference = `stop-reconcile-${process.pid}`
    const { rows } = await watcher.query<{ id: number }>(
      `insert into orders (external_reference, trade_id, next_poll_at) values ($1, $2, now() - interval '1 minute') returning id`,
      [reference, `trd_${reference}`],
    )
    cleanups.unshift(async () => {
      await watcher.query('delete from orders where id = $1', [rows[0]!.id])
    })
    const holder = await gate()
    let command: Started | undefined
    try {
      await holder.client.query('begin; lock table orders in share mode')
      expect(await horizonOf(holder)).toEqual({ xid: null, xmin: null })
      command = started(['reconcile', '--once'], env)
      await until(() => commandWaitsOn(holder, 'update%'), 'the claim waits on the lock', command)
      command.child.kill('SIGTERM')
      await until(() => command!.stderr().includes('stopping: the orders not polled are given back'), 'the command takes the signal', command)
      command.child.kill('SIGINT')
      await until(() => command!.closed() !== undefined, 'the command ends')
    } finally {
      await release([holder], command)
    }
    const ended = await command.ended()
    expect(ended.stderr).toMatch(
      /Stopped by a second signal: the orders this run claimed and did not poll are due again when their lease ends \(within \d+ s, POLL_LEASE_S\), .* \[stopped\]\n$/,
    )
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
  })

  /** True while `session` waits on a lock `holder` holds. */
  async function waitsOn(session: { pid: number }, holder: { pid: number }): Promise<boolean> {
    const { rows } = await watcher.query<{ n: number }>(`select count(*)::int as n from pg_stat_activity where pid = $1 and $2 = any(pg_blocking_pids(pid))`, [
      session.pid,
      holder.pid,
    ])
    return rows[0]!.n > 0
  }
})

// The same two on embedded PGlite (local mode, the default `npm start` set-up), and a second signal, where no other
// session can hold a lock: its Postgres runs in a worker thread of the command's process. The slice is held inside its UPDATE by a
// trigger on one of its orders that waits there for the test's release (helpers/pglite-statement-hold.ts), while the
// command's main thread takes the signal.
describeEmbedded('reconcile --requeue-open stopped during a slice on embedded PGlite', () => {
  /** A migrated DATA_DIR holding `count` open orders `open-1`…, due in a day, in the order of their ids. */
  const seeded = (count: number) =>
    seededCliDatabase('pglite', {
      prefix: 'cli-stop-requeue-',
      env: {},
      cleanups,
      seed: (db) =>
        sql`insert into orders (external_reference, trade_id, next_poll_at)
            select 'open-' || g, 'trd_open_' || g, now() + interval '1 day' from generate_series(1, ${count}::int) g`.execute(db),
    })

  // what a second signal leaves: the batch in flight not committed, where on Postgres it may still commit (the line said
  // so here too)
  const STOPPING_AFTER_THE_BATCH =
    'stopping after the batch in flight (a second Ctrl-C ends the process now, without the count: the embedded database ' +
    'ends with it, and that batch is not committed)'

  const dueNow = async (db: Kysely<Database>) =>
    (await sql<{ n: number }>`select count(*)::int as n from orders where next_poll_at <= now()`.execute(db)).rows[0]!.n

  /** Holds the slice that updates order `reference` (the first of a slice) until `release`. */
  const holdSliceOf = (read: Reader, dataDir: string, reference: string) =>
    read((db) => holdStatementOnPglite(db, dataDir, { name: 'test_hold_slice', table: 'orders', when: `new.external_reference = '${reference}'`, at: 'before update' }))

  /** `reconcile --requeue-open` over `orders` open orders, sent SIGTERM once the slice updating `heldReference` is held. */
  async function requeueStoppedWhileHeld(orders: number, heldReference: string) {
    const { env, read } = await seeded(orders)
    const hold = await holdSliceOf(read, env.DATA_DIR!, heldReference)
    const command = started(['reconcile', '--requeue-open', '--within', '0'], env)
    try {
      await until(() => hold.held(), `the slice of ${heldReference} is held`, command)
      command.child.kill('SIGTERM')
      await until(() => command.stderr().includes('stopping after the batch in flight'), 'the command takes the signal', command)
    } finally {
      hold.release()
    }
    return { ended: await command.ended(), read }
  }

  // 25,000 open orders, three slices of 10,000: the second is held, so the signal comes with one slice committed and
  // one in flight, whatever the machine's speed
  it('reconcile --requeue-open stops after the batch in flight and says how many it requeued, exit 130 [stopped]', async () => {
    const { ended, read } = await requeueStoppedWhileHeld(25_000, 'open-10001')
    expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
    expect(ended.stdout).toMatch(/^20,000 open order\(s\) due now, from .* by the database's clock\n$/)
    expect(ended.stderr).toBe(
      `${STOPPING_AFTER_THE_BATCH}\n` +
        'stopped by a signal after the batch in flight: 20,000 of 25,000 open orders were requeued (above); the others keep their polls: ' +
        'run it again to requeue them [stopped]\n',
    )
    // the first slice, and the second, in flight at the signal, let finish; the third never begun
    expect(await read(dueNow)).toBe(20_000)
  })

  // 5,000 open orders, one slice, held: the signal comes with the last slice in flight
  it('reconcile --requeue-open stopped during its last batch says that batch committed and nothing was left undone, exit 0', async () => {
    const { ended, read } = await requeueStoppedWhileHeld(5_000, 'open-1')
    expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 0, signal: null })
    expect(ended.stdout).toMatch(/^5,000 open order\(s\) due now, from .* by the database's clock\n$/)
    expect(ended.stderr).toBe(`${STOPPING_AFTER_THE_BATCH}\nthe stop signal came during the last batch, which committed: nothing was left undone\n`)
    expect(await read(dueNow)).toBe(5_000)
  })

  // A second signal ends it at once, without the count. On Postgres the batch in flight may still commit (a statement
  // sent runs on without the process); on PGlite the database ends with the process, and that batch is not committed
  it('reconcile --requeue-open stopped again during a batch ends at once without the count; on PGlite that batch is not committed', async () => {
    const { env, read } = await seeded(25_000)
    const hold = await holdSliceOf(read, env.DATA_DIR!, 'open-10001')
    const command = started(['reconcile', '--requeue-open', '--within', '0'], env)
    try {
      await until(() => hold.held(), 'the second slice is held', command)
      command.child.kill('SIGTERM')
      await until(() => command.stderr().includes('stopping after the batch in flight'), 'the command takes the signal', command)
      // another signal than the first: not taken for its copy, whatever the time between them
      command.child.kill('SIGINT')
      await until(() => command.closed() !== undefined, 'the command ends')
    } finally {
      hold.release()
    }
    const ended = await command.ended()
    expect({ code: ended.code, signal: ended.signal, stdout: ended.stdout }, ended.stderr).toEqual({ code: null, signal: 'SIGINT', stdout: '' })
    expect(ended.stderr).toBe(`${STOPPING_AFTER_THE_BATCH}\n`)
    // the first slice only: the second was held in its UPDATE when the process ended
    expect(await read(dueNow)).toBe(10_000)
  })
})

it('webhook send to a receiver that never answers: says the delivery may have been taken, exit 130 [stopped]', async () => {
  let received = false
  const silent: Server = createServer(() => {
    received = true
  })
  silent.listen(0, '127.0.0.1')
  await once(silent, 'listening')
  try {
    const file = path.join(scratch, 'body.json')
    writeFileSync(file, JSON.stringify(tradePayload('stop-send', 'funded')))
    const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}/webhooks/partner`
    const command = started(['webhook', 'send', '--file', file, '--url', url, '--secret', 'whsec_stop', '--delivery-id', 'dlv-stop-1'], {
      DATA_DIR: migratedDataDir('cli-stop-send-'),
    })
    await until(() => received, 'the receiver has the request', command)
    command.child.kill('SIGTERM')
    const ended = await command.ended()
    expect(ended.stderr).toMatch(/Stopped by a signal before the receiver's answer: delivery dlv-stop-1 may or may not have been taken; .*\[stopped\]\n$/)
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
  } finally {
    silent.closeAllConnections()
    silent.close()
  }
})
