// A create answered with a trade id the client itself refuses in a path ("..", ".", whitespace) is an invalid
// answer, handled as any invalid create answer: nothing is linked, the create is marked unknown (it may have made a
// trade), and `trades open` exits 1 with [outcome_unknown]. Stored, such an id made every later `trades fund` and
// `trades get` of the order exit 2 "Invalid request: trade_id: is not a valid platform id", as if the operator had
// mistyped, and the poller backed the order off for good. One stored by such a version now makes them exit 1
// [unusable_trade_id], saying it is the stored id that no request can carry, and sending nothing.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { orderByReference } from './helpers/reconcile-orders.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

let database: TestDatabase
let platform: RecordingServer
let context: CliContext
/** The trade id the platform answers a create with. */
let answeredTradeId = '..'

beforeAll(async () => {
  database = await createTestDatabase()
  platform = await startRecordingServer({
    secret: TEST_API_SECRET,
    answer: (request) => {
      const sent = JSON.parse(request.rawBody.toString('utf8') || '{}') as { external_reference?: string }
      return { status: 201, body: tradeRecord({ trade_id: answeredTradeId, external_reference: sent.external_reference ?? 'order-1' }) }
    },
  })
  context = { config: testConfig({ PARTNER_API_BASE_URL: platform.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
})
afterAll(async () => {
  await platform.close()
  await database.close()
})

const open = (reference: string) =>
  runCommandWith(['trades', 'open', reference, '--title', 'T', '--amount', '10.00', '--currency', 'EUR', '--seller', 's1'], context)

describe('trades open answered with a trade id no path can carry', () => {
  it.each([['..'], ['.'], ['   ']])('links nothing of trade id %j, marks the create unknown, and says [outcome_unknown]', async (tradeId) => {
    answeredTradeId = tradeId
    const reference = `ids-${platform.requests.length}`
    const result = await open(reference)
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toContain(
      'POST /api/partner/v1/trades/: the platform answered 201 with a body that is not the expected record ' +
        '(trade_id must be usable as a path segment (not blank, "." or "..", no lone surrogate, at most 200 characters))',
    )
    expect(result.stderr).toMatch(/ \[outcome_unknown\]\n$/)
    expect(await orderByReference(database.db, reference)).toMatchObject({ tradeId: null, tradeCreateState: 'unknown' })
  })

  it('leaves no id for trades fund and trades get to refuse as bad arguments: they say the order has no trade, exit 1', async () => {
    // an id no other order holds, so that the old code would have linked it
    answeredTradeId = '\t\t'
    await open('ids-later')
    const sent = platform.requests.length
    for (const command of ['fund', 'get']) {
      const result = await runCommandWith(['trades', command, 'ids-later'], context)
      expect(result.code).toBe(1)
      expect(result.stderr).toMatch(/^Order ids-later has no trade yet.* \[no_trade\]\n$/)
    }
    expect(platform.requests.length).toBe(sent)
  })

  it.each([['..'], ['   ']])('says a stored trade id %j is the order’s, not a bad argument: exit 1 [unusable_trade_id], nothing sent', async (stored) => {
    answeredTradeId = `trd_stored_${platform.requests.length}`
    const reference = `ids-stored-${platform.requests.length}`
    expect((await open(reference)).code).toBe(0)
    // what a version that took such an id from an answer or a webhook left in the table
    await database.db.updateTable('orders').set({ tradeId: stored }).where('externalReference', '=', reference).execute()
    const sent = platform.requests.length
    for (const command of ['fund', 'get']) {
      const result = await runCommandWith(['trades', command, reference], context)
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
      expect(result.stderr).toBe(
        `Order ${reference} is linked to the trade id ${JSON.stringify(stored)}, which no request can carry in its path ` +
          "(stored by a version that did not refuse it): nothing was sent, and this service cannot reach the order's " +
          "trade. Act on the trade in the platform's dashboard or through its support [unusable_trade_id]\n",
      )
    }
    expect(platform.requests.length).toBe(sent)
  })
})
