// The console's bound is one deadline over everything a page waits on the database for (answer-bound.ts). A statement
// the page would send once its deadline has passed is not sent; inside a transaction (the dismiss confirm page reads
// its parked deliveries in one) the ROLLBACK is not sent either, and the connection must then be closed when given
// back, not handed out again inside the page's transaction (Kysely discards a connection whose ROLLBACK failed; this
// holds it to that). The deadline is passed here by moving the clock it is read with (performance.now), not by
// waiting.
//
// Which of the page's deadline and the pool's wait for a connection (its connect timeout, as long) ends a wait both
// would end is decided by their lengths, not by which timer Node runs first: on a loaded machine the loop wakes late,
// and runs the pool's later timer first (helpers/late-loop.ts). That is checked against a server that takes
// connections and answers nothing, with no database at all: it runs whether or not a Postgres is given.
import net from 'node:net'
import { performance } from 'node:perf_hooks'
import { sql } from 'kysely'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { AnswerBoundError, withinAnswerBound } from '../src/db/answer-bound.js'
import { CONNECT_TIMEOUT_MS } from '../src/db/database-errors.js'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { wakeLatePast } from './helpers/late-loop.js'
import { describePostgres, useTestDatabase } from './helpers/test-database.js'

describe('a page’s statements waiting on a pool of one for a database that takes connections and never answers', () => {
  it('ends them with the page’s bound when the loop wakes late, past the pool’s own wait for a connection too', async () => {
    // the hung database: each connection taken, no byte sent back
    const taken = new Set<net.Socket>()
    const hung = net.createServer((socket) => {
      taken.add(socket)
      socket.on('error', () => {})
    })
    await new Promise<void>((resolve) => hung.listen(0, '127.0.0.1', resolve))
    const { port } = hung.address() as net.AddressInfo
    const pooled = openDatabase({ databaseUrl: `postgres://hung@127.0.0.1:${port}/hung`, poolSize: 1 })
    try {
      // the page's deadline as long as the pool's wait for a connection (the console's: CONSOLE_PAGE_ANSWER_MS)
      await wakeLatePast(CONNECT_TIMEOUT_MS)
      // the first statement opens the pool's one connection; the second waits for it, under the pool's connect timeout
      const page = withinAnswerBound(CONNECT_TIMEOUT_MS, () => Promise.all([sql`select 1`.execute(pooled.db), sql`select 2`.execute(pooled.db)]))
      // not pg-pool's `timeout exceeded when trying to connect`, which its timer, run first, used to give the page
      await expect(page).rejects.toMatchObject({ name: 'AnswerBoundError', boundMs: CONNECT_TIMEOUT_MS, waitedFor: 'connection' })
    } finally {
      await pooled.close().catch(() => {})
      for (const socket of taken) socket.destroy()
      await new Promise((resolve) => hung.close(resolve))
    }
  }, 60_000)
})

describePostgres('a page’s deadline passed inside a transaction (Postgres, a pool of one)', () => {
  const database = useTestDatabase()
  let pooled: DatabaseHandle | undefined

  afterEach(async () => {
    vi.restoreAllMocks()
    await pooled?.close().catch(() => {})
  })

  it('sends nothing more and closes the connection, so the next statement is not in the page’s transaction', async () => {
    pooled = openDatabase({ databaseUrl: database.url!, poolSize: 1 })
    await sql`select 1`.execute(pooled.db)
    expect(pooled.poolStats()).toEqual({ total: 1, idle: 1, waiting: 0 })
    let now = performance.now()
    vi.spyOn(performance, 'now').mockImplementation(() => now)
    const page = withinAnswerBound(5_000, () =>
      pooled!.db.transaction().execute(async (trx) => {
        await sql`select 1`.execute(trx)
        // the page's earlier waits took its whole bound
        now += 5_001
        await sql`select 2`.execute(trx)
      }),
    )
    await expect(page).rejects.toBeInstanceOf(AnswerBoundError)
    vi.restoreAllMocks()
    // closed when given back, its transaction ended with it
    expect(pooled.poolStats()).toEqual({ total: 0, idle: 0, waiting: 0 })
    const { rows } = await sql<{ fresh: boolean }>`select transaction_timestamp() = statement_timestamp() as fresh`.execute(pooled.db)
    expect(rows).toEqual([{ fresh: true }])
  })

  it('takes no connection once the deadline has passed outside a transaction, and keeps the one it has', async () => {
    pooled = openDatabase({ databaseUrl: database.url!, poolSize: 1 })
    await sql`select 1`.execute(pooled.db)
    let now = performance.now()
    vi.spyOn(performance, 'now').mockImplementation(() => now)
    const page = withinAnswerBound(5_000, async () => {
      await sql`select 1`.execute(pooled!.db)
      now += 5_001
      await sql`select 2`.execute(pooled!.db)
    })
    // the wait for a connection is the page's too: none is taken
    await expect(page).rejects.toMatchObject({ name: 'AnswerBoundError', boundMs: 5_000, waitedFor: 'connection' })
    vi.restoreAllMocks()
    expect(pooled.poolStats()).toEqual({ total: 1, idle: 1, waiting: 0 })
  })
})
