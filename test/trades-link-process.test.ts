// `trades link` as an operator runs it: the compiled CLI as its own process (on embedded PGlite, and on Postgres
// through DATABASE_URL when TEST_DATABASE_URL is given), against the sandbox platform, which drops every webhook.
// The exit codes and lines are the command's contract; test/trades-link.test.ts covers each case in-process.
import { type Kysely, sql } from 'kysely'
import pg from 'pg'
import { describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { findOrderByExternalReference, setTradeCreateState } from '../src/orders/order.repository.js'
import { flagUnresolvedCreates } from '../src/orders/poll-schedule.repository.js'
import { casesLeftOut, type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { runCli, startedCli } from './helpers/cli-process.js'
import { useDroppingSandbox } from './helpers/dropping-sandbox.js'
import { backdateCreateMark, createOrder, markCreateSent } from './helpers/orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { postgresUrl } from './helpers/test-database.js'

const sandbox = useDroppingSandbox()
const { children, cleanups } = sandbox

/** Orders as an unanswered create leaves them, flagged trade_create_unknown, and the environment of a CLI run on them. */
function seeded(kind: 'pglite' | 'postgres', references: string[]): Promise<{ env: Record<string, string>; read: Reader }> {
  const seed = async (db: Kysely<Database>) => {
    for (const externalReference of references) {
      const { order } = await createOrder(db, { externalReference })
      await markCreateSent(db, order.id, 'none', { waitMs: 15_000 })
      await setTradeCreateState(db, order.id, 'unknown')
      await backdateCreateMark(db, order.id, 3_600_000)
    }
    await flagUnresolvedCreates(db, { unresolvedAfterS: 0, createWholeTimeMs: 15_000 })
  }
  return seededCliDatabase(kind, { prefix: 'trades-link-', env: { PARTNER_API_BASE_URL: sandbox.url }, seed, cleanups })
}

for (const kind of ['pglite', 'postgres'] as const) {
  const name = kind === 'postgres' ? 'on Postgres through DATABASE_URL (Postgres)' : 'on embedded PGlite'
  describe.skipIf(casesLeftOut(kind))(`the compiled trades link, ${name}`, () => {
    it('links the trade (exit 0), says so when run again (exit 0), and refuses another order’s trade (exit 1)', async () => {
      const [ref, other] = [`link-process-${kind}`, `link-process-${kind}-other`]
      const { env, read } = await seeded(kind, [ref, other])
      const { trade_id: tradeId, reference } = await sandbox.client.createTrade({
        title: 'Used bicycle',
        amount: '120.00',
        currency: 'EUR',
        seller_id: 's_1',
        external_reference: ref,
      })
      await sandbox.client.fundTrade(tradeId)

      const linked = await runCli(['trades', 'link', ref, tradeId], env)
      expect(linked.stderr).toBe('')
      expect(linked.code).toBe(0)
      expect(linked.stdout).toMatch(
        new RegExp(`^${ref}: linked to trade ${tradeId} \\(${reference}\\), funded on the platform\n  flag trade_create_unknown cleared; next poll at \\S+Z\n$`),
      )
      const order = await read((db) => findOrderByExternalReference(db, ref))
      expect(order).toMatchObject({ tradeId, tradeStatus: 'funded', tradeCreateState: 'created', attention: null })
      expect(order!.nextPollAt).not.toBeNull()

      const again = await runCli(['trades', 'link', ref, tradeId], env)
      expect(again.code).toBe(0)
      expect(again.stdout).toBe(`${ref}: already linked to trade ${tradeId} (funded): nothing changed\n`)

      const refused = await runCli(['trades', 'link', other, tradeId], env)
      expect(refused.code).toBe(1)
      expect(refused.stderr).toMatch(/ \[answer_mismatch\]\n$/)
      expect(await read((db) => findOrderByExternalReference(db, other))).toMatchObject({
        tradeId: null,
        tradeCreateState: 'unknown',
        attention: 'trade_create_unknown',
      })
    })
  })
}

// `trades link` writes the link in one transaction, and holds no stop signal of its own: a signal while its COMMIT
// waited for its answer said the generic words, "the command's transaction", and "look whether its change was made",
// where the link, carried through by the server without the process, was made once the COMMIT went. Now it names the
// link and the command that shows it. The COMMIT is held by a deferred constraint trigger (run at COMMIT) that waits on
// an advisory lock the test's session holds as a session lock: taken outside a transaction, no transaction id of the test's.
describe.skipIf(!postgresUrl)('the compiled trades link stopped while its COMMIT waits (Postgres)', () => {
  it('says the link may or may not have been made and where to look, exit 130 [stopped]; it is, once the COMMIT goes', async () => {
    const ref = 'link-committing'
    const key = 47_303
    const { env, read } = await seeded('postgres', [ref])
    const { trade_id: tradeId } = await sandbox.client.createTrade({ title: 'Used bicycle', amount: '120.00', currency: 'EUR', seller_id: 's_1', external_reference: ref })
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
    // no statement of the command's ends at its statement timeout while the test holds it: only the signal stops it
    const command = startedCli(['trades', 'link', ref, tradeId], { ...env, DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }, children)
    try {
      await eventually(async () => {
        if (command.closed()) throw new Error(`the command ended before its COMMIT waited: ${command.stderr()}`)
        const { rows } = await read((db) =>
          sql<{ waiting: number }>`select count(*)::int as waiting from pg_stat_activity where ${holderPid}::int = any(pg_blocking_pids(pid)) and query = 'commit'`.execute(db),
        )
        return rows[0]!.waiting > 0
      }, 'the link’s COMMIT waits on the lock', 120_000)
      command.child.kill('SIGINT')
      await eventually(() => command.closed() !== undefined, 'the command ends', 120_000)
    } finally {
      if (!command.closed()) command.child.kill('SIGKILL')
      await holder.query('select pg_advisory_unlock($1::bigint)', [key])
    }
    const ended = await command.ended()
    expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
    expect(ended.stdout).toBe('')
    expect(ended.stderr).toBe(
      `Stopped by a signal while the link of order ${ref} to trade ${tradeId} was being committed: it may or may not have been made ` +
        '(its COMMIT was sent and not yet answered; on Postgres the database finishes it without this process); ' +
        `\`orders show ${ref}\` says whether the order has the trade [stopped]\n`,
    )
    // the COMMIT went on without the process
    await eventually(async () => (await read((db) => findOrderByExternalReference(db, ref)))?.tradeId === tradeId, 'the link is made once the lock goes', 120_000)
    await holder.query('drop trigger test_hold_commit on orders')
    await holder.query('drop function test_hold_commit()')
  })
})
