// The spec's field rules, enforced alike by the client before sending and by the sandbox on receipt;
// the buyer onboarding event; and what the trades commands print about milestones.
import { createHmac } from 'node:crypto'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { listen, type RunningServer } from '../src/http/server.js'
import {
  characterCount,
  isLongEnoughReason,
  isPercentage,
  PHONE,
  percentageComplement,
} from '../src/partner-api/field-rules.js'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { PartnerValidationError } from '../src/partner-api/partner-api-error.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { taggedLogger, testLogger } from './helpers/log-sink.js'
import { eventually } from './helpers/reconcile-poller.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const CONTROL_TOKEN = 'sandbox-spec-control-token-0123456789'
const tenEmoji = '😀'.repeat(10)
const tenFlags = '🇩🇪'.repeat(10)
const tenFamilies = '👨‍👩‍👧'.repeat(10)

describe('field rules', () => {
  it('counts characters as a reader does: one per emoji, flag or family', () => {
    expect(tenEmoji.length).toBe(20)
    expect(characterCount(tenEmoji)).toBe(10)
    expect(characterCount(tenFlags)).toBe(10)
    expect(characterCount(tenFamilies)).toBe(10)
    expect(characterCount('é')).toBe(1)
    expect(characterCount('e\u0301')).toBe(1)
    expect(isLongEnoughReason(tenEmoji)).toBe(false)
    expect(isLongEnoughReason('😀'.repeat(20))).toBe(true)
    expect(isLongEnoughReason(`   ${'x'.repeat(19)}   `)).toBe(false)
    expect(isLongEnoughReason('x'.repeat(20))).toBe(true)
  })

  it.each([
    ['99.99', '0.01'],
    ['40', '60'],
    ['62.5', '37.5'],
    ['0', '100'],
    ['100', '0'],
    ['100.00', '0.00'],
    ['33.333', '66.667'],
    ['0.0001', '99.9999'],
  ])('complements %s%% to exactly %s%%', (percentage, complement) => {
    expect(percentageComplement(percentage)).toBe(complement)
  })

  it('complements any percentage exactly: the two add up to 100 in decimal', () => {
    const percentage = fc
      .tuple(fc.integer({ min: 0, max: 100 }), fc.integer({ min: 0, max: 6 }), fc.nat())
      .map(([whole, scale, fraction]) =>
        scale === 0 || whole === 100 ? String(whole) : `${whole}.${String(fraction % 10 ** scale).padStart(scale, '0')}`,
      )
    fc.assert(
      fc.property(percentage, (value) => {
        const complement = percentageComplement(value)
        const scale = value.split('.')[1]?.length ?? 0
        const units = (text: string) => BigInt(text.replace('.', ''))
        expect(complement.split('.')[1]?.length ?? 0).toBe(scale)
        expect(units(value) + units(complement)).toBe(100n * 10n ** BigInt(scale))
        expect(percentageComplement(complement)).toBe(value)
      }),
    )
  })

  it('bounds a percentage exactly, where a binary float would round 100.0000000000000001 down to 100', () => {
    expect(Number('100.0000000000000001') <= 100).toBe(true)
    expect(isPercentage('100.0000000000000001')).toBe(false)
    expect(isPercentage('100.000')).toBe(true)
    expect(isPercentage('-1')).toBe(false)
    expect(() => percentageComplement('101')).toThrow(RangeError)
  })

  it('takes a phone with +, a country code and 7 to 15 digits', () => {
    for (const phone of ['+2904123', '+4915112345678', '+123456789012345']) expect(PHONE.test(phone), phone).toBe(true)
    for (const phone of ['+12345', '+290412', '+0123456789', '+1234567890123456', '4915112345678', '+49 151 1234567']) {
      expect(PHONE.test(phone), phone).toBe(false)
    }
  })
})

// an independent signer from the spec's formula, to send the sandbox what the client would refuse
function signedHeaders(method: string, path: string, body: string) {
  const timestamp = Math.floor(Date.now() / 1000)
  const nonce = `n-${Math.random()}`
  const signature = createHmac('sha256', TEST_API_SECRET).update(`${method}.${path}.${timestamp}.${nonce}.${body}`).digest('hex')
  return {
    'content-type': 'application/json',
    'x-partner-key-id': TEST_API_KEY_ID,
    'x-partner-timestamp': String(timestamp),
    'x-partner-nonce': nonce,
    'x-partner-signature': signature,
  }
}

describe('the client and the sandbox agree on every field rule', () => {
  let sandbox: Sandbox
  let base: string
  let client: PartnerApiClient

  beforeAll(async () => {
    sandbox = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      logger: testLogger(),
    })
    base = await sandbox.listen(0)
    client = new PartnerApiClient({
      baseUrl: base,
      keyId: TEST_API_KEY_ID,
      secret: TEST_API_SECRET,
      env: 'sandbox',
      kind: 'marketplace',
      timeoutMs: 5_000,
      clock: systemClock,
      logger: testLogger(),
    })
  })
  afterAll(async () => {
    await sandbox.close()
  })

  // what the sandbox answers a request the client did not check first
  async function sandboxAccepts(path: string, body: Record<string, unknown>): Promise<boolean> {
    const raw = JSON.stringify(body)
    const response = await fetch(`${base}${path}`, { method: 'POST', headers: signedHeaders('POST', path, raw), body: raw })
    expect([200, 201, 422]).toContain(response.status)
    return response.status !== 422
  }

  async function clientAccepts(send: () => Promise<unknown>): Promise<boolean> {
    try {
      await send()
      return true
    } catch (error) {
      if (error instanceof PartnerValidationError) return false
      throw error
    }
  }

  let counter = 0
  const trade = (extra: Record<string, unknown> = {}) => ({
    title: 'Bike',
    amount: '120.00',
    currency: 'EUR',
    seller_id: 's-1',
    external_reference: `rules-${++counter}`,
    ...extra,
  })

  it.each([
    ['+12345', false],
    ['+290412', false],
    ['+0123456789', false],
    ['+1234567890123456', false],
    ['+2904123', true],
    ['+4915112345678', true],
  ])('buyer_phone %s: both accept = %s', async (phone, valid) => {
    expect(await sandboxAccepts('/api/partner/v1/trades/', trade({ buyer_phone: phone }))).toBe(valid)
    expect(await clientAccepts(() => client.createTrade(trade({ buyer_phone: phone })))).toBe(valid)
  })

  it.each([
    ['of 200 characters', true, 'r'.repeat(200)],
    ['of 201 characters', false, 'r'.repeat(201)],
    ['with a NUL', false, 'order\u00001'],
    // no UTF-8 text holds an unpaired surrogate: the receiver stored every webhook of such a trade as invalid
    ['with a lone high surrogate', false, 'sur\ud800x'],
    ['with a lone low surrogate', false, 'sur\udc00'],
    ['with an emoji (a surrogate pair)', true, 'order-😀'],
  ])('an external_reference %s: both accept = %s', async (_name, valid, reference) => {
    expect(await sandboxAccepts('/api/partner/v1/trades/', trade({ external_reference: reference }))).toBe(valid)
    expect(await clientAccepts(() => client.createTrade(trade({ external_reference: reference })))).toBe(valid)
  })

  it.each([
    ['ten emoji', tenEmoji, false],
    ['ten flags', tenFlags, false],
    ['ten families', tenFamilies, false],
    ['19 letters padded with spaces', `   ${'x'.repeat(19)}   `, false],
    ['twenty emoji', '😀'.repeat(20), true],
    ['twenty letters', 'The frame was bent.!', true],
  ])('a dispute reason of %s: both accept = %s', async (_name, reason, valid) => {
    const { trade_id: tradeId } = await client.createTrade(trade())
    await client.fundTrade(tradeId)
    const path = `/api/partner/v1/trades/${tradeId}/dispute/`
    expect(await sandboxAccepts(path, { reason, party: 'buyer' })).toBe(valid)
    if (valid) return // the first dispute moved the trade: a second one would be refused for its state
    expect(await clientAccepts(() => client.openDispute(tradeId, { reason, party: 'buyer' }))).toBe(valid)
  })

  it.each([
    ['100.0000000000000001', false],
    ['101', false],
    ['99.99', true],
    ['0', true],
  ])('split_buyer_pct %s: both accept = %s', async (percentage, valid) => {
    const { trade_id: tradeId } = await client.createTrade(trade())
    await client.fundTrade(tradeId)
    await client.openDispute(tradeId, { reason: 'The parcel never arrived here', party: 'buyer' })
    const proposal = { outcome: 'split', split_buyer_pct: percentage, party: 'buyer' } as const
    expect(await clientAccepts(() => client.createProposal(tradeId, proposal))).toBe(valid)
    if (valid) return // the proposal now waits for an answer: the sandbox would refuse a second for its state
    expect(await sandboxAccepts(`/api/partner/v1/trades/${tradeId}/proposals/`, proposal)).toBe(valid)
  })

  // found from outside: the sandbox made the proposal and dropped the share, and took fields of no request
  it('a share on an outcome other than split, and a field of no request: neither accepts', async () => {
    const { trade_id: tradeId } = await client.createTrade(trade())
    await client.fundTrade(tradeId)
    await client.openDispute(tradeId, { reason: 'The parcel never arrived here', party: 'buyer' })
    const proposals = `/api/partner/v1/trades/${tradeId}/proposals/`
    const sharedWin = { outcome: 'buyer_win', split_buyer_pct: '50', party: 'seller' } as const
    expect(await sandboxAccepts(proposals, sharedWin)).toBe(false)
    expect(await clientAccepts(() => client.createProposal(tradeId, sharedWin))).toBe(false)
    const extra = { outcome: 'buyer_win', party: 'seller', note: 'x' }
    expect(await sandboxAccepts(proposals, extra)).toBe(false)
    expect(await clientAccepts(() => client.createProposal(tradeId, extra as never))).toBe(false)
    expect(await sandboxAccepts('/api/partner/v1/trades/', trade({ foo: 1 }))).toBe(false)
    expect(await clientAccepts(() => client.createTrade(trade({ foo: 1 })))).toBe(false)
    const milestones = [{ title: 'All', amount: '120.00', due: 'tomorrow' }]
    expect(await sandboxAccepts('/api/partner/v1/trades/', trade({ milestones }))).toBe(false)
    expect(await clientAccepts(() => client.createTrade(trade({ milestones })))).toBe(false)
    // the same requests without the stray field are taken
    expect(await sandboxAccepts(proposals, { outcome: 'buyer_win', party: 'seller' })).toBe(true)
  })

  it('splits 99.99/0.01 exactly when the split is accepted', async () => {
    const { trade_id: tradeId } = await client.createTrade(trade())
    await client.fundTrade(tradeId)
    await client.openDispute(tradeId, { reason: 'The parcel never arrived here', party: 'buyer' })
    const proposal = await client.createProposal(tradeId, { outcome: 'split', split_buyer_pct: '99.99', party: 'seller' })
    const { trade: resolved } = await client.respondToProposal(tradeId, proposal.proposal_id, { accept: true, party: 'buyer' })
    expect(resolved.resolution).toEqual({
      outcome: 'split',
      buyer_pct: '99.99',
      seller_pct: '0.01',
      held_amount: '120.00',
      buyer_amount: '119.98',
      seller_amount: '0.02',
    })
  })
})

describe('buyer onboarding events (buyer.{status})', () => {
  let database: TestDatabase
  let receiver: RunningServer
  let sandbox: Sandbox
  let base: string

  beforeAll(async () => {
    database = await createTestDatabase()
    const config = testConfig()
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    receiver = await listen(app, { port: 0, host: '127.0.0.1' })
    sandbox = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      webhookUrl: `${receiver.url}${config.webhook.path}`,
      controlToken: CONTROL_TOKEN,
      logger: testLogger(),
    })
    base = await sandbox.listen(0)
  })
  afterAll(async () => {
    await sandbox.close()
    await receiver.stop(1_000)
    await database.close()
  })

  it('are sent from the control endpoint, signed, and stored by the receiver as ignored', async () => {
    const response = await fetch(`${base}/sandbox/buyers/b-42/status`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${CONTROL_TOKEN}` },
      body: '{"status":"verified"}',
    })
    expect(response.status).toBe(202)
    await sandbox.idle()
    const attempt = sandbox.deliveryLog.find((entry) => entry.event === 'buyer.verified')
    expect(attempt).toMatchObject({ result: 'delivered', httpStatus: 200 })
    await eventually(
      async () =>
        (await database.db.selectFrom('webhookDeliveries').select('deliveryId').where('deliveryId', '=', attempt!.deliveryId!).execute())
          .length === 1,
      'the delivery is stored',
    )
    const row = await database.db
      .selectFrom('webhookDeliveries')
      .selectAll()
      .where('deliveryId', '=', attempt!.deliveryId!)
      .executeTakeFirstOrThrow()
    expect(row).toMatchObject({ outcome: 'ignored', eventType: 'buyer.verified' })
    expect(JSON.parse(row.rawBody!)).toEqual({ event: 'buyer.verified', buyer_id: 'b-42', status: 'verified' })
  })

  it('refuses a status that is not one word', async () => {
    for (const body of ['{}', '{"status":""}', '{"status":"Verified Now"}']) {
      const response = await fetch(`${base}/sandbox/buyers/b-42/status`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${CONTROL_TOKEN}` },
        body,
      })
      expect(response.status, body).toBe(422)
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe('validation_failed')
    }
  })

  it('exist only for marketplace partners', async () => {
    const merchant = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      partnerKind: 'merchant',
      controlToken: CONTROL_TOKEN,
      logger: testLogger(),
    })
    const merchantBase = await merchant.listen(0)
    try {
      const response = await fetch(`${merchantBase}/sandbox/buyers/b-1/status`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${CONTROL_TOKEN}` },
        body: '{"status":"verified"}',
      })
      expect(response.status).toBe(409)
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe('not_marketplace')
      expect(() => merchant.buyerStatus('b-1', 'verified')).toThrow('only for Marketplace partners')
      expect(merchant.deliveryLog).toEqual([])
    } finally {
      await merchant.close()
    }
  })
})

describe('the trades commands against the sandbox', () => {
  let database: TestDatabase
  let sandbox: Sandbox
  let context: CliContext
  // the commands' own lines: another file's in the same worker are not theirs (log-sink.ts, taggedLogger)
  let own: ReturnType<typeof taggedLogger>

  beforeAll(async () => {
    database = await createTestDatabase()
    sandbox = createSandbox({
      keyId: TEST_API_KEY_ID,
      apiSecret: TEST_API_SECRET,
      webhookSecret: TEST_WEBHOOK_SECRET,
      logger: testLogger(),
    })
    const config = testConfig({ PARTNER_API_BASE_URL: await sandbox.listen(0), POLL_ENABLED: 'false' })
    own = taggedLogger([TEST_API_SECRET])
    context = { config, logger: own.logger, db: database.db }
  })
  afterAll(async () => {
    await sandbox.close()
    await database.close()
  })

  function cli(...args: string[]) {
    return runCommandWith(args, context)
  }

  it('print the milestone ids on open, and each milestone’s new status after deliver and release', async () => {
    const before = own.entries().length
    const opened = await cli(
      'trades', 'open', 'ms-order-1', '--title', 'Bicycle', '--amount', '120.00', '--currency', 'EUR',
      '--seller', 's-1', '--milestone', 'Frame:70.00', '--milestone', 'Wheels:50.00',
    )
    expect(opened.stderr).toBe('')
    expect(opened.code).toBe(0)
    const [frame, wheels] = sandbox.trades()[0]!.milestones!
    expect(opened.stdout).toContain(`  milestone ${frame!.milestone_id} Frame 70.00: pending\n`)
    expect(opened.stdout).toContain(`  milestone ${wheels!.milestone_id} Wheels 50.00: pending\n`)

    expect((await cli('trades', 'fund', 'ms-order-1')).code).toBe(0)
    const delivered = await cli('trades', 'milestone', 'deliver', 'ms-order-1', frame!.milestone_id)
    expect(delivered.code).toBe(0)
    expect(delivered.stdout).toMatch(new RegExp(`^ms-order-1: milestone ${frame!.milestone_id} \\(Frame\\) is delivered\n`))
    expect(delivered.stdout).toContain('is funded')
    const released = await cli('trades', 'milestone', 'release', 'ms-order-1', frame!.milestone_id)
    expect(released.stdout).toContain(`milestone ${frame!.milestone_id} (Frame) is released`)

    // one client per command, one logger: "ready" is info once, then debug
    const ready = own
      .entries()
      .slice(before)
      .filter((entry) => entry.msg === 'partner api client ready')
    expect(ready.map((entry) => entry.level)).toEqual([30, 20, 20, 20])
  })
})
