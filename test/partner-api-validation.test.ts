import { describe, expect, it } from 'vitest'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { PartnerValidationError } from '../src/partner-api/partner-api-error.js'
import type { CreateTradeRequest } from '../src/partner-api/types.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { scriptedFetch } from './helpers/partner-api-fake-fetch.js'
import { disputeRecord, proposalRecord, respondResult, tradeRecord } from './helpers/partner-api-fixtures.js'

const SECRET = 'apisec_validation_test_0a1b2c3d4e5f'
const logger = testLogger([SECRET])

function setup(kind: 'marketplace' | 'merchant' = 'marketplace') {
  const fake = scriptedFetch((call) => {
    if (call.url.endsWith('/respond/')) return { status: 200, body: respondResult() }
    if (call.url.endsWith('/proposals/')) return { status: 201, body: proposalRecord() }
    if (call.url.endsWith('/dispute/')) return { status: 201, body: disputeRecord() }
    return { status: 200, body: tradeRecord() }
  })
  const api = new PartnerApiClient({
    baseUrl: 'http://platform.test',
    keyId: 'pk_validation',
    secret: SECRET,
    env: 'sandbox',
    kind,
    timeoutMs: 1000,
    clock: new FakeClock(),
    logger,
    fetch: fake.fetch,
  })
  return { api, calls: fake.calls }
}

async function refusal(run: Promise<unknown>): Promise<PartnerValidationError> {
  const error: unknown = await run.catch((e: unknown) => e)
  expect(error).toBeInstanceOf(PartnerValidationError)
  return error as PartnerValidationError
}

const valid: CreateTradeRequest = {
  title: 'Used bicycle',
  amount: '120.00',
  currency: 'EUR',
  seller_id: 'seller_1',
  external_reference: 'order-1',
}

describe('request validation (nothing is sent when it fails)', () => {
  const createCases: [string, Record<string, unknown>, string][] = [
    ['title is missing', { title: undefined }, 'title'],
    ['title is blank', { title: '   ' }, 'title'],
    ['amount is missing', { amount: undefined }, 'amount'],
    ['amount is a number, not a decimal string', { amount: 12.5 }, 'amount'],
    ['amount has a sign', { amount: '-5.00' }, 'amount'],
    ['amount has a comma', { amount: '12,50' }, 'amount'],
    ['amount is zero', { amount: '0.00' }, 'amount'],
    ['currency is empty', { currency: '' }, 'currency'],
    ['external_reference is missing', { external_reference: undefined }, 'external_reference'],
    // the platform echoes it in every webhook and answer, where a longer one is refused
    ['external_reference is 201 characters', { external_reference: 'o'.repeat(201) }, 'external_reference'],
    ['external_reference holds a NUL', { external_reference: 'order-1\u0000' }, 'external_reference'],
    ['seller_id is missing for a marketplace partner', { seller_id: undefined }, 'seller_id'],
    ['buyer_phone lacks the leading plus', { buyer_phone: '004915112345678' }, 'buyer_phone'],
    ['buyer_phone holds spaces', { buyer_phone: '+49 151 12345678' }, 'buyer_phone'],
    ['milestones is an empty array', { milestones: [] }, 'milestones'],
    ['a milestone lacks its amount', { milestones: [{ title: 'Frame' }] }, 'milestones.0.amount'],
    [
      'a milestone amount is not a decimal',
      {
        milestones: [
          { title: 'a', amount: '1' },
          { title: 'b', amount: 'x' },
        ],
      },
      'milestones.1.amount',
    ],
    ['an unknown field is given', { sellerId: 'oops' }, 'sellerId'],
  ]
  for (const [name, change, field] of createCases) {
    it(`refuses a trade create naming ${field} when ${name}`, async () => {
      const { api, calls } = setup()
      const error = await refusal(api.createTrade({ ...valid, ...change } as unknown as CreateTradeRequest))
      expect(error.field).toBe(field)
      expect(error.message).toContain(field)
      expect(calls).toHaveLength(0)
    })
  }

  it('lets a merchant partner omit seller_id (the house seller) and sends the request as given', async () => {
    const { api, calls } = setup('merchant')
    const { seller_id: _omitted, ...request } = valid
    await api.createTrade({ ...request, milestones: [{ title: 'Frame', amount: '120.00' }] })
    expect(JSON.parse(calls[0]!.body!)).toEqual({
      ...request,
      milestones: [{ title: 'Frame', amount: '120.00' }],
    })
  })

  it('accepts a buyer phone in international format', async () => {
    const { api, calls } = setup()
    await api.createTrade({ ...valid, buyer_phone: '+4915112345678' })
    expect(calls).toHaveLength(1)
  })

  it('refuses a dispute whose reason is shorter than 20 characters, and accepts one of exactly 20', async () => {
    const { api, calls } = setup()
    const error = await refusal(api.openDispute('tr_1', { reason: 'x'.repeat(19), party: 'buyer' }))
    expect(error.field).toBe('reason')
    expect(calls).toHaveLength(0)
    await api.openDispute('tr_1', { reason: 'x'.repeat(20), party: 'buyer' })
    expect(calls).toHaveLength(1)
  })

  const partyCases: [string, (api: PartnerApiClient, party: unknown) => Promise<unknown>][] = [
    [
      'dispute',
      (api, party) => api.openDispute('tr_1', { reason: 'A reason that is long enough', party } as never),
    ],
    ['proposal', (api, party) => api.createProposal('tr_1', { outcome: 'buyer_win', party } as never)],
    ['respond', (api, party) => api.respondToProposal('tr_1', 'pr_1', { accept: true, party } as never)],
  ]
  for (const [name, run] of partyCases) {
    it(`refuses a ${name} without party, or with a party other than buyer or seller`, async () => {
      const { api, calls } = setup()
      expect((await refusal(run(api, undefined))).message).toContain('required')
      expect((await refusal(run(api, 'platform'))).field).toBe('party')
      expect(calls).toHaveLength(0)
    })
  }

  it('refuses an outcome other than buyer_win, seller_win or split', async () => {
    const { api } = setup()
    expect(
      (await refusal(api.createProposal('tr_1', { outcome: 'staff_decides', party: 'buyer' } as never)))
        .field,
    ).toBe('outcome')
  })

  it('requires split_buyer_pct between 0 and 100 for a split, and only for a split', async () => {
    const { api, calls } = setup()
    for (const pct of [undefined, '101', '-1', 'forty', '1e2']) {
      const error = await refusal(
        api.createProposal('tr_1', { outcome: 'split', split_buyer_pct: pct, party: 'buyer' }),
      )
      expect(error.field, String(pct)).toBe('split_buyer_pct')
    }
    const notSplit = await refusal(
      api.createProposal('tr_1', { outcome: 'buyer_win', split_buyer_pct: '40', party: 'buyer' }),
    )
    expect(notSplit.field).toBe('split_buyer_pct')
    expect(calls).toHaveLength(0)
    for (const pct of ['0', '100', '62.5'])
      await api.createProposal('tr_1', { outcome: 'split', split_buyer_pct: pct, party: 'buyer' })
    expect(calls).toHaveLength(3)
  })

  it('requires accept to be a boolean when responding to a proposal', async () => {
    const { api } = setup()
    expect(
      (await refusal(api.respondToProposal('tr_1', 'pr_1', { accept: 'yes', party: 'buyer' } as never)))
        .field,
    ).toBe('accept')
  })

  it('refuses empty or dot path ids, naming which', async () => {
    const { api, calls } = setup()
    expect((await refusal(api.getTrade(''))).field).toBe('trade_id')
    expect((await refusal(api.fundTrade('..'))).field).toBe('trade_id')
    expect((await refusal(api.releaseMilestone('tr_1', ' '))).field).toBe('milestone_id')
    expect((await refusal(api.respondToProposal('tr_1', '', { accept: false, party: 'seller' }))).field).toBe(
      'proposal_id',
    )
    expect(calls).toHaveLength(0)
  })

  // a milestone id of 100,000 characters was sent, and the server refused the request line 431
  it('refuses a path id over 200 characters before sending, naming which; 200 are sent', async () => {
    const { api, calls } = setup()
    const milestone = await refusal(api.deliverMilestone('tr_1', 'm'.repeat(100_000)))
    expect([milestone.field, milestone.message]).toEqual(['milestone_id', 'milestone_id: must be at most 200 characters (a platform id)'])
    expect((await refusal(api.respondToProposal('tr_1', 'p'.repeat(201), { accept: true, party: 'buyer' }))).field).toBe('proposal_id')
    expect(calls).toHaveLength(0)
    await api.releaseMilestone('tr_1', 'm'.repeat(200)).catch(() => undefined)
    expect(calls).toHaveLength(1)
  })

  // encodeURIComponent throws a plain URIError on a lone surrogate: the call failed untyped
  it('refuses a path id with a lone surrogate as a validation error, naming which', async () => {
    const { api, calls } = setup()
    const milestone = await refusal(api.deliverMilestone('tr_1', 'ms_\ud800'))
    expect([milestone.field, milestone.message]).toEqual(['milestone_id', 'milestone_id: is not a valid platform id'])
    expect((await refusal(api.respondToProposal('tr_1', 'p\udfff', { accept: true, party: 'buyer' }))).field).toBe('proposal_id')
    expect((await refusal(api.getTrade('tr_\udc00x'))).field).toBe('trade_id')
    // a pair is a character like any other
    await api.getTrade('tr_\ud83d\ude00')
    expect(calls).toHaveLength(1)
  })
})
