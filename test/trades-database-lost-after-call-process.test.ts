// A database that goes away once a trade command's call has been sent: the platform's answer (or its unknown outcome)
// is the command's news, never the database's "try again later". An outside review cut the database while the
// platform answered: `trades release` printed only "The database could not run the command now … try again later
// [database_unavailable]" though the funds were released; a timed-out call lost its `[outcome_unknown]`; `trades open`
// printed no trade id of the trade it made; and "try again" after `proposals create` made a second proposal.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { runCli } from './helpers/cli-process.js'
import { type GatedPlatform, startGatedPlatform } from './helpers/gated-platform.js'
import { moveNewOrder } from './helpers/orders.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const scratch = mkdtempSync(path.join(tmpdir(), 'trades-db-lost-'))

describePostgres('a trade command whose database goes away once its call is sent (Postgres)', () => {
  let database: TestDatabase
  let proxy: TcpProxy
  let platform: GatedPlatform
  let env: Record<string, string>

  beforeAll(async () => {
    database = await createTestDatabase({ kind: 'postgres' })
    const target = new URL(database.url!)
    proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    platform = await startGatedPlatform()
    env = {
      DATA_DIR: path.join(scratch, 'data'),
      DATABASE_URL: proxy.rewrite(database.url!),
      PARTNER_API_BASE_URL: platform.url,
      PARTNER_API_KEY_ID: TEST_API_KEY_ID,
      PARTNER_API_SECRET: TEST_API_SECRET,
      WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
      PARTNER_API_TIMEOUT_MS: '2000',
    }
  })

  afterAll(async () => {
    await platform?.close()
    await proxy?.close()
    await database?.close()
    rmSync(scratch, { recursive: true, force: true })
  })

  /** The database cut as the platform takes the call, and back once the command has ended. */
  async function cutWhileAtPlatform(args: string[], gate: { hang?: boolean; tradeId?: string; status?: string; externalReference?: string } = {}) {
    const before = platform.requests.length
    platform.gate = { ...gate, before: () => proxy.cut() }
    try {
      const result = await runCli(args, env)
      // the command's lines, without its log lines (JSON), which may come after them
      return { ...result, stderr: result.stderr.replace(/^\{.*\}\n/gm, ''), sent: platform.requests.slice(before) }
    } finally {
      proxy.restore()
      platform.gate = {}
    }
  }

  async function orderRow(reference: string) {
    const { rows } = await sql<Record<string, unknown>>`select trade_id, trade_status, trade_create_state from orders
      where external_reference = ${reference}`.execute(database.db.withoutPlugins())
    return rows[0]
  }

  it('trades release answered: says the platform released it, what the order could not record, exit 1 [answer_not_recorded]', async () => {
    await moveNewOrder(database.db, { externalReference: 'rel-1', statuses: ['created', 'funded'], handlersFor: () => [], now: () => new Date() })
    const result = await cutWhileAtPlatform(['trades', 'release', 'rel-1'], { tradeId: 'trd_rel-1', status: 'released', externalReference: 'rel-1' })
    expect(result.sent.map((each) => `${each.method} ${each.path}`)).toEqual(['POST /api/partner/v1/trades/trd_rel-1/release/'])
    expect(result.stderr).not.toMatch(/try again/)
    expect(result.stderr).toMatch(
      /The platform did the release call on trade trd_rel-1: trade trd_rel-1 is released\. The database could not record it \(.+\): order rel-1 still shows funded.*Do not send it again.*`trades get rel-1`.* \[answer_not_recorded\]\n$/s,
    )
    expect(result.code).toBe(1)
    expect(await orderRow('rel-1')).toMatchObject({ trade_status: 'funded' })
  })

  it('trades release timed out: keeps its [outcome_unknown] and says the poll could not be scheduled', async () => {
    await moveNewOrder(database.db, { externalReference: 'rel-2', statuses: ['created', 'funded'], handlersFor: () => [], now: () => new Date() })
    const result = await cutWhileAtPlatform(['trades', 'release', 'rel-2'], { hang: true })
    expect(result.sent).toHaveLength(1)
    expect(result.stderr).not.toMatch(/try again/)
    expect(result.stderr).toMatch(/\[outcome_unknown\]\n {2}The database could not schedule the order's poll soon \(.+\).*Do not send the call again before checking/s)
    expect(result.code).toBe(1)
  })

  it('trades open answered: names the trade made and how it gets linked, never "try again" [trade_not_recorded]', async () => {
    const result = await cutWhileAtPlatform(
      ['trades', 'open', 'open-1', '--title', 'Bicycle', '--amount', '10.00', '--currency', 'EUR', '--seller', 's1'],
      { tradeId: 'trd_3' },
    )
    expect(result.sent.map((each) => `${each.method} ${each.path}`)).toEqual(['POST /api/partner/v1/trades/'])
    expect(result.stderr).not.toMatch(/try again/)
    expect(result.stderr).toMatch(
      /The platform created trade trd_3 \(created\) for order open-1, but the database could not record it \(.+\).*`trades link open-1 trd_3`.*Do not send the create again.* \[trade_not_recorded\]\n$/s,
    )
    expect(result.code).toBe(1)
    expect(await orderRow('open-1')).toMatchObject({ trade_id: null, trade_create_state: 'pending' })
    // the same command sends nothing while that create's time runs
    const again = await runCli(['trades', 'open', 'open-1', '--title', 'Bicycle', '--amount', '10.00', '--currency', 'EUR', '--seller', 's1'], env)
    expect(again.stderr).toMatch(/\[trade_create_in_flight\]/)
    expect(platform.requests.filter((each) => each.path.endsWith('/v1/trades/'))).toHaveLength(1)
  })

  it('trades open timed out: keeps its [outcome_unknown] and says the order could not be marked unknown', async () => {
    const result = await cutWhileAtPlatform(
      ['trades', 'open', 'open-2', '--title', 'Bicycle', '--amount', '10.00', '--currency', 'EUR', '--seller', 's1'],
      { hang: true },
    )
    expect(result.sent).toHaveLength(1)
    expect(result.stderr).not.toMatch(/try again/)
    expect(result.stderr).toMatch(/\[outcome_unknown\]\n {2}The database could not mark the order's create unknown \(.+\).*Do not send the create again before checking the platform\.\n$/s)
    expect(result.code).toBe(1)
    // its create stays pending, stamped as sent: read as unanswered once its time is up, never as never sent
    expect(await orderRow('open-2')).toMatchObject({ trade_id: null, trade_create_state: 'pending' })
  })

  it('proposals create answered: names the proposal made, never "try again" [answer_not_recorded]', async () => {
    await moveNewOrder(database.db, { externalReference: 'prop-1', statuses: ['created', 'funded', 'disputed'], handlersFor: () => [], now: () => new Date() })
    const result = await cutWhileAtPlatform(['proposals', 'create', 'prop-1', '--party', 'seller', '--outcome', 'split', '--split-buyer-pct', '40'])
    expect(result.sent).toHaveLength(1)
    expect(result.stderr).not.toMatch(/try again/)
    expect(result.stderr).toMatch(/The platform did the proposal call on trade trd_prop-1: proposal pr_3 is pending\..*Do not send it again.* \[answer_not_recorded\]\n$/s)
    expect(result.code).toBe(1)
  })
})
