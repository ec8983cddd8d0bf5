// The connection that holds a lock outside the pool (a prune pass's, DatabaseHandle.holdLock) over a path that
// goes silent: giving the lock back must not wait on a server that no longer answers, or a service's stop waits
// for it until its bound and exits 1.
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { openDatabase } from '../src/db/open-database.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { createTestDatabase, describePostgres, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const KEY = 0x5eed_10c4

describePostgres('a lock held on a connection of its own (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database?.close()
  })

  const heldElsewhere = async () => {
    const other = new pg.Client({ connectionString: postgresUrl })
    await other.connect()
    try {
      const { rows } = await other.query<{ locked: boolean }>('select pg_try_advisory_lock($1::bigint) as locked', [KEY])
      if (rows[0]?.locked) await other.query('select pg_advisory_unlock($1::bigint)', [KEY])
      return rows[0]?.locked !== true
    } finally {
      await other.end()
    }
  }

  it('is given back within seconds when its connection went silent', async () => {
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 1, statementTimeoutMs: 1_000 })
    try {
      const release = await handle.holdLock(KEY)
      expect(release).toBeTypeOf('function')
      expect(await heldElsewhere()).toBe(true)
      // no byte passes either way any more, and no FIN or RST either
      proxy.stall()
      const outcome = await Promise.race([
        release!().then(() => 'given back'),
        new Promise((resolve) => setTimeout(() => resolve('still waiting'), 30_000).unref()),
      ])
      // the commit's answer is waited for 2 s (timeout and grace), the end 1 s; before, this waited for good.
      // The server keeps the session, and the lock, until its own TCP keepalive finds the path dead (the socket
      // closed here never reaches it): other replicas' passes skip meanwhile, which PruningStalled reports
      expect(outcome).toBe('given back')
    } finally {
      await handle.close()
      await proxy.close()
    }
  }, 60_000)
})
