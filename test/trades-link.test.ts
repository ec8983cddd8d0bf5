// `trades link REFERENCE TRADE_ID`: an order whose trade create got no answer and whose `trade.created` webhook was
// lost (flagged trade_create_unknown) is linked by hand to the trade an operator found on the platform. Run
// in-process through the CLI runner against the sandbox platform, which drops every webhook: the trade exists on the
// platform, and only the command can link it.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory, setTradeCreateState } from '../src/orders/order.repository.js'
import { flagUnresolvedCreates } from '../src/orders/poll-schedule.repository.js'
import type { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import type { Sandbox } from '../src/sandbox/create-sandbox.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { backdateCreateMark, createOrder, markCreateSent } from './helpers/orders.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { sandboxClient } from './helpers/sandbox-client.js'
import { type BeforeAnswer, type SandboxFront, startSandboxFront } from './helpers/sandbox-front.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

let database: TestDatabase
let sandbox: Sandbox
let front: SandboxFront
let platform: PartnerApiClient
let context: CliContext
/**
 * Run by the platform on a request before the sandbox answers it: what happens on our side while the call is out.
 * An answer it returns is the platform's instead of the sandbox's.
 */
let beforeAnswer: BeforeAnswer | undefined
const requests: { method: string; path: string }[] = []

beforeAll(async () => {
  database = await createTestDatabase()
  const logger = testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])
  // every webhook lost: the trade exists on the platform and nothing tells the receiver
  front = await startSandboxFront(logger, async (request) => {
    requests.push({ method: request.method!, path: request.url! })
    return beforeAnswer?.(request)
  })
  sandbox = front.sandbox
  platform = sandboxClient(front.url, { keyId: TEST_API_KEY_ID, secret: TEST_API_SECRET })
  context = { config: testConfig({ PARTNER_API_BASE_URL: front.url }), logger, db: database.db }
})
afterAll(async () => {
  await front.close()
  await database.close()
})
beforeEach(() => {
  beforeAnswer = undefined
})

let counter = 0
const reference = () => `link-order-${++counter}`

/** The order as `trades open` leaves it when the create got no answer, flagged by the poller's check. */
async function unresolvedOrder(externalReference: string): Promise<void> {
  const { order } = await createOrder(database.db, { externalReference })
  expect(await markCreateSent(database.db, order.id, 'none', { waitMs: 15_000 })).toBeDefined()
  await setTradeCreateState(database.db, order.id, 'unknown')
  await backdateCreateMark(database.db, order.id, 3_600_000)
  expect(await flagUnresolvedCreates(database.db, { unresolvedAfterS: 0, createWholeTimeMs: 15_000 })).toContain(externalReference)
}

/** A trade made on the platform for `externalReference` (the create the order never heard back from), moved on. */
async function tradeOnPlatform(externalReference: string, steps: ('fund' | 'deliver' | 'release')[] = []): Promise<string> {
  const trade = await platform.createTrade({
    title: 'Used bicycle',
    amount: '120.00',
    currency: 'EUR',
    seller_id: 's_1',
    external_reference: externalReference,
  })
  for (const step of steps) {
    if (step === 'fund') await platform.fundTrade(trade.trade_id)
    if (step === 'deliver') await platform.deliverTrade(trade.trade_id)
    if (step === 'release') await platform.releaseTrade(trade.trade_id)
  }
  return trade.trade_id
}

const link = (...args: string[]) => runCommandWith(['trades', 'link', ...args], context)
const orderOf = (externalReference: string) => findOrderByExternalReference(database.db, externalReference)
/** What a refusal must leave: the order as the unanswered create left it, still flagged. */
const UNRESOLVED = { tradeId: null, tradeStatus: null, tradeCreateState: 'unknown', attention: 'trade_create_unknown', nextPollAt: null }

describe('trades link', () => {
  it('links the trade, applies its status with a history row, clears the flag and schedules the next poll', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const tradeId = await tradeOnPlatform(ref, ['fund'])
    const { reference: tradeReference } = sandbox.trade(tradeId)
    expect(await orderOf(ref)).toMatchObject(UNRESOLVED)
    const clock = new FakeClock(Date.now())

    const result = await runCommandWith(['trades', 'link', ref, tradeId], { ...context, clock })
    expect(result.stderr).toBe('')
    expect(result.code).toBe(0)
    const nextPollAt = new Date(clock.now() + context.config.poll.staleAfterS * 1_000)
    expect(result.stdout).toBe(
      `${ref}: linked to trade ${tradeId} (${tradeReference}), funded on the platform\n` +
        `  flag trade_create_unknown cleared; next poll at ${nextPollAt.toISOString()}\n`,
    )
    expect(requests.at(-1)).toEqual({ method: 'GET', path: `/api/partner/v1/trades/${tradeId}/` })
    const order = await orderOf(ref)
    expect(order).toMatchObject({
      tradeId,
      tradeReference,
      tradeStatus: 'funded',
      statusSource: 'api',
      tradeCreateState: 'created',
      attention: null,
      nextPollAt,
    })
    expect(await orderHistory(database.db, order!.id)).toMatchObject([{ fromStatus: null, toStatus: 'funded', source: 'api' }])
  })

  it('prints the outcome, the order and the trade record with --json', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const tradeId = await tradeOnPlatform(ref)
    const result = await link(ref, tradeId, '--json')
    expect(result.code).toBe(0)
    const printed = JSON.parse(result.stdout)
    expect(printed).toMatchObject({
      outcome: 'linked',
      previousAttention: 'trade_create_unknown',
      order: { externalReference: ref, tradeId, tradeStatus: 'created', attention: null },
      trade: { trade_id: tradeId, external_reference: ref, status: 'created' },
    })
  })

  it('takes a trade in a terminal status off the poll schedule', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const tradeId = await tradeOnPlatform(ref, ['fund', 'deliver', 'release'])
    const result = await link(ref, tradeId)
    expect(result.code).toBe(0)
    expect(result.stdout).toContain(', released on the platform\n  flag trade_create_unknown cleared; not polled (a terminal status)\n')
    expect(await orderOf(ref)).toMatchObject({ tradeId, tradeStatus: 'released', attention: null, nextPollAt: null })
  })

  it('exits 1 with [order_not_found] for a reference no order has, and sends nothing', async () => {
    const before = requests.length
    const result = await link('link-no-such-order', 'trd_000001')
    expect(result.code).toBe(1)
    expect(result.stderr).toBe('No order with external reference link-no-such-order [order_not_found]\n')
    expect(requests.length).toBe(before)
  })

  it('exits 0 saying so, and changes nothing, when the order has this trade already', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const tradeId = await tradeOnPlatform(ref, ['fund'])
    expect((await link(ref, tradeId)).code).toBe(0)
    const linked = await orderOf(ref)
    const before = requests.length

    const again = await link(ref, tradeId)
    expect(again.stderr).toBe('')
    expect(again.code).toBe(0)
    expect(again.stdout).toBe(`${ref}: already linked to trade ${tradeId} (funded): nothing changed\n`)
    expect(requests.length).toBe(before)
    expect(await orderOf(ref)).toEqual(linked)
    expect(await orderHistory(database.db, linked!.id)).toHaveLength(1)
  })

  it('exits 1 with [trade_exists] when the order has another trade, and sends nothing', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const first = await tradeOnPlatform(ref, ['fund'])
    const second = await tradeOnPlatform(ref)
    expect((await link(ref, first)).code).toBe(0)
    const linked = await orderOf(ref)
    const before = requests.length

    const result = await link(ref, second)
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(`Order ${ref} already has trade ${first} (funded) [trade_exists]\n`)
    expect(requests.length).toBe(before)
    expect(await orderOf(ref)).toEqual(linked)
  })

  it('exits 1 with [answer_mismatch] and links nothing when the trade names another external reference', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const othersTrade = await tradeOnPlatform('link-someone-else', ['fund'])
    const result = await link(ref, othersTrade)
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(
      `The platform answered for order ${ref} (trade ${othersTrade}) with the record of trade ${othersTrade} for ` +
        'external reference link-someone-else: another trade or order. Nothing was linked, and a GET changes nothing ' +
        'on the platform: check the trade id. [answer_mismatch]\n',
    )
    expect(await orderOf(ref)).toMatchObject(UNRESOLVED)
  })

  it('exits 1 with [answer_mismatch] and links nothing when the platform answers the record of another trade', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const tradeId = await tradeOnPlatform(ref, ['fund'])
    // another trade of the same order's reference: linked, it would pass for the one the operator named
    const another = await tradeOnPlatform(ref)
    beforeAnswer = async () => ({ status: 200, body: sandbox.trade(another) })
    const result = await link(ref, tradeId)
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(
      `The platform answered for order ${ref} (trade ${tradeId}) with the record of trade ${another} for external ` +
        `reference ${ref}: another trade or order. Nothing was linked, and a GET changes nothing on the platform: ` +
        'check the trade id. [answer_mismatch]\n',
    )
    expect(await orderOf(ref)).toMatchObject(UNRESOLVED)
  })

  it('exits 1 with [not_found] and links nothing when the platform does not know the trade', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const result = await link(ref, 'trd_no_such_trade')
    expect(result.code).toBe(1)
    expect(result.stderr).toMatch(/^The platform refused \(404 [a-z_]+\)/)
    expect(result.stderr).toContain(`[not_found]\n  Nothing was linked: order ${ref} is as it was.\n`)
    expect(requests.at(-1)).toEqual({ method: 'GET', path: '/api/partner/v1/trades/trd_no_such_trade/' })
    expect(await orderOf(ref)).toMatchObject(UNRESOLVED)
  })

  it.each([
    ['a dot segment', '..', 'is not a valid platform id'],
    ['a dot', '.', 'is not a valid platform id'],
    ['a blank id', ' ', 'is required (a platform id)'],
  ])('exits 2 for %s as the trade id, sending nothing and changing nothing', async (_, tradeId, problem) => {
    const ref = reference()
    await unresolvedOrder(ref)
    const before = requests.length
    const result = await link(ref, tradeId)
    expect(result.code).toBe(2)
    expect(result.stderr).toBe(`Invalid request: trade_id: ${problem} [invalid_arguments]\n`)
    expect(requests.length).toBe(before)
    expect(await orderOf(ref)).toMatchObject(UNRESOLVED)
  })

  it('exits 1 with [trade_linked_elsewhere] when another order holds the trade', async () => {
    const ref = reference()
    await unresolvedOrder(ref)
    const tradeId = await tradeOnPlatform(ref)
    // a link only a hand-made row can have: the trade's own record names `ref`
    await insertOrders(database.db, [{ externalReference: `${ref}-holder`, tradeId, tradeStatus: 'created' }])
    const result = await link(ref, tradeId)
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(
      `Trade ${tradeId} is linked to order ${ref}-holder already, not to ${ref}: nothing was linked [trade_linked_elsewhere]\n`,
    )
    expect(await orderOf(ref)).toMatchObject(UNRESOLVED)
  })

  describe('with a webhook that links the order while the GET is at the platform', () => {
    const app = () => createApp({ config: context.config, db: database.db, logger: context.logger, clock: systemClock })

    it('exits 0 saying so when the webhook linked the same trade, which it applied', async () => {
      const ref = reference()
      await unresolvedOrder(ref)
      const tradeId = await tradeOnPlatform(ref, ['fund'])
      beforeAnswer = async () => {
        const delivered = await sendWebhook(app(), { body: tradePayload(ref, 'funded', tradeId) })
        expect(delivered.status).toBe(200)
      }
      const result = await link(ref, tradeId)
      expect(result.stderr).toBe('')
      expect(result.code).toBe(0)
      expect(result.stdout).toBe(`${ref}: already linked to trade ${tradeId} (funded): nothing changed\n`)
      const order = await orderOf(ref)
      expect(order).toMatchObject({ tradeId, tradeStatus: 'funded', statusSource: 'webhook', attention: null })
      expect(await orderHistory(database.db, order!.id)).toMatchObject([{ toStatus: 'funded', source: 'webhook' }])
    })

    it('exits 1 with [trade_exists] when the webhook linked another trade, which stays', async () => {
      const ref = reference()
      await unresolvedOrder(ref)
      const tradeId = await tradeOnPlatform(ref)
      beforeAnswer = async () => {
        const delivered = await sendWebhook(app(), { body: tradePayload(ref, 'funded', `${tradeId}-other`) })
        expect(delivered.status).toBe(200)
      }
      const result = await link(ref, tradeId)
      expect(result.code).toBe(1)
      expect(result.stderr).toBe(`Order ${ref} already has trade ${tradeId}-other (funded) [trade_exists]\n`)
      expect(await orderOf(ref)).toMatchObject({ tradeId: `${tradeId}-other`, tradeStatus: 'funded', statusSource: 'webhook' })
    })
  })
})
