// Milestone trades in the sandbox: the milestones are the trade's amount cut into parts (each release pays out
// its part), so their amounts must add up to it; and a dispute on a trade with a released milestone resolves
// only the funds still held, the released part staying the seller's.
import { createHmac } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import type { ProposalOutcome } from '../src/partner-api/types.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { sandboxClient } from './helpers/sandbox-client.js'

const keyId = 'pk_sandbox_milestones'
const apiSecret = 'sandbox-milestones-api-secret-012345'
const webhookSecret = 'sandbox-milestones-webhook-secret-0123'
rememberSecret(apiSecret, webhookSecret)

describe('sandbox milestone trades', () => {
  let sandbox: Sandbox
  let base: string
  let client: PartnerApiClient
  let counter = 0

  beforeAll(async () => {
    sandbox = createSandbox({ keyId, apiSecret, webhookSecret, logger: testLogger() })
    base = await sandbox.listen(0)
    client = sandboxClient(base, { keyId, secret: apiSecret })
  })
  afterAll(async () => {
    await sandbox.close()
  })

  // signed by hand, so that the sandbox's own answer is seen whatever the client checks first
  const milestoneTrade = (amount: string, milestones: { title: string; amount: string }[]) => ({
    title: 'Kitchen',
    amount,
    currency: 'EUR',
    seller_id: 's-1',
    external_reference: `milestones-${++counter}`,
    milestones,
  })

  async function create(amount: string, milestones: { title: string; amount: string }[]) {
    const path = '/api/partner/v1/trades/'
    const body = JSON.stringify(milestoneTrade(amount, milestones))
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
