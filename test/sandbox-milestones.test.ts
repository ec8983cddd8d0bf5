// Milestone trades in the sandbox: the milestones are the trade's amount cut into parts (each release pays out
// its part), so their amounts must add up to it; and a dispute on a trade with a released milestone resolves
// only the funds still held, the released part staying the seller's. A milestone deliver or release answers the
// trade record, or, with milestoneAnswer 'milestone' (SANDBOX_MILESTONE_ANSWER), the milestone's own record.
import { createHmac } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import type { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import type { MilestoneAnswer, ProposalOutcome } from '../src/partner-api/types.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { openTradeForOrder } from '../src/trades/open-trade-for-order.js'
import { runTradeOperation } from '../src/trades/run-trade-operation.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { type PlatformLoop, startPlatformLoop } from './helpers/reconcile-sandbox.js'
import { sandboxClient } from './helpers/sandbox-client.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const keyId = 'pk_sandbox_milestones'
const apiSecret = 'sandbox-milestones-api-secret-012345'
const webhookSecret = 'sandbox-milestones-webhook-secret-0123'
rememberSecret(apiSecret, webhookSecret)

// signed by hand, so that the sandbox's own answer is seen whatever the client checks first
async function signedPost(base: string, path: string, payload: object) {
  const body = JSON.stringify(payload)
  const timestamp = Math.floor(Date.now() / 1000)
  const nonce = `n-${Math.random()}`
  const signature = createHmac('sha256', apiSecret).update(`POST.${path}.${timestamp}.${nonce}.${body}`).digest('hex')
  rememberSecret(signature)
  const response = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-partner-key-id': keyId,
      'x-partner-timestamp': String(timestamp),
      'x-partner-nonce': nonce,
      'x-partner-signature': signature,
    },
    body,
  })
  return { status: response.status, body: (await response.json()) as Record<string, unknown> }
}

// a milestone trade's create request, under a reference of its own
let counter = 0
const milestoneTrade = (amount: string, milestones: { title: string; amount: string }[]) => ({
  title: 'Kitchen',
  amount,
  currency: 'EUR',
  seller_id: 's-1',
  external_reference: `milestones-${++counter}`,
  milestones,
})

describe('sandbox milestone trades', () => {
  let sandbox: Sandbox
  let base: string
  let client: PartnerApiClient
  beforeAll(async () => {
    sandbox = createSandbox({ keyId, apiSecret, webhookSecret, logger: testLogger() })
    base = await sandbox.listen(0)
    client = sandboxClient(base, { keyId, secret: apiSecret })
  })
  afterAll(async () => {
    await sandbox.close()
  })

  async function create(amount: string, milestones: { title: string; amount: string }[]) {
    return signedPost(base, '/api/partner/v1/trades/', milestoneTrade(amount, milestones))
  }

  it.each([
    ['beyond the amount', '1', [{ title: 'a', amount: '1000' }]],
    ['short of the amount', '100.00', [{ title: 'a', amount: '10' }, { title: 'b', amount: '20' }]],
    ['a cent beyond it', '30.00', [{ title: 'a', amount: '10.00' }, { title: 'b', amount: '20.01' }]],
  ])('refuses milestones that add up to %s: 422 validation_failed on milestones, no trade', async (_name, amount, milestones) => {
    const before = sandbox.trades().length
    const { status, body } = await create(amount, milestones)
    expect(status).toBe(422)
    expect(body.error).toMatchObject({
      code: 'validation_failed',
      fields: [{ field: 'milestones', message: `amounts must add up to the trade amount ${amount}` }],
    })
    expect(sandbox.trades()).toHaveLength(before)
  })

  it('takes milestones that add up to the amount, whatever their decimals', async () => {
    const { status } = await create('120.00', [{ title: 'Frame', amount: '70' }, { title: 'Wheels', amount: '50.0' }])
    expect(status).toBe(201)
  })

  async function disputedAfterFirstRelease(amount: string, milestones: { title: string; amount: string }[]) {
    const trade = await client.createTrade(milestoneTrade(amount, milestones))
    const first = trade.milestones![0]!.milestone_id
    await client.fundTrade(trade.trade_id)
    await client.deliverMilestone(trade.trade_id, first)
    await client.releaseMilestone(trade.trade_id, first)
    await client.openDispute(trade.trade_id, { reason: 'The second part was never delivered', party: 'buyer' })
    return trade.trade_id
  }

  async function accepted(tradeId: string, outcome: ProposalOutcome, splitBuyerPct?: string) {
    const proposal = await client.createProposal(tradeId, {
      outcome,
      ...(splitBuyerPct === undefined ? {} : { split_buyer_pct: splitBuyerPct }),
      party: 'buyer',
    })
    return (await client.respondToProposal(tradeId, proposal.proposal_id, { accept: true, party: 'seller' })).trade
  }

  it('resolves buyer_win on what is still held: the released milestone stays the seller’s', async () => {
    const tradeId = await disputedAfterFirstRelease('30.00', [
      { title: 'a', amount: '10.00' },
      { title: 'b', amount: '20.00' },
    ])
    const trade = await accepted(tradeId, 'buyer_win')
    expect(trade.status).toBe('resolved')
    expect(trade.milestones!.map((milestone) => milestone.status)).toEqual(['released', 'pending'])
    expect(trade.resolution).toEqual({
      outcome: 'buyer_win',
      buyer_pct: '100',
      seller_pct: '0',
      held_amount: '20.00',
      buyer_amount: '20.00',
      seller_amount: '0.00',
    })
  })

  it('splits what is still held, the two shares adding up to it to the cent', async () => {
    const tradeId = await disputedAfterFirstRelease('100.00', [
      { title: 'a', amount: '90.00' },
      { title: 'b', amount: '10.00' },
    ])
    const trade = await accepted(tradeId, 'split', '33.33')
    expect(trade.resolution).toEqual({
      outcome: 'split',
      buyer_pct: '33.33',
      seller_pct: '66.67',
      held_amount: '10.00',
      buyer_amount: '3.33',
      seller_amount: '6.67',
    })
  })

  it('resolves a trade without milestones on its whole amount', async () => {
    const trade = await client.createTrade({ title: 'Bike', amount: '120.00', currency: 'EUR', seller_id: 's-1', external_reference: `milestones-${++counter}` })
    await client.fundTrade(trade.trade_id)
    await client.openDispute(trade.trade_id, { reason: 'The frame arrived bent and scratched', party: 'buyer' })
    expect((await accepted(trade.trade_id, 'seller_win')).resolution).toEqual({
      outcome: 'seller_win',
      buyer_pct: '0',
      seller_pct: '100',
      held_amount: '120.00',
      buyer_amount: '0.00',
      seller_amount: '120.00',
    })
  })
})

describe('sandbox milestone trades answered with the milestone record (milestoneAnswer: milestone)', () => {
  let sandbox: Sandbox
  let base: string
  let client: PartnerApiClient
  beforeAll(async () => {
    sandbox = createSandbox({ keyId, apiSecret, webhookSecret, milestoneAnswer: 'milestone', logger: testLogger() })
    base = await sandbox.listen(0)
    client = sandboxClient(base, { keyId, secret: apiSecret })
  })
  afterAll(async () => {
    await sandbox.close()
  })

  it('answers a milestone deliver and release with that milestone’s full record after the step, and nothing else', async () => {
    const trade = await client.createTrade(
      milestoneTrade('120.00', [
        { title: 'Frame', amount: '70.00' },
        { title: 'Wheels', amount: '50.00' },
      ]),
    )
    const [frame, wheels] = trade.milestones!.map((milestone) => milestone.milestone_id)
    await client.fundTrade(trade.trade_id)
    const path = (milestoneId: string, step: string) => `/api/partner/v1/trades/${trade.trade_id}/milestones/${milestoneId}/${step}/`

    const delivered = await signedPost(base, path(frame!, 'deliver'), {})
    expect(delivered).toEqual({ status: 200, body: { milestone_id: frame, title: 'Frame', amount: '70.00', status: 'delivered' } })
    expect(await client.releaseMilestone(trade.trade_id, frame!)).toEqual({
      record: 'milestone',
      milestone: { milestone_id: frame, title: 'Frame', amount: '70.00', status: 'released' },
    })
    // the trade moves as in trade mode: funded until the last release
    expect(sandbox.trade(trade.trade_id).status).toBe('funded')
    expect(await client.deliverMilestone(trade.trade_id, wheels!)).toEqual({
      record: 'milestone',
      milestone: { milestone_id: wheels, title: 'Wheels', amount: '50.00', status: 'delivered' },
    })
    const last = await signedPost(base, path(wheels!, 'release'), {})
    expect(last).toEqual({ status: 200, body: { milestone_id: wheels, title: 'Wheels', amount: '50.00', status: 'released' } })
    expect(sandbox.trade(trade.trade_id).status).toBe('released')
    // a refusal is the same as in trade mode
    expect(await signedPost(base, path(wheels!, 'release'), {})).toMatchObject({ status: 409, body: { error: { code: 'invalid_state' } } })
  })
})

describe('`sandbox --milestone-answer`', () => {
  it('refuses a record other than trade or milestone, exit 2, naming the option and the two it takes', async () => {
    const result = await runCommandWith(['sandbox', '--port', '0', '--milestone-answer', 'both'])
    expect(result.code).toBe(2)
    expect(result.stderr).toContain("option '--milestone-answer <record>' argument 'both' is invalid. Allowed choices are trade, milestone.")
    expect(result.stdout).toBe('')
  })
})

describe('a milestone trade through the trades service, the sandbox answering milestone records', () => {
  let database: TestDatabase
  let loop: PlatformLoop
  beforeAll(async () => {
    database = await createTestDatabase()
    loop = await startPlatformLoop(database.db, {}, { milestoneAnswer: 'milestone' })
  })
  afterAll(async () => {
    await loop.close()
    await database.close()
  })

  it('ends the order released through the webhooks, as no milestone record carries the trade’s status', async () => {
    const reference = 'milestone-answer-order-1'
    const trade = await openTradeForOrder(loop.trades, reference, {
      title: 'Kitchen',
      amount: '30.00',
      currency: 'EUR',
      seller_id: 's-1',
      milestones: [1, 2, 3].map((n) => ({ title: `Part ${n}`, amount: '10.00' })),
    })
    await runTradeOperation(loop.trades, reference, { kind: 'fund' })
    const answers: MilestoneAnswer[] = []
    for (const milestone of trade.milestones!) {
      const milestoneId = milestone.milestone_id
      answers.push(await runTradeOperation(loop.trades, reference, { kind: 'deliver_milestone', milestoneId }))
      answers.push(await runTradeOperation(loop.trades, reference, { kind: 'release_milestone', milestoneId }))
    }
    expect(answers.map((answer) => answer.record === 'milestone' && `${answer.milestone.milestone_id} ${answer.milestone.status}`)).toEqual(
      trade.milestones!.flatMap((milestone) => [`${milestone.milestone_id} delivered`, `${milestone.milestone_id} released`]),
    )
    await loop.sandbox.idle()
    const order = (await findOrderByExternalReference(database.db, reference))!
    // released by its webhook: no answer of the platform said so
    expect(order).toMatchObject({ tradeId: trade.trade_id, tradeStatus: 'released', statusSource: 'webhook' })
    const history = await database.db
      .selectFrom('orderStatusHistory')
      .select(['fromStatus', 'toStatus', 'source'])
      .where('orderId', '=', order.id)
      .orderBy('id')
      .execute()
    expect(history.map((row) => row.toStatus)).toEqual(['created', 'funded', 'released'])
    expect(history.at(-1)).toEqual({ fromStatus: 'funded', toStatus: 'released', source: 'webhook' })
  })
})
