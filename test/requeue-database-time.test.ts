// An operator's requeue of a flagged order (`reconcile --requeue`, the console's "Requeue") makes it due at the
// database's time, not at the clock of the machine it is run from (src/db/write-time.ts). Before, from a machine an hour
// ahead of the database the order was due an hour later, while the command said "due now".
// The console: a replica's clock an hour ahead (PGlite and Postgres). The command: the compiled CLI under libfaketime
// an hour ahead of Postgres (PGlite runs inside the process that opens it, on that process's clock).
import { existsSync } from 'node:fs'
import { type Kysely, sql } from 'kysely'
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Clock, systemClock } from '../src/clock.js'
import type { Database } from '../src/db/database.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { testLogger } from './helpers/log-sink.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const HOUR_MS = 3_600_000
const TOKEN = 'console-token-0123456789abcdef0123'
const FAKETIME_LIBRARY = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1'

/** The machine's clock run an hour ahead. */
const hourAhead: Clock = { now: () => Date.now() + HOUR_MS, monotonicNow: () => performance.now(), sleep: systemClock.sleep }

/** Orders flagged trade_not_found, off the schedule, as a poll's 404 leaves them. */
async function flaggedOrders(db: Kysely<Database>, references: readonly string[]): Promise<void> {
  await insertOrders(db, references.map((externalReference) => ({ externalReference, nextPollAt: null })))
  await db.updateTable('orders').set({ attention: 'trade_not_found' }).where('externalReference', 'in', [...references]).execute()
}

async function databaseNow(db: Kysely<Database>): Promise<number> {
  const { rows } = await sql<{ now: Date }>`select statement_timestamp() as now`.execute(db)
  return new Date(rows[0]!.now).getTime()
}

/** Requeued: the flag cleared, due at the database's time of the requeue (between `before` and `after`). */
async function expectDueAt(db: Kysely<Database>, reference: string, before: number, after: number): Promise<void> {
  const order = await orderByReference(db, reference)
  expect(order.attention).toBeNull()
  expect(new Date(order.nextPollAt!).getTime()).toBeGreaterThanOrEqual(before)
  expect(new Date(order.nextPollAt!).getTime()).toBeLessThanOrEqual(after)
}

/** The hidden fields of the one action form on a confirm page. */
function formFields(page: string): Record<string, string> {
  const form = /<form method="post"[^>]*>([\s\S]*?)<\/form>/.exec(page.replace(/<header>[\s\S]*?<\/header>/, ''))
  if (!form) throw new Error(`no action form in: ${page.slice(0, 400)}`)
  return Object.fromEntries([...form[1]!.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((match) => [match[1]!, match[2]!.replace(/&amp;/g, '&')]))
}

describe("the console of a replica whose clock runs an hour ahead requeues a flagged order due at the database's time", () => {
  let database: TestDatabase
  let admin: ReturnType<typeof createAdminApp>
  const bearer = (call: request.Test) => call.set('Authorization', `Bearer ${TOKEN}`)

  beforeAll(async () => {
    database = await createTestDatabase()
    admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: testLogger([TOKEN]), clock: hourAhead })
  })
  afterAll(async () => {
    await database.close()
  })

  it('one order, and every flagged order: due now, not an hour from now', async () => {
    await flaggedOrders(database.db, ['console-one', 'console-all-1', 'console-all-2'])
    let before = await databaseNow(database.db)
    const one = formFields((await bearer(request(admin).get('/console/orders/requeue?reference=console-one'))).text)
    expect((await bearer(request(admin).post('/console/orders/requeue')).type('form').send(one)).text).toContain('1 due now')
    await expectDueAt(database.db, 'console-one', before, await databaseNow(database.db))

    before = await databaseNow(database.db)
    const every = formFields((await bearer(request(admin).get('/console/orders/requeue'))).text)
    expect((await bearer(request(admin).post('/console/orders/requeue')).type('form').send(every)).text).toContain('2 due now')
    const after = await databaseNow(database.db)
    for (const reference of ['console-all-1', 'console-all-2']) await expectDueAt(database.db, reference, before, after)
  })
})

describe("`reconcile --requeue` on a machine whose clock runs an hour ahead makes the order due at the database's time", () => {
  let database: TestDatabase | undefined
  afterAll(async () => {
    await database?.close()
  })

  it.skipIf(!postgresUrl || !existsSync(FAKETIME_LIBRARY))(
    '--requeue REFERENCE and --requeue (every flagged order): due now, not an hour from now (Postgres, libfaketime)',
    async () => {
      database = await createTestDatabase({ kind: 'postgres' })
      const { db } = database
      const env = {
        ...receiverEnv(migratedDataDir('requeue-clock-ahead-')),
        DATABASE_URL: database.url!,
        LD_PRELOAD: FAKETIME_LIBRARY,
        FAKETIME: '+3600s',
        // timers keep the real clock: only the time of day is an hour ahead
        FAKETIME_DONT_FAKE_MONOTONIC: '1',
      }
      await flaggedOrders(db, ['cli-one', 'cli-all-1', 'cli-all-2'])

      let before = await databaseNow(db)
      const one = await runCli(['reconcile', '--requeue', 'cli-one'], env)
      expect(one.code, one.stderr).toBe(0)
      expect(one.stdout).toBe('cli-one: due now (was trade_not_found)\n')
      await expectDueAt(db, 'cli-one', before, await databaseNow(db))

      before = await databaseNow(db)
      const every = await runCli(['reconcile', '--requeue'], env)
      expect(every.code, every.stderr).toBe(0)
      const after = await databaseNow(db)
      for (const reference of ['cli-all-1', 'cli-all-2']) await expectDueAt(db, reference, before, after)
    },
    120_000,
  )
})
