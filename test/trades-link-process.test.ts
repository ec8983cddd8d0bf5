// `trades link` as an operator runs it: the compiled CLI as its own process (on embedded PGlite, and on Postgres
// through DATABASE_URL when TEST_DATABASE_URL is given), against the sandbox platform, which drops every webhook.
// The exit codes and lines are the command's contract; test/trades-link.test.ts covers each case in-process.
import type { Kysely } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { findOrderByExternalReference, setTradeCreateState } from '../src/orders/order.repository.js'
import { flagUnresolvedCreates } from '../src/orders/poll-schedule.repository.js'
import type { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { runCli } from './helpers/cli-process.js'
import { testLogger } from './helpers/log-sink.js'
import { backdateCreateMark, createOrder, markCreateSent } from './helpers/orders.js'
import { sandboxClient } from './helpers/sandbox-client.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'
import { postgresUrl } from './helpers/test-database.js'

let sandbox: Sandbox
let sandboxUrl: string
let platform: PartnerApiClient
const cleanups: (() => Promise<void>)[] = []

beforeAll(async () => {
  const logger = testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])
  sandbox = createSandbox({ keyId: TEST_API_KEY_ID, apiSecret: TEST_API_SECRET, webhookSecret: TEST_WEBHOOK_SECRET, faults: { dropRate: 1 }, logger })
  sandboxUrl = await sandbox.listen(0)
  platform = sandboxClient(sandboxUrl, { keyId: TEST_API_KEY_ID, secret: TEST_API_SECRET })
})
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup()
  await sandbox.close()
})

/** Orders as an unanswered create leaves them, flagged trade_create_unknown, and the environment of a CLI run on them. */
function seeded(kind: 'pglite' | 'postgres', references: string[]): Promise<{ env: Record<string, string>; read: Reader }> {
  const seed = async (db: Kysely<Database>) => {
    for (const externalReference of references) {
      const { order } = await createOrder(db, { externalReference })
      await markCreateSent(db, order.id, 'none', { waitMs: 15_000 })
      await setTradeCreateState(db, order.id, 'unknown')
      await backdateCreateMark(db, order.id, 3_600_000)
    }
    await flagUnresolvedCreates(db, { unresolvedAfterS: 0, createWholeTimeMs: 15_000 })
  }
  return seededCliDatabase(kind, { prefix: 'trades-link-', env: { PARTNER_API_BASE_URL: sandboxUrl }, seed, cleanups })
}

for (const kind of ['pglite', 'postgres'] as const) {
  const name = kind === 'postgres' ? 'on Postgres through DATABASE_URL (Postgres)' : 'on embedded PGlite'
  describe.skipIf(kind === 'postgres' && !postgresUrl)(`the compiled trades link, ${name}`, () => {
    it('links the trade (exit 0), says so when run again (exit 0), and refuses another order’s trade (exit 1)', async () => {
      const [ref, other] = [`link-process-${kind}`, `link-process-${kind}-other`]
      const { env, read } = await seeded(kind, [ref, other])
      const { trade_id: tradeId, reference } = await platform.createTrade({
        title: 'Used bicycle',
        amount: '120.00',
        currency: 'EUR',
        seller_id: 's_1',
        external_reference: ref,
      })
      await platform.fundTrade(tradeId)

      const linked = await runCli(['trades', 'link', ref, tradeId], env)
      expect(linked.stderr).toBe('')
      expect(linked.code).toBe(0)
      expect(linked.stdout).toMatch(
        new RegExp(`^${ref}: linked to trade ${tradeId} \\(${reference}\\), funded on the platform\n  flag trade_create_unknown cleared; next poll at \\S+Z\n$`),
      )
      const order = await read((db) => findOrderByExternalReference(db, ref))
      expect(order).toMatchObject({ tradeId, tradeStatus: 'funded', tradeCreateState: 'created', attention: null })
      expect(order!.nextPollAt).not.toBeNull()

      const again = await runCli(['trades', 'link', ref, tradeId], env)
      expect(again.code).toBe(0)
      expect(again.stdout).toBe(`${ref}: already linked to trade ${tradeId} (funded): nothing changed\n`)

      const refused = await runCli(['trades', 'link', other, tradeId], env)
      expect(refused.code).toBe(1)
      expect(refused.stderr).toMatch(/ \[answer_mismatch\]\n$/)
      expect(await read((db) => findOrderByExternalReference(db, other))).toMatchObject({
        tradeId: null,
        tradeCreateState: 'unknown',
        attention: 'trade_create_unknown',
      })
    })
  })
}
