// `deliveries reapply` as its own process (the compiled CLI on Postgres through DATABASE_URL, when
// TEST_DATABASE_URL is given), stopped by a signal: the first one lets the delivery in flight finish and be
// printed, and the exit code is 130; a second one ends the process, its transaction rolled back (once its COMMIT is
// sent, which the server carries through without the process, it says the reapply may or may not be made). Only on
// Postgres: there another session's row lock holds the reapply in flight for as long as the test likes, where
// on embedded PGlite the signal could only be timed against how long the transaction and the close take.
import { once } from 'node:events'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { type Kysely, sql } from 'kysely'
import pg from 'pg'
import { afterAll, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { receiverEnv, spawnCli } from './helpers/cli-process.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const REFERENCE = 'reapply-1'
const DELIVERY = 'dlv-reapply-1'
// The first signal's line: what a second one does, true before the COMMIT is sent (rolled back) and after (not known).
// It said the second one "rolls its transaction back", which a COMMIT in flight is not.
const FIRST_SIGNAL =
  'stopping after the delivery in flight, if any (a second Ctrl-C ends the process now: before its COMMIT is sent, its transaction ' +
  `is rolled back, nothing written; once it is sent, whether the reapply was made is not known, and \`deliveries show ${DELIVERY}\` tells)\n`

const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup()
})

/** An order still `created`, and a `trade.funded` delivery for it parked before it existed. */
async function seedParkedDelivery(db: Kysely<Database>): Promise<void> {
  await insertOrders(db, [{ externalReference: REFERENCE, tradeStatus: 'created' }])
  await db
    .insertInto('webhookDeliveries')
    .values({
      deliveryId: DELIVERY,
      bodySha256: 'ab'.repeat(32),
      eventType: 'trade.funded',
      tradeId: `tr_${REFERENCE}`,
      tradeReference: null,
      externalReference: REFERENCE,
      observedStatus: 'funded',
      outcome: 'unmatched',
      orderId: null,
      rawBody: '{}',
      appliedAt: null,
    })
    .execute()
}

async function stateAfter(database: DatabaseHandle): Promise<{ outcome: string; status: string | null }> {
  try {
    const delivery = await database.db.selectFrom('webhookDeliveries').select('outcome').executeTakeFirstOrThrow()
    const order = await database.db.selectFrom('orders').select('tradeStatus').executeTakeFirstOrThrow()
    return { outcome: delivery.outcome, status: order.tradeStatus }
  } finally {
    await database.close()
  }
}

function outputOf(child: ReturnType<typeof spawnCli>) {
  const output = { stdout: '', stderr: '' }
  child.stdout!.on('data', (chunk) => (output.stdout += chunk))
  child.stderr!.on('data', (chunk) => (output.stderr += chunk))
  return output
}

/** Resolves once the child has written `text` to stderr (a line of its own, or a JSON log line's msg). */
function stderrSays(child: ReturnType<typeof spawnCli>, text: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let buffer = ''
    child.stderr!.on('data', (chunk: Buffer) => {
      buffer += chunk
      if (buffer.includes(text)) resolve()
    })
    child.once('exit', (code) => reject(new Error(`exited ${code} before "${text}":\n${buffer}`)))
  })
}

// A Postgres test database with the parked delivery, and a session of the test's own beside it (its backend's pid)
async function seededWithHolder() {
  const database: TestDatabase = await createTestDatabase({ kind: 'postgres' })
  cleanups.push(() => database.close())
  await seedParkedDelivery(database.db)
  const holder = new pg.Client({ connectionString: database.url! })
  await holder.connect()
  cleanups.push(() => holder.end())
  const holderPid = Number((await holder.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]!.pid)
  return { database, holder, holderPid }
}

// On Postgres the delivery can be held in flight for as long as the test likes: its order's row is locked
async function heldInFlight(signal: NodeJS.Signals) {
  const { database, holder, holderPid } = await seededWithHolder()
  await holder.query('begin')
  await holder.query('select id from orders where external_reference = $1 for update', [REFERENCE])

  const dataDir = mkdtempSync(path.join(tmpdir(), 'reapply-interrupt-'))
  const child = spawnCli(['deliveries', 'reapply', DELIVERY, '--json'], { ...receiverEnv(dataDir), DATABASE_URL: database.url! })
  const output = outputOf(child)
  // the CLI's transaction waits for the order's row: a session blocked by the holder (the database is shared)
  await eventually(async () => {
    const { rows } = await sql<{ waiting: string }>`
      select count(*) as waiting from pg_stat_activity where ${holderPid}::int = any(pg_blocking_pids(pid))`.execute(database.db)
    return Number(rows[0]!.waiting) > 0
  }, 'the reapply waits for the locked order')
  child.kill('SIGINT')
  await stderrSays(child, 'stopping after the delivery in flight')
  if (signal !== 'SIGINT') child.kill(signal)
  // the second signal, if any, came first: the process may be gone before the row is let go
  const exited = once(child, 'exit') as Promise<[number | null, string | null]>
  if (signal !== 'SIGINT') await exited
  await holder.query('commit')
  const [code, endedBy] = await exited
  return { code, endedBy, output, state: await stateAfter(openDatabase({ databaseUrl: database.url! })) }
}

it.skipIf(!postgresUrl)(
  'waits for the delivery in flight on Ctrl-C, prints it and exits 130, on Postgres (Postgres)',
  async () => {
    const { code, endedBy, output, state } = await heldInFlight('SIGINT')
    expect({ code, endedBy }, output.stderr.slice(-2_000)).toEqual({ code: 130, endedBy: null })
    expect(JSON.parse(output.stdout)).toMatchObject({ deliveryId: DELIVERY, outcome: 'applied', toStatus: 'funded' })
    expect(output.stderr).toContain('stopped by a signal after the delivery in flight')
    expect(output.stderr).toContain(FIRST_SIGNAL)
    expect(state).toEqual({ outcome: 'applied', status: 'funded' })
  },
  120_000,
)

it.skipIf(!postgresUrl)(
  'ends at a second signal with nothing written: the transaction in flight is rolled back, on Postgres (Postgres)',
  async () => {
    const { code, endedBy, output, state } = await heldInFlight('SIGTERM')
    expect({ code, endedBy }, output.stderr.slice(-2_000)).toEqual({ code: null, endedBy: 'SIGTERM' })
    expect(output.stdout).toBe('')
    expect(output.stderr).toContain(FIRST_SIGNAL)
    expect(state).toEqual({ outcome: 'unmatched', status: 'created' })
  },
  120_000,
)

// Once its COMMIT is sent, the end of the process no longer rolls the reapply back: the server carries it through. A
// second signal then said nothing of it (the first had said the second "rolls its transaction back"), and the delivery
// was applied once the COMMIT went; the first line now says both cases (FIRST_SIGNAL). The COMMIT is held by a
// deferred constraint trigger (run at COMMIT) waiting on an advisory lock the test's session holds as a session lock,
// taken outside a transaction: no transaction id of the test's.
it.skipIf(!postgresUrl)(
  'a second signal while its COMMIT waits says the reapply may or may not have been made, exit 130 [stopped]; it is, once the COMMIT goes (Postgres)',
  async () => {
    const key = 47_302
    const { database, holder, holderPid } = await seededWithHolder()
    await holder.query(
      `create function test_hold_commit() returns trigger language plpgsql as $$ begin perform pg_advisory_xact_lock(${key}); return null; end $$`,
    )
    await holder.query(
      'create constraint trigger test_hold_commit after update on webhook_deliveries deferrable initially deferred for each row execute function test_hold_commit()',
    )
    await holder.query('select pg_advisory_lock($1::bigint)', [key])
    // seen from another session: a session's own look at pg_stat_activity holds a snapshot while it runs
    const { rows: horizon } = await sql`select backend_xid as xid, backend_xmin as xmin from pg_stat_activity where pid = ${holderPid}::int`.execute(database.db)
    expect(horizon).toEqual([{ xid: null, xmin: null }])

    const dataDir = mkdtempSync(path.join(tmpdir(), 'reapply-interrupt-'))
    const child = spawnCli(['deliveries', 'reapply', DELIVERY, '--json'], { ...receiverEnv(dataDir), DATABASE_URL: database.url! })
    const output = outputOf(child)
    const exited = once(child, 'exit') as Promise<[number | null, string | null]>
    try {
      await eventually(async () => {
        const { rows } = await sql<{ waiting: string }>`
          select count(*) as waiting from pg_stat_activity where ${holderPid}::int = any(pg_blocking_pids(pid)) and query = 'commit'`.execute(database.db)
        return Number(rows[0]!.waiting) > 0
      }, 'the reapply’s COMMIT waits on the lock')
      child.kill('SIGINT')
      await stderrSays(child, 'stopping after the delivery in flight')
      child.kill('SIGTERM')
      const [code, endedBy] = await exited
      expect({ code, endedBy }, output.stderr.slice(-2_000)).toEqual({ code: 130, endedBy: null })
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
      await holder.query('select pg_advisory_unlock($1::bigint)', [key])
    }
    expect(output.stdout).toBe('')
    expect(output.stderr).toContain(FIRST_SIGNAL)
    expect(output.stderr).toContain(
      `Stopped by a signal while the reapply of ${DELIVERY} was being committed: it may or may not have been made (its COMMIT was sent ` +
        `and not yet answered; on Postgres the database finishes it without this process); \`deliveries show ${DELIVERY}\` shows its outcome [stopped]\n`,
    )
    // the COMMIT went on without the process
    await eventually(async () => {
      const delivery = await database.db.selectFrom('webhookDeliveries').select('outcome').executeTakeFirstOrThrow()
      return delivery.outcome === 'applied'
    }, 'the reapply is made once the lock goes')
    await holder.query('drop trigger test_hold_commit on webhook_deliveries')
    await holder.query('drop function test_hold_commit()')
  },
  120_000,
)
