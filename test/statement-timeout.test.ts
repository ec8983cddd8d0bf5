// A statement of the service's that another session holds up (an operator's open transaction keeping a lock on
// an order) is cancelled by the database at DATABASE_STATEMENT_TIMEOUT_MS, through the compiled `serve` on
// Postgres. Before, only the client stopped waiting (15 s, answered 503): the statement waited on, and once the
// lock went it wrote the delivery the platform had been told to send again (17 of 40 such deliveries in a run
// by hand), and the pool's connections it held made the next statements given them wait and fail too.
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { migrations } from '../migrations/index.js'
import { migrateTo } from '../src/db/migrate.js'
import { jsonLogLines, receiverEnv, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const APPLICATION = 'statement-timeout-serve'
const HELD = 10

const serveEnv = (databaseUrl: string) => ({
  ...receiverEnv(mkdtempSync(path.join(tmpdir(), 'statement-timeout-'))),
  DATABASE_URL: databaseUrl,
  DATABASE_STATEMENT_TIMEOUT_MS: '1500',
})

describePostgres('statements held up by another session (Postgres, the compiled serve)', () => {
  let database: TestDatabase
  let child: ChildProcess | undefined
  let holder: pg.Client
  let watcher: pg.Client

  beforeAll(async () => {
    database = await createTestDatabase()
    await sql`insert into orders (external_reference) select 'held-' || g from generate_series(0, ${HELD - 1}) g`.execute(database.db)
    await sql`insert into orders (external_reference) values ('free-0'), ('free-1')`.execute(database.db)
    holder = new pg.Client({ connectionString: database.url })
    watcher = new pg.Client({ connectionString: database.url })
    await Promise.all([holder.connect(), watcher.connect()])
  })

  afterAll(async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL')
      await once(child, 'exit')
    }
    await holder?.end()
    await watcher?.end()
    await database?.close()
  })

  const post = async (url: string, deliveryId: string, reference: string) => {
    const body = JSON.stringify(tradePayload(reference, 'funded'))
    const response = await fetch(`${url}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': deliveryId, 'x-partner-signature': signBody(body) },
      body,
      signal: AbortSignal.timeout(60_000),
    })
    const answer = (await response.json()) as { error?: { code: string } }
    return { status: response.status, code: answer.error?.code }
  }

  const stored = async (ids: string[]) => {
    const { rows } = await watcher.query<{ id: string }>(`select delivery_id as id from webhook_deliveries where delivery_id = any($1) order by 1`, [ids])
    return rows.map((row) => row.id)
  }

  it('answers 503, leaves nothing to be written later, and frees its connections while the lock is still held', async () => {
    const url = new URL(database.url!)
    url.searchParams.set('application_name', APPLICATION)
    child = spawnCli(['serve'], serveEnv(url.toString()))
    const lines = jsonLogLines(child)
    const serviceUrl = String((await waitForLogLine(child, 'service listening')).url)

    // an operator's session keeps the held orders locked
    await holder.query('begin')
    await holder.query(`select id from orders where external_reference like 'held-%' for update`)
    const held = Array.from({ length: HELD }, (_, i) => `held-delivery-${i}`)
    const answers = await Promise.all(held.map((id, i) => post(serviceUrl, id, `held-${i}`)))
    expect(answers).toEqual(held.map(() => ({ status: 503, code: 'database_unavailable' })))

    // the lock is still held, and none of the service's statements waits on it: the database cancelled them
    const { rows: waiting } = await watcher.query<{ n: number }>(
      `select count(*)::int as n from pg_stat_activity where application_name = $1 and wait_event_type = 'Lock'`,
      [APPLICATION],
    )
    expect(waiting).toEqual([{ n: 0 }])
    // and the connections they held serve other orders at once
    expect(await post(serviceUrl, 'free-delivery-0', 'free-0')).toEqual({ status: 200, code: undefined })

    // the lock goes; a delivery through the pool after it, and none of the 503s was written
    await holder.query('rollback')
    expect(await post(serviceUrl, 'free-delivery-1', 'free-1')).toEqual({ status: 200, code: undefined })
    expect(await stored(held)).toEqual([])

    // the platform sends them again: each is written and applied once
    const again = await Promise.all(held.map((id, i) => post(serviceUrl, id, `held-${i}`)))
    expect(again.map((answer) => answer.status)).toEqual(held.map(() => 200))
    expect(await stored(held)).toEqual([...held].sort())
    const { rows: history } = await watcher.query<{ n: number }>(
      `select count(*)::int as n from order_status_history h join orders o on o.id = h.order_id where o.external_reference like 'held-%'`,
    )
    expect(history).toEqual([{ n: HELD }])

    // a direct connection applies the timeout: no warning of statements left unbounded
    expect(lines.filter((line) => String(line.msg).startsWith('the database does not cancel'))).toEqual([])
    // the cancellations are logged as what they are (a line for each statement, which may hold several deliveries)
    const errors = lines.filter((line) => Number(line.level) >= 50)
    expect(errors.length).toBeGreaterThan(0)
    expect(new Set(errors.map((line) => `${String(line.msg)} ${(line.err as { code?: string }).code}`))).toEqual(new Set(['webhook not stored 57014']))
    child.kill('SIGTERM')
    expect((await once(child, 'exit'))[0]).toBe(0)
  })

  // The migrations run on a connection of their own without the timeout: one may index a large table for
  // minutes, or wait for a lock, as here. Before, the statement was ended (by the client's wait, 15 s), and the
  // start-up tried again and again, each time cancelled again, for as long as the migration needed longer
  it('runs a migration that waits longer than the statement timeout to its end, at the first attempt', async () => {
    const old = await createTestDatabase({ migrate: false })
    const operator = new pg.Client({ connectionString: old.url })
    let upgrading: ChildProcess | undefined
    try {
      await migrateTo(old.db, '0009_reaction_streams')
      // an operator's open transaction reads reaction_jobs: migration 0010 replaces one of its indexes, which waits
      await operator.connect()
      await operator.query('begin')
      await operator.query('select count(*) from reaction_jobs')

      const url = new URL(old.url!)
      url.searchParams.set('application_name', `${APPLICATION}-upgrade`)
      upgrading = spawnCli(['serve'], serveEnv(url.toString()))
      const lines = jsonLogLines(upgrading)
      // the migration waits on the lock, and goes on waiting for twice the statement timeout (read by another
      // session: one in a transaction sees pg_stat_activity as it was at the transaction's first look)
      const migrationWaits = async () => {
        const { rows: waiting } = await watcher.query<{ n: number }>(
          `select count(*)::int as n from pg_stat_activity where application_name = $1 and wait_event_type = 'Lock'`,
          [`${APPLICATION}-upgrade`],
        )
        return waiting[0]!.n === 1
      }
      for (let waited = 0; !(await migrationWaits()); waited += 100) {
        if (waited > 60_000) throw new Error(`the migration never waited on the lock:\n${JSON.stringify(lines)}`)
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
      await new Promise((resolve) => setTimeout(resolve, 3_000))
      expect(await migrationWaits()).toBe(true)
      await operator.query('commit')

      const applied = await waitForLogLine(upgrading, 'migrations applied')
      // every migration after 0009, in order: the first of them, 0010, the one that waited
      expect(applied.applied).toEqual(Object.keys(migrations).filter((name) => name > '0009_reaction_streams'))
      expect(lines.filter((line) => line.msg === 'database not available at start-up; retrying')).toEqual([])
      upgrading.kill('SIGTERM')
      expect((await once(upgrading, 'exit'))[0]).toBe(0)
    } finally {
      if (upgrading && upgrading.exitCode === null && upgrading.signalCode === null) upgrading.kill('SIGKILL')
      await operator.end()
      await old.close()
    }
  })
})
