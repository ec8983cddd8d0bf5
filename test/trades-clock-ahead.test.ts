// The poll a trade command schedules after its call (EXPECTED_WEBHOOK_S on, in case the webhook does not come) is
// dated by the database's time when the command's machine is ahead of it (src/db/write-time.ts). Before, `trades
// open`'s first poll and the poll after `trades deliver` (and every other call on a trade) came EXPECTED_WEBHOOK_S
// after the command's own clock: from a machine 4 minutes ahead (inside the platform's signature window) the order
// waited 4 minutes more for the poll that heals a lost webhook. Run in-process through the CLI runner, its clock the
// command's (the context's), on the suite's database (PGlite, or Postgres with TEST_DATABASE_URL).
import { type Kysely, sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { type Clock, systemClock } from '../src/clock.js'
import type { Database } from '../src/db/database.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const AHEAD_MS = 240_000
const EXPECTED_WEBHOOK_MS = 600_000

/** The machine's clock run 4 minutes ahead. */
const ahead: Clock = { now: () => Date.now() + AHEAD_MS, monotonicNow: () => performance.now(), sleep: systemClock.sleep }

let database: TestDatabase
let server: RecordingServer
let context: CliContext

beforeAll(async () => {
  database = await createTestDatabase()
  server = await startRecordingServer({
    secret: TEST_API_SECRET,
    answer: (request) => {
      if (request.method === 'POST' && request.path === '/api/partner/v1/trades/') {
        const sent = JSON.parse(request.rawBody.toString('utf8'))
        return { status: 201, body: tradeRecord({ trade_id: `tr_${sent.external_reference}`, external_reference: sent.external_reference }) }
      }
      // a call on a trade: its record, delivered
      const tradeId = decodeURIComponent(request.path.split('/')[5]!)
      return { status: 200, body: tradeRecord({ trade_id: tradeId, external_reference: tradeId.replace(/^tr_/, ''), status: 'delivered' }) }
    },
  })
  const config = testConfig({ PARTNER_API_BASE_URL: server.url, EXPECTED_WEBHOOK_S: String(EXPECTED_WEBHOOK_MS / 1000) })
  context = { config, logger: testLogger([TEST_API_SECRET]), db: database.db, clock: ahead }
})
afterAll(async () => {
  await server.close()
  await database.close()
})

async function databaseNow(db: Kysely<Database>): Promise<number> {
  const { rows } = await sql<{ now: Date }>`select statement_timestamp() as now`.execute(db)
  return new Date(rows[0]!.now).getTime()
}

/** The order's next poll: EXPECTED_WEBHOOK_S after the database's time of the command (between `before` and `after`). */
async function expectPollExpectedFrom(reference: string, before: number, after: number): Promise<void> {
  const order = await findOrderByExternalReference(database.db, reference)
  const nextPollAt = order!.nextPollAt!.getTime()
  expect(nextPollAt).toBeGreaterThanOrEqual(before + EXPECTED_WEBHOOK_MS)
  expect(nextPollAt).toBeLessThanOrEqual(after + EXPECTED_WEBHOOK_MS)
}

describe("a trade command on a machine whose clock runs 4 minutes ahead schedules its poll by the database's time", () => {
  it("trades open: the first poll EXPECTED_WEBHOOK_S after the database's now", async () => {
    const before = await databaseNow(database.db)
    const opened = await runCommandWith(['trades', 'open', 'ahead-open', '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1'], context)
    expect(opened.code, opened.stderr).toBe(0)
    await expectPollExpectedFrom('ahead-open', before, await databaseNow(database.db))
  })

  it("trades deliver: the poll after the call EXPECTED_WEBHOOK_S after the database's now", async () => {
    const opened = await runCommandWith(['trades', 'open', 'ahead-deliver', '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1'], context)
    expect(opened.code, opened.stderr).toBe(0)
    const before = await databaseNow(database.db)
    const delivered = await runCommandWith(['trades', 'deliver', 'ahead-deliver'], context)
    expect(delivered.code, delivered.stderr).toBe(0)
    expect((await findOrderByExternalReference(database.db, 'ahead-deliver'))!.tradeStatus).toBe('delivered')
    await expectPollExpectedFrom('ahead-deliver', before, await databaseNow(database.db))
  })
})
