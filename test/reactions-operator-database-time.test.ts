// An operator's retry and skip of a reaction job are dated by the database's time, not by the clock of the machine
// they are run from (src/db/write-time.ts). Before, `reactions retry` from a machine an hour ahead of the database
// wrote the job due an hour from now (it waited that hour, holding back its order's later events for its handler),
// and a skip finished an hour from now; so did the console of a replica an hour ahead.
// The console: a replica's clock an hour ahead (PGlite and Postgres). The command: the compiled CLI under libfaketime
// an hour ahead of Postgres (PGlite runs inside the process that opens it, on that process's clock).
import { existsSync } from 'node:fs'
import { type Kysely, sql } from 'kysely'
import request from 'supertest'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { type Clock, systemClock } from '../src/clock.js'
import type { Database } from '../src/db/database.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { writeJobRows } from './helpers/reaction-jobs.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const HOUR_MS = 3_600_000
const TOKEN = 'console-token-0123456789abcdef0123'
const FAKETIME_LIBRARY = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1'

/** The machine's clock run an hour ahead. */
const hourAhead: Clock = { now: () => Date.now() + HOUR_MS, monotonicNow: () => performance.now(), sleep: systemClock.sleep }

interface JobTimes {
  state: string
  runAt: Date
  updatedAt: Date
  finishedAt: Date | null
}

/** Failed jobs of the `crm-sync` handler, one per order, `count` of them; their ids. */
async function failedJobs(db: Kysely<Database>, prefix: string, count: number): Promise<string[]> {
  const reactions = createReactionRegistry().on('trade.funded', 'crm-sync', async () => {})
  for (let n = 1; n <= count; n++) {
    const { order } = await createOrder(db, { externalReference: `${prefix}-${n}` })
    await applyObservation(
      db,
      { target: { orderId: order.id }, tradeId: `trd_${prefix}-${n}`, status: 'funded', source: 'webhook', observedAt: new Date() },
      { staleAfterS: 3_600, handlersFor: reactions.handlersFor },
    )
  }
  await writeJobRows(db, reactions)
  const rows = await db
    .selectFrom('reactionJobs as job')
    .innerJoin('orderStatusHistory as event', 'event.eventId', 'job.eventId')
    .select('job.id')
    .where('event.externalReference', 'like', `${prefix}-%`)
    .orderBy('job.id')
    .execute()
  const ids = rows.map((row) => String(row.id))
  // what a dispatcher leaves after the last attempt threw, an hour ago
  const longAgo = new Date(Date.now() - HOUR_MS)
  await db.updateTable('reactionJobs').set({ state: 'failed', attempts: 5, lastError: 'Error: CRM unavailable (503)', runAt: longAgo, finishedAt: longAgo, updatedAt: longAgo }).where('id', 'in', ids).execute()
  return ids
}

async function timesOf(db: Kysely<Database>, id: string): Promise<JobTimes> {
  const row = await db.selectFrom('reactionJobs').select(['state', 'runAt', 'updatedAt', 'finishedAt']).where('id', '=', id).executeTakeFirstOrThrow()
  return { state: row.state, runAt: new Date(row.runAt), updatedAt: new Date(row.updatedAt), finishedAt: row.finishedAt === null ? null : new Date(row.finishedAt) }
}

async function databaseNow(db: Kysely<Database>): Promise<number> {
  const { rows } = await sql<{ now: Date }>`select statement_timestamp() as now`.execute(db)
  return new Date(rows[0]!.now).getTime()
}

/** A retried job: pending, due at the database's time of the action (between `before` and `after`), not an hour later. */
function expectRetriedAt(job: JobTimes, before: number, after: number): void {
  expect(job.state).toBe('pending')
  expect(job.runAt.getTime()).toBeGreaterThanOrEqual(before)
  expect(job.runAt.getTime()).toBeLessThanOrEqual(after)
  expect(job.updatedAt.getTime()).toBe(job.runAt.getTime())
  expect(job.finishedAt).toBeNull()
}

function expectSkippedAt(job: JobTimes, before: number, after: number): void {
  expect(job.state).toBe('skipped')
  expect(job.finishedAt!.getTime()).toBeGreaterThanOrEqual(before)
  expect(job.finishedAt!.getTime()).toBeLessThanOrEqual(after)
  expect(job.updatedAt.getTime()).toBe(job.finishedAt!.getTime())
}

/** The hidden fields of the one action form on a confirm page. */
function formFields(page: string): Record<string, string> {
  const form = /<form method="post"[^>]*>([\s\S]*?)<\/form>/.exec(page.replace(/<header>[\s\S]*?<\/header>/, ''))
  if (!form) throw new Error(`no action form in: ${page.slice(0, 400)}`)
  return Object.fromEntries([...form[1]!.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((match) => [match[1]!, match[2]!.replace(/&amp;/g, '&')]))
}

describe("the console of a replica whose clock runs an hour ahead dates a reaction's retry and skip by the database's time", () => {
  let database: TestDatabase
  let admin: ReturnType<typeof createAdminApp>
  let counter = 0
  const bearer = (call: request.Test) => call.set('Authorization', `Bearer ${TOKEN}`)
  /** Posts the console's form for `path` (its confirm page's fields), as an operator does. */
  const confirmAndPost = async (path: string) => {
    const confirm = await bearer(request(admin).get(path))
    expect(confirm.status).toBe(200)
    const done = await bearer(request(admin).post(path)).type('form').send(formFields(confirm.text))
    expect(done.status).toBe(200)
    return done.text
  }

  beforeAll(async () => {
    database = await createTestDatabase()
    admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: testLogger([TOKEN]), clock: hourAhead })
  })
  afterAll(async () => {
    await database.close()
  })
  beforeEach(async () => {
    await database.db.updateTable('reactionJobs').set({ state: 'done' }).where('state', '=', 'failed').execute()
  })

  it('retries a failed job due now, not an hour from now', async () => {
    const [id] = await failedJobs(database.db, `console-retry-${++counter}`, 1)
    const before = await databaseNow(database.db)
    expect(await confirmAndPost(`/console/reactions/${id}/retry`)).toContain(`job ${id} runs again now`)
    expectRetriedAt(await timesOf(database.db, id!), before, await databaseNow(database.db))
  })

  it('retries every failed job due now', async () => {
    const ids = await failedJobs(database.db, `console-all-${++counter}`, 2)
    const before = await databaseNow(database.db)
    expect(await confirmAndPost('/console/reactions/retry-failed')).toContain(`2 job(s) run again now: ${ids.join(', ')}`)
    const after = await databaseNow(database.db)
    for (const id of ids) expectRetriedAt(await timesOf(database.db, id), before, after)
  })

  it('skips a failed job finished now', async () => {
    const [id] = await failedJobs(database.db, `console-skip-${++counter}`, 1)
    const before = await databaseNow(database.db)
    expect(await confirmAndPost(`/console/reactions/${id}/skip`)).toContain(`job ${id} skipped`)
    expectSkippedAt(await timesOf(database.db, id!), before, await databaseNow(database.db))
  })
})

describe("`reactions retry` and `skip` on a machine whose clock runs an hour ahead date the job by the database's time", () => {
  let database: TestDatabase | undefined
  afterAll(async () => {
    await database?.close()
  })

  it.skipIf(!postgresUrl || !existsSync(FAKETIME_LIBRARY))(
    'retry ID, retry --failed and skip ID write due and finished times of now, not an hour from now (Postgres, libfaketime)',
    async () => {
      database = await createTestDatabase({ kind: 'postgres' })
      const { db } = database
      const env = {
        ...receiverEnv(migratedDataDir('reactions-clock-ahead-')),
        DATABASE_URL: database.url!,
        LD_PRELOAD: FAKETIME_LIBRARY,
        FAKETIME: '+3600s',
        // timers keep the real clock: only the time of day is an hour ahead
        FAKETIME_DONT_FAKE_MONOTONIC: '1',
      }
      const [one, skipped, ...rest] = await failedJobs(db, 'cli', 4)

      let before = await databaseNow(db)
      const retried = await runCli(['reactions', 'retry', one!], env)
      expect(retried.code, retried.stderr).toBe(0)
      expectRetriedAt(await timesOf(db, one!), before, await databaseNow(db))

      before = await databaseNow(db)
      const skip = await runCli(['reactions', 'skip', skipped!], env)
      expect(skip.code, skip.stderr).toBe(0)
      expectSkippedAt(await timesOf(db, skipped!), before, await databaseNow(db))

      before = await databaseNow(db)
      const all = await runCli(['reactions', 'retry', '--failed', '--json'], env)
      expect(all.code, all.stderr).toBe(0)
      expect(JSON.parse(all.stdout)).toEqual({ retried: rest })
      const after = await databaseNow(db)
      for (const id of rest) expectRetriedAt(await timesOf(db, id), before, after)
    },
    120_000,
  )
})
