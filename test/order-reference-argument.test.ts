// Every command that names an order by its external reference holds it to the rule `orders create` makes an order
// by (src/orders/external-reference.ts): one no order can have is refused as create refuses it, exit 2 and create's
// line, before anything is looked up or sent. `orders show` took a reference of any length and answered
// `order_not_found`; `trades open` refused it in other words. Over the real database (PGlite, and Postgres when
// TEST_DATABASE_URL is set), through the command line as the service runs it.
import { describe, expect, it } from 'vitest'
import { runCommand } from './helpers/cli-in-process.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'

const CREATE_REFUSAL =
  'Invalid order: external_reference: must be 1 to 200 characters without a NUL or a lone surrogate, as every webhook for the order carries it [invalid_arguments]\n'

// each command that takes a reference, with what else it needs to get as far as using it
const COMMANDS: [string, (reference: string) => string[]][] = [
  ['orders create', (reference) => ['orders', 'create', '--external-reference', reference]],
  ['orders show', (reference) => ['orders', 'show', reference]],
  ['orders show --json', (reference) => ['orders', 'show', reference, '--json']],
  ['deliveries dismiss', (reference) => ['deliveries', 'dismiss', reference]],
  ['trades open', (reference) => ['trades', 'open', reference, '--title', 'Bike', '--amount', '10.00', '--currency', 'EUR', '--seller', 'seller-1']],
  ['trades fund', (reference) => ['trades', 'fund', reference]],
  ['trades deliver', (reference) => ['trades', 'deliver', reference]],
  ['trades release', (reference) => ['trades', 'release', reference]],
  ['trades cancel', (reference) => ['trades', 'cancel', reference]],
  ['trades milestone deliver', (reference) => ['trades', 'milestone', 'deliver', reference, 'ms_1']],
  ['trades milestone release', (reference) => ['trades', 'milestone', 'release', reference, 'ms_1']],
  ['trades get', (reference) => ['trades', 'get', reference]],
  ['trades link', (reference) => ['trades', 'link', reference, 'tr_1']],
  ['disputes open', (reference) => ['disputes', 'open', reference, '--party', 'buyer', '--reason', 'the parcel never arrived here']],
  ['proposals create', (reference) => ['proposals', 'create', reference, '--party', 'buyer', '--outcome', 'buyer_win']],
  ['proposals respond', (reference) => ['proposals', 'respond', reference, 'pr_1', '--party', 'seller', '--accept']],
  ['reconcile --requeue', (reference) => ['reconcile', '--requeue', 'ref-ok', reference]],
]

describe('a command that names an order by a reference no order can have', () => {
  const database = useTestDatabase()
  const config = testConfig({ ORDER_REFERENCE_PATTERN: 'ORD-[0-9]+' })
  const cli = (args: string[]) => runCommand(args, database.db, config)

  it.each(COMMANDS)('%s refuses it as orders create does: exit 2, create’s line, nothing else', async (_name, command) => {
    for (const reference of ['r'.repeat(201), 'r'.repeat(70_000), '', 'order\u0000-1', 'order-\ud800']) {
      expect(await cli(command(reference))).toEqual({ code: 2, stdout: '', stderr: CREATE_REFUSAL })
    }
    expect(await database.db.selectFrom('orders').select('id').execute()).toEqual([])
  })

  it('finds an order whose reference is 200 characters, and one made before ORDER_REFERENCE_PATTERN was set', async () => {
    const longest = 'r'.repeat(200)
    expect((await cli(['orders', 'create', '--external-reference', `ORD-${'1'.repeat(196)}`])).code).toBe(0)
    await insertOrders(database.db, [
      { externalReference: longest, tradeId: null, tradeStatus: null },
      { externalReference: 'legacy-7', tradeId: null, tradeStatus: null },
    ])
    for (const reference of [`ORD-${'1'.repeat(196)}`, longest, 'legacy-7']) {
      const shown = await cli(['orders', 'show', reference, '--json'])
      expect(shown.code).toBe(0)
      expect(JSON.parse(shown.stdout)).toMatchObject({ externalReference: reference })
    }
    // the pattern is for a new order's reference only: create still refuses one it does not match
    expect(await cli(['orders', 'create', '--external-reference', 'legacy-8'])).toEqual({
      code: 2,
      stdout: '',
      stderr: 'Invalid order: external_reference: does not match ORDER_REFERENCE_PATTERN, the references this backend’s orders use [invalid_arguments]\n',
    })
  })
})
