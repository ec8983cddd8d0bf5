// What the client accepts from the platform: a field or an enum value the platform adds never breaks a call
// (and is kept in the record), while a missing or mistyped field we rely on is an invalid_response naming
// the field, never the body.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { PartnerApiClient, type PartnerApiClientOptions } from '../src/partner-api/partner-api.client.js'
import { isOutcomeUnknown, PartnerInvalidResponseError } from '../src/partner-api/partner-api-error.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logLines, testLogger } from './helpers/log-sink.js'
import { scriptedFetch } from './helpers/partner-api-fake-fetch.js'
import { disputeRecord, milestoneRecord, proposalRecord, respondResult, tradeRecord } from './helpers/partner-api-fixtures.js'
import { type PlannedAnswer, type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'

const SECRET = 'apisec_responses_test_0b7d2e9f4a1c'
const logger = testLogger([SECRET])

function clientAnswering(body: unknown, overrides: Partial<PartnerApiClientOptions> = {}) {
  const scripted = scriptedFetch(() => ({ status: 200, body }))
  const api = new PartnerApiClient({
    baseUrl: 'http://platform.test',
    keyId: 'pk_responses',
    secret: SECRET,
    env: 'sandbox',
    kind: 'marketplace',
    timeoutMs: 5_000,
    clock: new FakeClock(),
    logger,
    random: () => 0.5,
    fetch: scripted.fetch,
    ...overrides,
  })
  return { api, calls: scripted.calls }
}

const createRequest = {
  title: 'Used bicycle',
  amount: '120.00',
  currency: 'EUR',
  seller_id: 'seller_1',
  external_reference: 'order-1',
}

const added = { platform_added_field: { nested: [1, 'two'] } }

const proposalWithAdditions = { ...proposalRecord(), ...added, party: 'platform_mediator', status: 'expired' }
const disputeWithAdditions = {
  ...disputeRecord(),
  ...added,
  status: 'escalated',
  proposals: [proposalWithAdditions],
}
const tradeWithAdditions = {
  ...tradeRecord(),
  ...added,
  status: 'on_hold',
  milestones: [{ milestone_id: 'ms_1', title: 'Frame', amount: '70.00', status: 'frozen', ...added }],
  dispute: disputeWithAdditions,
  resolution: { outcome: 'mediated', buyer_pct: '40', seller_pct: '60', ...added },
}

describe('PartnerApiClient answers: tolerant of what the platform adds', () => {
  it.each([
    ['a trade record (GET)', tradeWithAdditions, (api: PartnerApiClient) => api.getTrade('tr_1')],
    ['a trade record (create)', tradeWithAdditions, (api: PartnerApiClient) => api.createTrade(createRequest)],
    [
      'a trade record (milestone release)',
      tradeWithAdditions,
      (api: PartnerApiClient) =>
        api.releaseMilestone('tr_1', 'ms_1').then((answer) => (answer.record === 'trade' ? answer.trade : answer)),
    ],
    [
      'a dispute record',
      disputeWithAdditions,
      (api: PartnerApiClient) =>
        api.openDispute('tr_1', { reason: 'The frame arrived bent and scratched', party: 'buyer' }),
    ],
    [
      'a proposal record',
      proposalWithAdditions,
      (api: PartnerApiClient) => api.createProposal('tr_1', { outcome: 'buyer_win', party: 'seller' }),
    ],
    [
      'a respond result',
      { ...added, proposal: proposalWithAdditions, trade: tradeWithAdditions },
      (api: PartnerApiClient) => api.respondToProposal('tr_1', 'pr_1', { accept: true, party: 'buyer' }),
    ],
  ])('accepts %s with unknown fields and enum values, and keeps them all', async (_kind, body, run) => {
    const { api } = clientAnswering(body)
    // deep equality: every added field and unknown value survives, at every level
    expect(await run(api)).toEqual(body)
  })

  it('types a record by the fields it declares, at every depth, while the value keeps what the platform added', async () => {
    const { api } = clientAnswering(tradeWithAdditions)
    const trade = await api.getTrade('tr_1')
    // @ts-expect-error: a misspelt field does not compile (it read undefined while the records were typed loose)
    expect(trade.staus).toBeUndefined()
    // @ts-expect-error: nor one of a nested record
    expect(trade.dispute?.proposals?.[0]?.stauts).toBeUndefined()
    expect(trade.status).toBe(tradeWithAdditions.status)
    // a field the platform added is still there, read through a cast (README, "Partner API client")
    expect((trade as Record<string, unknown>)['platform_added_field']).toEqual(added.platform_added_field)
  })

  it('accepts a trade record with only the four fields the spec shows', async () => {
    const minimal = { trade_id: 'tr_1', reference: 'TRD-0001', status: 'funded', external_reference: 'order-1' }
    const { api } = clientAnswering(minimal)
    expect(await api.fundTrade('tr_1')).toEqual(minimal)
  })

  it('accepts ids that hold dots but are no dot segment, as a path takes them', async () => {
    const trade = tradeRecord({
      trade_id: 'tr.1',
      milestones: [{ milestone_id: '...', title: 'Frame', amount: '70.00', status: 'pending' }],
      dispute: disputeRecord({ dispute_id: '.dp', proposals: [proposalRecord({ proposal_id: 'pr..1' })] }),
    })
    expect(await clientAnswering(trade).api.getTrade('tr.1')).toEqual(trade)
  })

  // found from outside: a made trade was thrown away (its order marked unknown) over `"amount": 10.5`, a field the
  // service does not use, where the spec gives no type for it
  it('keeps a record whose fields the service does not use are of other types than assumed, as they came', async () => {
    const trade = {
      ...tradeRecord(),
      amount: 10.5,
      created_at: 1796546600,
      title: null,
      buyer_phone: { e164: '+4915112345678' },
      resolution: 'none',
      milestones: [{ milestone_id: 'ms_1', title: 7, amount: 70, status: 2 }],
      dispute: { dispute_id: 'dp_1', status: 1, party: ['buyer'], created_at: 0, proposals: [{ proposal_id: 'pr_1', status: true, outcome: 3 }] },
    }
    expect(await clientAnswering(trade).api.createTrade(createRequest)).toEqual(trade)
    expect(await clientAnswering({ milestone_id: 'ms_1', status: 2 }).api.deliverMilestone('tr_1', 'ms_1')).toEqual({
      record: 'milestone',
      milestone: { milestone_id: 'ms_1', status: 2 },
    })
  })

  it('accepts a dispute and a proposal that carry only their id', async () => {
    expect(
      await clientAnswering({ dispute_id: 'dp_9' }).api.openDispute('tr_1', {
        reason: 'The frame arrived bent and scratched',
        party: 'seller',
      }),
    ).toEqual({ dispute_id: 'dp_9' })
    expect(
      await clientAnswering({ proposal_id: 'pr_9' }).api.createProposal('tr_1', {
        outcome: 'seller_win',
        party: 'buyer',
      }),
    ).toEqual({ proposal_id: 'pr_9' })
  })
})

describe('PartnerApiClient answers: strict on the fields we rely on', () => {
  const withoutField = <T extends object>(record: T, field: keyof T) => {
    const copy: Partial<T> = { ...record }
    delete copy[field]
    return copy
  }
  const marker = 'marker-value-never-logged'
  const trade = tradeRecord({ title: marker })

  const respond = (api: PartnerApiClient) => api.respondToProposal('tr_1', 'pr_1', { accept: true, party: 'buyer' })
  const cases: [string, unknown, (api: PartnerApiClient) => Promise<unknown>, string, RegExp][] = [
    ['a trade without status', withoutField(trade, 'status'), (api) => api.getTrade('tr_1'), 'status', /is missing/],
    ['a trade whose status is a number', { ...trade, status: 20 }, (api) => api.fundTrade('tr_1'), 'status', /must be string/],
    ['a trade without trade_id', withoutField(trade, 'trade_id'), (api) => api.createTrade(createRequest), 'trade_id', /is missing/],
    ['a trade without reference', withoutField(trade, 'reference'), (api) => api.deliverTrade('tr_1'), 'reference', /is missing/],
    [
      'a trade without external_reference',
      withoutField(trade, 'external_reference'),
      (api) => api.releaseTrade('tr_1'),
      'external_reference',
      /is missing/,
    ],
    [
      'a milestone without its id',
      { ...trade, milestones: [{ title: marker, amount: '70.00', status: 'pending' }] },
      (api) => api.deliverMilestone('tr_1', 'ms_1'),
      'milestones.0.milestone_id',
      /is missing/,
    ],
    [
      'a dispute without dispute_id',
      withoutField(disputeRecord({ reason: marker }), 'dispute_id'),
      (api) => api.openDispute('tr_1', { reason: 'The frame arrived bent and scratched', party: 'buyer' }),
      'dispute_id',
      /is missing/,
    ],
    [
      'a proposal whose proposal_id is a number',
      { ...proposalRecord(), proposal_id: 7 },
      (api) => api.createProposal('tr_1', { outcome: 'buyer_win', party: 'seller' }),
      'proposal_id',
      /must be string/,
    ],
    [
      'a respond result whose trade has no status',
      { ...respondResult(), trade: withoutField(trade, 'status') },
      respond,
      'trade.status',
      /is missing/,
    ],
    ['a respond result without its proposal', { trade }, respond, 'proposal', /is missing/],
    // the four fields an observation stores are held to a webhook's rule: what a delivery could not store,
    // an answer cannot either (a 201-character status, a NUL Postgres's text refuses, an empty id)
    ['a trade whose status is 201 characters', { ...trade, status: 'x'.repeat(201) }, (api) => api.getTrade('tr_1'), 'status', /must be at most 200 characters/],
    ['a trade whose external_reference holds a NUL', { ...trade, external_reference: 'order-1\u0000' }, (api) => api.getTrade('tr_1'), 'external_reference', /must not hold a NUL character/],
    ['a trade whose external_reference holds a lone surrogate', { ...trade, external_reference: 'order-\ud800' }, (api) => api.getTrade('tr_1'), 'external_reference', /must not hold a lone surrogate/],
    ['a trade whose trade_id is empty', { ...trade, trade_id: '' }, (api) => api.fundTrade('tr_1'), 'trade_id', /must not be empty/],
    ['a trade whose reference is 3,000 characters', { ...trade, reference: 'R'.repeat(3_000) }, (api) => api.deliverTrade('tr_1'), 'reference', /must be at most 200 characters/],
    // an id the client later puts in a path is held to the rule it applies there: a trade id ".." was stored from a
    // create's answer, and every call on its order was then refused before sending, as if mistyped (exit 2)
    ['a trade whose trade_id is ".."', { ...trade, trade_id: '..' }, (api) => api.createTrade(createRequest), 'trade_id', /must be usable as a path segment \(not blank, "\." or "\.\.", no lone surrogate, at most 200 characters\)/],
    ['a trade whose trade_id is "."', { ...trade, trade_id: '.' }, (api) => api.getTrade('tr_1'), 'trade_id', /must be usable as a path segment/],
    ['a trade whose trade_id is whitespace', { ...trade, trade_id: ' \t ' }, (api) => api.fundTrade('tr_1'), 'trade_id', /must be usable as a path segment/],
    [
      'a milestone whose id is ".."',
      { ...trade, milestones: [{ milestone_id: '..', title: marker, amount: '70.00', status: 'pending' }] },
      (api) => api.deliverMilestone('tr_1', 'ms_1'),
      'milestones.0.milestone_id',
      /must be usable as a path segment/,
    ],
    // a lone surrogate has no UTF-8 to percent-encode: the later call threw a plain URIError
    [
      'a milestone whose id holds a lone surrogate',
      { ...trade, milestones: [{ milestone_id: 'ms_\ud800', title: marker, amount: '70.00', status: 'pending' }] },
      (api) => api.getTrade('tr_1'),
      'milestones.0.milestone_id',
      /no lone surrogate/,
    ],
    // one longer than a trade id may be is refused by the server before the platform reads it (431)
    [
      'a milestone whose id is 201 characters',
      { ...trade, milestones: [{ milestone_id: 'm'.repeat(201), title: marker, amount: '70.00', status: 'pending' }] },
      (api) => api.getTrade('tr_1'),
      'milestones.0.milestone_id',
      /at most 200 characters/,
    ],
    [
      'a proposal whose proposal_id holds a lone surrogate',
      { ...proposalRecord(), proposal_id: 'p\udfff' },
      (api) => api.createProposal('tr_1', { outcome: 'buyer_win', party: 'seller' }),
      'proposal_id',
      /no lone surrogate/,
    ],
    [
      'a trade whose dispute’s proposal id is "."',
      { ...trade, dispute: disputeRecord({ proposals: [proposalRecord({ proposal_id: '.' })] }) },
      (api) => api.getTrade('tr_1'),
      'dispute.proposals.0.proposal_id',
      /must be usable as a path segment/,
    ],
    [
      'a proposal whose proposal_id is whitespace',
      { ...proposalRecord(), proposal_id: '  ' },
      (api) => api.createProposal('tr_1', { outcome: 'buyer_win', party: 'seller' }),
      'proposal_id',
      /must be usable as a path segment/,
    ],
    [
      'a respond result whose proposal id is ".."',
      { ...respondResult(), proposal: proposalRecord({ proposal_id: '..' }) },
      respond,
      'proposal.proposal_id',
      /must be usable as a path segment/,
    ],
    [
      'a dispute whose dispute_id is ".."',
      disputeRecord({ dispute_id: '..', reason: marker }),
      (api) => api.openDispute('tr_1', { reason: 'The frame arrived bent and scratched', party: 'buyer' }),
      'dispute_id',
      /must be usable as a path segment/,
    ],
    ['a JSON array instead of a record', [trade], (api) => api.getTrade('tr_1'), '(body)', /must be an object/],
    ['JSON null', null, (api) => api.getTrade('tr_1'), '(body)', /must be an object/],
  ]

  it.each(cases)('answers invalid_response naming the field for %s', async (_kind, body, run, field, problem) => {
    const before = logLines.length
    const { api, calls } = clientAnswering(body)
    const error = (await run(api).catch((e) => e)) as PartnerInvalidResponseError
    expect(error).toBeInstanceOf(PartnerInvalidResponseError)
    expect(error).toMatchObject({ code: 'invalid_response', status: 200, field })
    expect(error.message).toContain(`(${field} `)
    expect(error.message).toMatch(problem)
    // the call may have taken effect: never a refusal
    expect(isOutcomeUnknown(error)).toBe(true)
    // neither the error nor any log line carries the body
    expect(error.message).not.toContain(marker)
    expect(logLines.slice(before).join('')).not.toContain(marker)
    // a GET answered with a bad record is not sent again: the platform answered, and would answer the same
    expect(calls).toHaveLength(1)
  })

  it('answers invalid_response for a record that nests deeper than any record of the API', async () => {
    const depth = 200_000
    const record = JSON.stringify({ trade_id: 'tr_1', reference: 'R', status: 'funded', external_reference: 'o' }).slice(0, -1)
    const error = await clientAnswering(`${record},"extra":${'['.repeat(depth)}${']'.repeat(depth)}}`)
      .api.getTrade('tr_1')
      .catch((e) => e)
    expect(error).toMatchObject({ code: 'invalid_response', field: '(body)' })
    expect(error.message).toContain('nests deeper than 64 levels')
    // a record nesting as deep as the limit is read
    const shallow = await clientAnswering(`${record},"extra":${'['.repeat(63)}${']'.repeat(63)}}`).api.getTrade('tr_1')
    expect(shallow.trade_id).toBe('tr_1')
  })

  it('answers invalid_response for a 2xx body that is not JSON, with the body left out of the message', async () => {
    const error = await clientAnswering('<html>marker-value-never-logged</html>')
      .api.getTrade('tr_1')
      .catch((e) => e)
    expect(error).toMatchObject({ code: 'invalid_response', field: '(body)' })
    expect(error.message).toContain('is not JSON')
    expect(error.message).not.toContain('marker-value-never-logged')
  })
})

// The spec answers a milestone deliver or release with "Milestone or trade record": the client takes either and
// says which came, told apart by a top-level milestone_id (a trade record holds its milestones in an array).
describe('PartnerApiClient milestone answers: the trade record or the milestone record, from a server', () => {
  let server: RecordingServer
  let planned: PlannedAnswer = { status: 200, body: {} }
  beforeAll(async () => {
    server = await startRecordingServer({ secret: SECRET, answer: () => planned })
  })
  afterAll(async () => {
    await server.close()
  })
  // over HTTP and on the real clock: the server checks each signature
  const api = () =>
    new PartnerApiClient({
      baseUrl: server.url,
      keyId: 'pk_responses',
      secret: SECRET,
      env: 'sandbox',
      kind: 'marketplace',
      timeoutMs: 5_000,
      clock: systemClock,
      logger,
    })
  const steps = [
    ['deliver', (client: PartnerApiClient) => client.deliverMilestone('tr_1', 'ms_1')],
    ['release', (client: PartnerApiClient) => client.releaseMilestone('tr_1', 'ms_1')],
  ] as const

  it.each(steps)('%s: takes the trade record, said to be the trade’s, with what the platform added', async (step, run) => {
    const trade = { ...tradeWithAdditions, milestones: [{ ...milestoneRecord({ status: `${step}ed` }), ...added }] }
    planned = { status: 200, body: trade }
    expect(await run(api())).toEqual({ record: 'trade', trade })
    expect(server.requests.at(-1)).toMatchObject({ path: `/api/partner/v1/trades/tr_1/milestones/ms_1/${step}/`, signatureValid: true })
  })

  it.each(steps)('%s: takes the milestone record, said to be the milestone’s, whole or with its id alone', async (_step, run) => {
    const whole = { ...milestoneRecord(), ...added, status: 'awaiting_inspection' }
    planned = { status: 200, body: whole }
    expect(await run(api())).toEqual({ record: 'milestone', milestone: whole })
    planned = { status: 200, body: { milestone_id: 'ms_1' } }
    expect(await run(api())).toEqual({ record: 'milestone', milestone: { milestone_id: 'ms_1' } })
    // a top-level milestone_id makes it the milestone's, whatever else it holds: its status is never a trade's
    const lookalike = { milestone_id: 'ms_1', trade_id: 'tr_1', reference: 'TRD-0001', status: 'delivered', external_reference: 'order-1' }
    planned = { status: 200, body: lookalike }
    expect(await run(api())).toEqual({ record: 'milestone', milestone: lookalike })
  })

  it('refuses a body that is neither record, and a malformed milestone record, as invalid_response naming the field', async () => {
    const marker = 'marker-value-never-logged'
    const cases: [unknown, string, RegExp][] = [
      // neither record: held to the trade's schema, as every answer was before
      [{ title: 'Frame', status: 'delivered', note: marker }, 'trade_id', /is missing/],
      [[milestoneRecord({ title: marker })], '(body)', /must be an object/],
      [tradeRecord({ title: marker, milestones: [{ title: 'Frame', amount: '70.00', status: 'delivered' } as never] }), 'milestones.0.milestone_id', /is missing/],
      // a milestone record, checked as one: the field named is the milestone's
      [{ milestone_id: 7, status: 'delivered', note: marker }, 'milestone_id', /must be string/],
      [{ milestone_id: null, note: marker }, 'milestone_id', /must be string/],
      [milestoneRecord({ title: marker, milestone_id: '..' }), 'milestone_id', /must be usable as a path segment/],
    ]
    const before = logLines.length
    for (const [body, field, problem] of cases) {
      planned = { status: 200, body }
      for (const [step, run] of steps) {
        const label = `${step} answered ${JSON.stringify(body)}`
        const error = (await run(api()).catch((e) => e)) as PartnerInvalidResponseError
        expect(error, label).toBeInstanceOf(PartnerInvalidResponseError)
        expect(error, label).toMatchObject({ code: 'invalid_response', status: 200, field })
        expect(error.message, label).toContain(`(${field} `)
        expect(error.message, label).toMatch(problem)
        expect(error.message, label).not.toContain(marker)
        // the milestone may have moved: never a refusal
        expect(isOutcomeUnknown(error), label).toBe(true)
      }
    }
    expect(logLines.slice(before).join('')).not.toContain(marker)
  })
})
