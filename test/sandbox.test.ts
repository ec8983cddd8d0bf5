import { createHmac } from 'node:crypto'
import http from 'node:http'
import { gzipSync } from 'node:zlib'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { answerEndlessly, MiB } from './helpers/endless-answer.js'
import { FakeClock } from './helpers/fake-clock.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { sandboxClient } from './helpers/sandbox-client.js'
import { startRecordingReceiver } from './helpers/sandbox-receiver.js'

const keyId = 'pk_sandbox_test'
const apiSecret = 'sandbox-api-secret-0123456789abcdef'
const webhookSecret = 'sandbox-webhook-secret-0123456789ab'
rememberSecret(apiSecret, webhookSecret)

// an independent signer written from the spec's formula, for requests the client would never send
function signed(method: string, path: string, body: string, { nonce = `n-${Math.random()}`, timestamp = Math.floor(Date.now() / 1000), secret = apiSecret, key = keyId } = {}) {
  const signature = createHmac('sha256', secret).update(`${method}.${path}.${timestamp}.${nonce}.${body}`).digest('hex')
  rememberSecret(signature)
  return {
    'content-type': 'application/json',
    'x-partner-key-id': key,
    'x-partner-timestamp': String(timestamp),
    'x-partner-nonce': nonce,
    'x-partner-signature': signature,
  }
}

describe('sandbox request authentication and validation', () => {
  let sandbox: Sandbox
  let base: string
  let client: PartnerApiClient
  const call = async (method: string, path: string, body = '', options = {}) => {
    const response = await fetch(`${base}${path}`, {
      method,
      headers: signed(method, path, body, options),
      ...(method === 'GET' ? {} : { body }),
    })
    return { status: response.status, body: (await response.json()) as { error?: { code: string; fields?: { field: string }[] } } & Record<string, unknown> }
  }

  beforeAll(async () => {
    sandbox = createSandbox({ keyId, apiSecret, webhookSecret, logger: testLogger([apiSecret, webhookSecret]) })
    base = await sandbox.listen(0)
    client = sandboxClient(base, { keyId, secret: apiSecret })
  })
  afterAll(async () => {
    await sandbox.close()
  })

  const trade = '{"title":"Bike","amount":"120.00","currency":"EUR","seller_id":"s-1","external_reference":"o-1"}'

  it('accepts a correctly signed request', async () => {
    expect((await call('POST', '/api/partner/v1/trades/', trade)).status).toBe(201)
  })

  it.each([
    ['missing_auth_headers', async () => (await fetch(`${base}/api/partner/v1/trades/x/`)).status],
    ['unknown_key', async () => (await call('GET', '/api/partner/v1/trades/x/', '', { key: 'pk_other' })).status],
    ['stale_timestamp', async () => (await call('GET', '/api/partner/v1/trades/x/', '', { timestamp: Math.floor(Date.now() / 1000) - 301 })).status],
    ['invalid_signature', async () => (await call('GET', '/api/partner/v1/trades/x/', '', { secret: 'not-the-api-secret-0123456789abcd' })).status],
  ])('refuses %s with 401', async (code, send) => {
    expect(await send()).toBe(401)
    const { body } = await call('GET', '/api/partner/v1/trades/x/', '', code === 'unknown_key' ? { key: 'pk_other' } : code === 'stale_timestamp' ? { timestamp: 1 } : code === 'invalid_signature' ? { secret: 'not-the-api-secret-0123456789abcd' } : {})
    if (code !== 'missing_auth_headers') expect(body.error?.code).toBe(code)
  })

  it('refuses a nonce used twice inside the window', async () => {
    const first = await call('POST', '/api/partner/v1/trades/', trade, { nonce: 'nonce-once' })
    expect(first.status).toBe(201)
    const again = await call('POST', '/api/partner/v1/trades/', trade, { nonce: 'nonce-once' })
    expect(again.status).toBe(401)
    expect(again.body.error?.code).toBe('replayed_nonce')
  })

  it('refuses a signature computed over other bytes than those sent', async () => {
    const path = '/api/partner/v1/trades/'
    const response = await fetch(`${base}${path}`, { method: 'POST', headers: signed('POST', path, trade), body: `${trade} ` })
    expect(response.status).toBe(401)
    expect(((await response.json()) as { error: { code: string } }).error.code).toBe('invalid_signature')
  })

  // what the signature does not cover: a query string, a GET's body (signed as the empty string), the letter case
  // and the closing slash of a path the spec writes one way
  const rawRequest = (method: string, pathAndQuery: string, headers: Record<string, string>, body = '') =>
    new Promise<{ status: number; code: string | undefined }>((resolve, reject) => {
      const length = { 'content-length': String(Buffer.byteLength(body)) }
      const request = http.request(`${base}${pathAndQuery}`, { method, headers: { ...headers, ...length } }, (response) => {
        const chunks: Buffer[] = []
        response.on('data', (chunk: Buffer) => chunks.push(chunk))
        response.on('end', () => {
          const parsed = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { error?: { code: string } }
          resolve({ status: response.statusCode!, code: parsed.error?.code })
        })
      })
      request.on('error', reject)
      request.end(body)
    })

  // the spec signs the exact bytes sent: a gzip body was checked against its decoded JSON, so a request signed over
  // the bytes on the wire was refused 401 and one signed over what they decode to created a trade
  it('refuses a body with a Content-Encoding, 415 unsupported_encoding, whichever bytes it is signed over', async () => {
    const path = '/api/partner/v1/trades/'
    const body = gzipSync(trade)
    const before = sandbox.trades().length
    for (const signedOver of [body.toString('latin1'), trade]) {
      const headers = signed('POST', path, '')
      const timestamp = headers['x-partner-timestamp']
      const nonce = headers['x-partner-nonce']
      const signature = createHmac('sha256', apiSecret).update(`POST.${path}.${timestamp}.${nonce}.`).update(Buffer.from(signedOver, 'latin1')).digest('hex')
      rememberSecret(signature)
      const response = await fetch(`${base}${path}`, {
        method: 'POST',
        headers: { ...headers, 'x-partner-signature': signature, 'content-encoding': 'gzip' },
        body,
      })
      expect(response.status).toBe(415)
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe('unsupported_encoding')
    }
    expect(sandbox.trades().length).toBe(before)
  })

  it('signs a GET over the empty body, and refuses a GET that carries one', async () => {
    const path = '/api/partner/v1/trades/x/'
    expect(await rawRequest('GET', path, signed('GET', path, 'smuggled'), 'smuggled')).toEqual({ status: 401, code: 'invalid_signature' })
    expect(await rawRequest('GET', path, signed('GET', path, ''), 'smuggled')).toEqual({ status: 400, code: 'body_not_allowed' })
    expect(await rawRequest('GET', path, signed('GET', path, ''))).toEqual({ status: 404, code: 'trade_not_found' })
  })

  it('refuses a body not labelled JSON (the spec sends Content-Type: application/json) 415, and creates nothing', async () => {
    const path = '/api/partner/v1/trades/'
    const before = sandbox.trades().length
    const labelled = (contentType: string | undefined) => {
      const { 'content-type': _json, ...headers } = signed('POST', path, trade)
      return contentType === undefined ? headers : { ...headers, 'content-type': contentType }
    }
    for (const contentType of [undefined, 'text/plain', 'application/x-www-form-urlencoded', 'application/json; charset=latin1', 'json']) {
      expect(await rawRequest('POST', path, labelled(contentType), trade), String(contentType)).toEqual({ status: 415, code: 'unsupported_media_type' })
    }
    expect(sandbox.trades().length).toBe(before)
    for (const contentType of ['application/json', 'Application/JSON; charset=UTF-8', 'application/json;charset=utf8']) {
      expect((await rawRequest('POST', path, labelled(contentType), trade)).status, contentType).toBe(201)
    }
    // a body-less operation needs no label, and an unsigned request is refused 401 before its label is looked at
    const fund = '/api/partner/v1/trades/x/fund/'
    const { 'content-type': _json, ...unlabelled } = signed('POST', fund, '')
    expect(await rawRequest('POST', fund, unlabelled)).toEqual({ status: 404, code: 'trade_not_found' })
    expect(await rawRequest('POST', path, { 'content-type': 'text/plain' }, trade)).toEqual({ status: 401, code: 'missing_auth_headers' })
  })

  it('refuses a query string, which no operation takes and the signature does not cover', async () => {
    const path = '/api/partner/v1/trades/'
    expect(await rawRequest('POST', `${path}?amount=1`, signed('POST', path, trade), trade)).toEqual({ status: 400, code: 'query_not_allowed' })
  })

  it.each(['/API/PARTNER/V1/TRADES/', '/api/partner/v1/TRADES/', '/api/partner/v1/trades'])('does not take %s for the path the spec writes', async (path) => {
    expect(await rawRequest('POST', path, signed('POST', path, trade), trade)).toEqual({ status: 404, code: 'not_found' })
  })

  it('names every invalid field of a trade, and requires a seller from a marketplace partner', async () => {
    const { status, body } = await call('POST', '/api/partner/v1/trades/', '{"amount":"-1","buyer_phone":"0612"}')
    expect(status).toBe(422)
    expect(body.error?.code).toBe('validation_failed')
    expect(body.error?.fields?.map((f) => f.field)).toEqual(['title', 'amount', 'currency', 'external_reference', 'seller_id', 'buyer_phone'])
  })

  it('refuses a short dispute reason, a missing party, a bad outcome, a same-party answer and a move the status forbids', async () => {
    const created = await client.createTrade({ title: 'T', amount: '10', currency: 'EUR', seller_id: 's', external_reference: 'r-2' })
    const id = created.trade_id
    const tradePath = `/api/partner/v1/trades/${id}`
    expect((await call('POST', `${tradePath}/release/`, '{}')).body.error?.code).toBe('invalid_state')
    expect((await call('POST', `${tradePath}/dispute/`, '{"reason":"too short","party":"buyer"}')).body.error?.fields).toEqual([
      { field: 'reason', message: 'is required and must be at least 20 characters' },
    ])
    await client.fundTrade(id)
    const noParty = await call('POST', `${tradePath}/dispute/`, '{"reason":"the parcel never arrived at all"}')
    expect(noParty.status).toBe(422)
    expect(noParty.body.error?.fields?.map((f) => f.field)).toEqual(['party'])
    await client.openDispute(id, { reason: 'the parcel never arrived at all', party: 'buyer' })
    const badOutcome = await call('POST', `${tradePath}/proposals/`, '{"outcome":"coin_flip","party":"buyer"}')
    expect(badOutcome.body.error?.fields?.map((f) => f.field)).toEqual(['outcome'])
    const noPct = await call('POST', `${tradePath}/proposals/`, '{"outcome":"split","party":"buyer"}')
    expect(noPct.body.error?.fields?.map((f) => f.field)).toEqual(['split_buyer_pct'])
    const proposal = await client.createProposal(id, { outcome: 'buyer_win', party: 'buyer' })
    const same = await call('POST', `${tradePath}/proposals/${proposal.proposal_id}/respond/`, '{"accept":true,"party":"buyer"}')
    expect(same.status).toBe(409)
    expect(same.body.error?.code).toBe('same_party')
    expect((await call('POST', `${tradePath}/cancel/`, '{}')).status).toBe(409)
    expect((await call('GET', '/api/partner/v1/trades/trd_missing/')).status).toBe(404)
  })
})

describe('sandbox webhook delivery', () => {
  it('retries a failing receiver with exponential backoff: 5 failures then success is 6 attempts, 6 ids', async () => {
    const clock = new FakeClock()
    const receiver = await startRecordingReceiver(webhookSecret, (count) => (count <= 5 ? 500 : 200))
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, webhookUrl: receiver.url, clock, retryBaseDelayMs: 1_000, logger: testLogger() })
    try {
      sandbox.sellerStatus('s-9', 'verified')
      for (let attempt = 1; attempt <= 6; attempt++) {
        await waitFor(() => receiver.received.length === attempt)
        if (attempt < 6) {
          await waitFor(() => clock.pendingSleepers === 1)
          await clock.advance(1_000 * 2 ** (attempt - 1))
        }
      }
      await sandbox.idle()
      expect(receiver.received).toHaveLength(6)
      expect(new Set(receiver.received.map((webhook) => webhook.deliveryId)).size).toBe(6)
      expect(receiver.received.every((webhook) => webhook.signatureValid)).toBe(true)
      expect(clock.sleeps).toEqual([1_000, 2_000, 4_000, 8_000, 16_000])
      expect(receiver.received[0]!.body).toEqual({ event: 'seller.verified', seller_id: 's-9', status: 'verified' })
    } finally {
      await receiver.close()
    }
  })

  it('counts a redirect as a failed attempt and never follows it to the address it names', async () => {
    const clock = new FakeClock()
    const elsewhere = await startRecordingReceiver(webhookSecret)
    const server = http.createServer((request, response) => {
      request.resume()
      request.on('end', () => response.writeHead(307, { location: elsewhere.url }).end())
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const webhookUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, webhookUrl, clock, retryBaseDelayMs: 10, logger: testLogger() })
    try {
      sandbox.sellerStatus('s-7', 'verified')
      await waitFor(() => clock.pendingSleepers === 1)
      // before, fetch followed the 307 and the signed delivery went to the other address, counted delivered
      expect(sandbox.deliveryLog).toMatchObject([{ attempt: 1, result: 'failed', httpStatus: 307 }])
      expect(elsewhere.received).toEqual([])
    } finally {
      server.closeAllConnections()
      server.close()
      await elsewhere.close()
    }
  })

  it('gives up after 6 attempts to a receiver that always fails', async () => {
    const clock = new FakeClock()
    const receiver = await startRecordingReceiver(webhookSecret, () => 503)
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, webhookUrl: receiver.url, clock, retryBaseDelayMs: 10, logger: testLogger() })
    try {
      sandbox.sellerStatus('s-1', 'verified')
      for (let i = 0; i < 5; i++) {
        await waitFor(() => clock.pendingSleepers === 1)
        await clock.advance(10_000)
      }
      await sandbox.idle()
      expect(receiver.received).toHaveLength(6)
      expect(sandbox.deliveryLog.map((attempt) => attempt.attempt)).toEqual([1, 2, 3, 4, 5, 6])
    } finally {
      await receiver.close()
    }
  })

  it('reads a receiver\'s answer only so far: a 200 with a body without end counts as delivered, its connection closed', async () => {
    let written = -1
    const server = http.createServer((request, response) => {
      request.resume()
      request.on('end', () => answerEndlessly(response, (bytes) => (written = bytes)))
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const webhookUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, webhookUrl, logger: testLogger() })
    try {
      sandbox.sellerStatus('s-1', 'verified')
      await sandbox.idle()
      expect(sandbox.deliveryLog).toMatchObject([{ attempt: 1, result: 'delivered', httpStatus: 200 }])
      // the connection was closed with most of the 256 MiB unsent: what was written is what the kernel's
      // buffers hold beyond the little the sandbox read
      await waitFor(() => written >= 0)
      expect(written).toBeLessThan(32 * MiB)
    } finally {
      server.closeAllConnections()
      server.close()
    }
  })

  it('injects the same faults for the same seed', async () => {
    const runOnce = async () => {
      const receiver = await startRecordingReceiver(webhookSecret)
      const sandbox = createSandbox({
        keyId,
        apiSecret,
        webhookSecret,
        webhookUrl: receiver.url,
        faults: { dropRate: 0.3, duplicateRate: 0.2, reorderRate: 0.2, seed: 7 },
        logger: testLogger(),
      })
      for (let i = 0; i < 40; i++) sandbox.sellerStatus(`s-${i}`, 'verified')
      await sandbox.idle()
      await receiver.close()
      return sandbox.deliveryLog.map((attempt) => `${attempt.status}:${attempt.result}`).sort()
    }
    const first = await runOnce()
    expect(first.filter((entry) => entry.endsWith('dropped')).length).toBeGreaterThan(3)
    expect(first.filter((entry) => entry.endsWith('duplicate')).length).toBeGreaterThan(1)
    expect(await runOnce()).toEqual(first)
  })
})

describe('the client drives the sandbox through whole lifecycles', () => {
  let sandbox: Sandbox
  let receiver: Awaited<ReturnType<typeof startRecordingReceiver>>
  let client: PartnerApiClient

  beforeAll(async () => {
    receiver = await startRecordingReceiver(webhookSecret)
    sandbox = createSandbox({ keyId, apiSecret, webhookSecret, webhookUrl: receiver.url, refundDelayMs: 5, logger: testLogger() })
    const base = await sandbox.listen(0)
    client = sandboxClient(base, { keyId, secret: apiSecret })
  })
  afterAll(async () => {
    await sandbox.close()
    await receiver.close()
  })

  const statusesSent = (tradeId: string) =>
    // each event is delivered on its own, so arrival order is not part of the contract
    receiver.received
      .filter((webhook) => webhook.body.trade_id === tradeId)
      .map((webhook) => String(webhook.body.status))
      .sort()
  const base = { amount: '100.00', currency: 'EUR', seller_id: 'seller-1' }

  it('runs a plain trade: create, fund, deliver, release', async () => {
    const trade = await client.createTrade({ ...base, title: 'Plain', external_reference: 'plain-1' })
    await client.fundTrade(trade.trade_id)
    await client.deliverTrade(trade.trade_id)
    expect((await client.releaseTrade(trade.trade_id)).status).toBe('released')
    await sandbox.idle()
    expect(statusesSent(trade.trade_id)).toEqual(['created', 'funded', 'delivered', 'released'].sort())
    expect(Object.keys(receiver.received.find((w) => w.body.trade_id === trade.trade_id)!.body).sort()).toEqual([
      'external_reference',
      'reference',
      'status',
      'trade_id',
    ])
  })

  it('runs a milestone trade with three milestones, released with the last one', async () => {
    const trade = await client.createTrade({
      ...base,
      // the milestones add up to the amount
      amount: '30.00',
      title: 'Milestones',
      external_reference: 'ms-1',
      milestones: [1, 2, 3].map((n) => ({ title: `Part ${n}`, amount: '10.00' })),
    })
    await client.fundTrade(trade.trade_id)
    for (const [index, milestone] of trade.milestones!.entries()) {
      await client.deliverMilestone(trade.trade_id, milestone.milestone_id)
      const after = await client.releaseMilestone(trade.trade_id, milestone.milestone_id)
      expect(after).toMatchObject({ record: 'trade', trade: { status: index < 2 ? 'funded' : 'released' } })
    }
    await sandbox.idle()
    expect((await client.getTrade(trade.trade_id)).milestones!.map((m) => m.status)).toEqual(['released', 'released', 'released'])
    expect(statusesSent(trade.trade_id)).toEqual(['created', 'funded', 'released'].sort())
  })

  it('cancels a funded trade: cancelled, then refunded', async () => {
    const trade = await client.createTrade({ ...base, title: 'Cancel', external_reference: 'cancel-1' })
    await client.fundTrade(trade.trade_id)
    expect((await client.cancelTrade(trade.trade_id)).status).toBe('cancelled')
    await sandbox.idle()
    expect((await client.getTrade(trade.trade_id)).status).toBe('refunded')
    expect(statusesSent(trade.trade_id)).toEqual(['created', 'funded', 'cancelled', 'refunded'].sort())
  })

  it('resolves a dispute: a split proposal rejected, then another accepted by the other party', async () => {
    const trade = await client.createTrade({ ...base, title: 'Dispute', external_reference: 'dispute-1' })
    await client.fundTrade(trade.trade_id)
    await client.deliverTrade(trade.trade_id)
    const dispute = await client.openDispute(trade.trade_id, { reason: 'the item arrived damaged in transit', party: 'buyer', category: 'damaged' })
    expect(dispute.status).toBe('open')
    const first = await client.createProposal(trade.trade_id, { outcome: 'split', split_buyer_pct: '80', party: 'buyer' })
    const rejected = await client.respondToProposal(trade.trade_id, first.proposal_id, { accept: false, party: 'seller' })
    expect(rejected.trade.status).toBe('disputed')
    const second = await client.createProposal(trade.trade_id, { outcome: 'split', split_buyer_pct: '40', party: 'seller' })
    const accepted = await client.respondToProposal(trade.trade_id, second.proposal_id, { accept: true, party: 'buyer' })
    expect(accepted.trade.status).toBe('resolved')
    expect(accepted.trade.resolution).toMatchObject({ outcome: 'split', buyer_pct: '40', seller_pct: '60' })
    await sandbox.idle()
    expect(statusesSent(trade.trade_id)).toEqual(['created', 'funded', 'delivered', 'disputed', 'resolved'].sort())
  })
})

async function waitFor(condition: () => boolean, timeoutMs = 5_000): Promise<void> {
  const started = Date.now()
  while (!condition()) {
    if (Date.now() - started > timeoutMs) throw new Error('condition not met in time')
    await new Promise((resolve) => setTimeout(resolve, 2))
  }
}
