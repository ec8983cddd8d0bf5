// The orders table held on Postgres by a session of the test's: a SHARE lock (writes wait on it, reads go on), taken
// in a transaction that has no transaction id, checked from another session (one holding an id would hold back every
// other session's horizon for as long as the test waits). A command's write to orders then waits where the test can
// see it (pg_blocking_pids) while the test sends signals. In EXCLUSIVE mode (plain reads go on) a read that locks its
// rows (SELECT … FOR UPDATE) waits too: a statement that reads the order under its lock, before deciding what to write.
import { sql } from 'kysely'
import pg from 'pg'
import type { Reader } from './cli-database.js'
import { eventually } from './reconcile-poller.js'

export interface OrdersShareLock {
  /** The holding session's backend pid. */
  readonly pid: number
  /** Takes the lock; throws when the holding session has a transaction id. */
  take(): Promise<void>
  /** Resolves once a session waits on the lock; throws at once when `ended()` says the command ended first. */
  waitedOn(what: string, ended: () => string | undefined): Promise<void>
  /** Ends the lock's transaction (nothing was written in it). */
  release(): Promise<void>
  /** Resolves once no session of the database but the holder's and the reader's runs a statement or a transaction. */
  othersEnded(): Promise<void>
  end(): Promise<void>
}

/** A session on `databaseUrl` that holds the lock (SHARE, or `mode`) once taken; `read` looks at it from another session. */
export async function ordersShareLock(
  databaseUrl: string,
  read: Reader,
  { mode = 'share' }: { mode?: 'share' | 'exclusive' } = {},
): Promise<OrdersShareLock> {
  const holder = new pg.Client({ connectionString: databaseUrl })
  await holder.connect()
  const pid = Number((await holder.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid)
  return {
    pid,
    async take() {
      await holder.query('begin')
      await holder.query(`lock table orders in ${mode} mode`)
      // seen from another session: a session's own look at pg_stat_activity holds a snapshot while it runs
      const { rows } = await read((db) => sql<{ xid: string | null }>`select backend_xid as xid from pg_stat_activity where pid = ${pid}::int`.execute(db))
      if (rows.length !== 1 || rows[0]!.xid !== null) throw new Error(`the lock's session holds a transaction id: ${JSON.stringify(rows)}`)
    },
    waitedOn: (what, ended) =>
      eventually(async () => {
        const stderr = ended()
        if (stderr !== undefined) throw new Error(`the command ended before ${what}:\n${stderr}`)
        const { rows } = await read((db) =>
          sql<{ waiting: number }>`select count(*)::int as waiting from pg_stat_activity where ${pid}::int = any(pg_blocking_pids(pid))`.execute(db),
        )
        return rows[0]!.waiting > 0
      }, what, 120_000),
    async release() {
      await holder.query('commit').catch(() => {})
    },
    othersEnded: () =>
      eventually(async () => {
        const { rows } = await read((db) =>
          sql<{ others: number }>`select count(*)::int as others from pg_stat_activity where datname = current_database()
            and backend_type = 'client backend' and state <> 'idle' and pid <> pg_backend_pid() and pid <> ${pid}::int`.execute(db),
        )
        return rows[0]!.others === 0
      }, 'the command’s session ends', 120_000),
    end: () => holder.end(),
  }
}
