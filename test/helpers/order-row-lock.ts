// An order's row held by another session, as a replica's statement or an operator's transaction would hold
// it: a statement that needs the row waits, its snapshot taken, until the holder lets go.
import { sql } from 'kysely'
import pg from 'pg'
import type { TestDatabase } from './test-database.js'

export interface OrderRowLock {
  /** Resolves once some session waits for the row (the database is shared: any session, not one of ours). */
  untilBlocked(): Promise<void>
  /** Ends the holder's transaction: `rollback` or `commit` (the holder wrote nothing). */
  release(how?: 'rollback' | 'commit'): Promise<void>
  /** Closes the holder's connection (after release, or to let go by ending the session). */
  end(): Promise<void>
}

export async function holdOrderRow(database: TestDatabase, externalReference: string): Promise<OrderRowLock> {
  const holder = new pg.Client({ connectionString: database.url! })
  await holder.connect()
  const holderPid = (await holder.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid
  await holder.query('begin')
  await holder.query('select id from orders where external_reference = $1 for update', [externalReference])
  const blocked = async () =>
    (await sql<{ n: number }>`select count(*)::int as n from pg_stat_activity where ${holderPid}::int = any(pg_blocking_pids(pid))`.execute(database.db)).rows[0]!.n
  return {
    async untilBlocked() {
      while ((await blocked()) === 0) await new Promise((resolve) => setTimeout(resolve, 10))
    },
    async release(how = 'rollback') {
      await holder.query(how)
    },
    end: () => holder.end(),
  }
}
