import { execFileSync } from 'node:child_process'
import { gzipSync } from 'node:zlib'
import request from 'supertest'
import { sign as octokitSign } from '@octokit/webhooks-methods'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { runCommand } from './helpers/cli-in-process.js'
import { createOrder } from './helpers/orders.js'
import { logEntries, rememberSecret, testLogger } from './helpers/log-sink.js'
import { TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, signBody, tradePayload } from './helpers/webhook-delivery.js'

const NEXT_SECRET = 'whsec_next_rotation_0123456789abcdef'
rememberSecret(NEXT_SECRET)
const config = testConfig({ WEBHOOK_SECRETS: `${TEST_WEBHOOK_SECRET},${NEXT_SECRET}`, WEBHOOK_BODY_LIMIT: '1kb' })

describe('the webhook contract', () => {
  let database: TestDatabase
  let app: App
  let counter = 0
  const reference = () => `order-${++counter}`

  const storedCount = async () =>
    Number(
      (
        await database.db
          .selectFrom('webhookDeliveries')
          .select((eb) => eb.fn.countAll<number>().as('n'))
          .executeTakeFirstOrThrow()
      ).n,
    )

  beforeAll(async () => {
    database = await createTestDatabase()
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
  })
  afterAll(async () => {
    await database.close()
  })

  let before = 0
  beforeEach(async () => {
    before = await storedCount()
  })

  it('answers 200 and applies a valid delivery to the order matched by external_reference', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const response = await sendWebhook(app, { body: tradePayload(ref, 'funded'), deliveryId: `dlv-${ref}` })
    expect(response.status).toBe(200)
    expect(response.body).toEqual({ received: true })
    const order = await findOrderByExternalReference(database.db, ref)
    expect(order).toMatchObject({ tradeStatus: 'funded', tradeId: `trd_${ref}`, tradeReference: `REF-${ref}` })
    expect(await orderHistory(database.db, order!.id)).toMatchObject([
      { fromStatus: null, toStatus: 'funded', source: 'webhook', deliveryId: `dlv-${ref}` },
    ])
  })

  // the stored kind keeps 206 UTF-16 units of a longer name (`trade.` and the longest status, 200): cut between an
  // emoji's two halves, it held a lone surrogate, which the database refuses, and a well-formed delivery was stored
  // as invalid, its order unmoved
  it('stores a seller event whose long event name is cut within an emoji as its kind, whole characters only', async () => {
    const ref = reference()
    // the emoji's high half is the 206th unit
    const event = `seller.${'x'.repeat(205 - 'seller.'.length)}\u{1F600}`
    const deliveryId = `dlv-${ref}`
    const response = await sendWebhook(app, { body: { seller_id: 's-long', event }, deliveryId })
    expect([response.status, response.body]).toEqual([200, { received: true }])
    const stored = await database.db.selectFrom('webhookDeliveries').select(['outcome', 'eventType']).where('deliveryId', '=', deliveryId).executeTakeFirst()
    expect(stored).toEqual({ outcome: 'ignored', eventType: event.slice(0, 205) })
  })

  // a trade event's kind is trade.{status}, and a status is at most 200 units: its kind is never cut (a status
  // ending in an emoji, one the status model does not know)
  it('stores a trade event of the longest status with its whole kind', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const status = `${'x'.repeat(198)}\u{1F600}`
    const deliveryId = `dlv-${ref}`
    const response = await sendWebhook(app, { body: { ...tradePayload(ref, status), event: `trade.${status}` }, deliveryId })
    expect([response.status, response.body]).toEqual([200, { received: true }])
    const stored = await database.db.selectFrom('webhookDeliveries').select(['outcome', 'eventType']).where('deliveryId', '=', deliveryId).executeTakeFirst()
    expect(stored).toEqual({ outcome: 'unknown_status', eventType: `trade.${status}` })
  })

  // the exact path skips Express; the variants Express matches reach the same endpoint through it
  it.each(['/webhooks/partner?attempt=2', '/webhooks/partner/', '/Webhooks/Partner'])(
    'applies a delivery POSTed to %s like one to the exact path, and refuses one unsigned there too',
    async (path) => {
      const ref = reference()
      await createOrder(database.db, { externalReference: ref })
      const response = await sendWebhook(app, { body: tradePayload(ref, 'funded'), path })
      expect(response.status).toBe(200)
      expect(response.body).toEqual({ received: true })
      expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: 'funded' })
      const unsigned = await sendWebhook(app, { body: tradePayload(ref, 'delivered'), path, signature: null })
      expect(unsigned.status).toBe(401)
      expect(unsigned.body).toEqual({ error: { code: 'invalid_signature', message: expect.any(String) } })
    },
  )

  // the line every delivery writes skips pino's redaction by path (webhook-endpoint.ts): what it holds
  it('writes one line per delivery that never holds a secret or a signature, even sent as the delivery id', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const signatureLike = signBody('{"another":"body"}').slice('sha256='.length)
    for (const deliveryId of [NEXT_SECRET, signatureLike, `plain-${ref}`]) {
      const response = await sendWebhook(app, { body: tradePayload(ref, 'funded'), deliveryId })
      expect(response.status).toBe(200)
    }
    const lines = logEntries().filter((entry) => entry.msg === 'webhook received').slice(-3)
    expect(lines).toMatchObject([
      { deliveryId: '[redacted]', outcome: 'applied', eventType: 'trade.funded' },
      { deliveryIdSha256: expect.stringMatching(/^[0-9a-f]{16}$/), outcome: 'duplicate_effect' },
      // the same body again under a third id: answered as a duplicate and not stored (migrations/0017)
      { deliveryId: `plain-${ref}`, outcome: 'replayed' },
    ])
    expect(JSON.stringify(lines)).not.toContain(signatureLike)
    expect(JSON.stringify(lines)).not.toContain(NEXT_SECRET)
  })

  // the warnings beside that line logged the id as it came, where `webhook received` hashed it
  it('logs a delivery id that could hold a signature as a hash in the warnings too: invalid, refused and mismatched payloads', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    expect((await sendWebhook(app, { body: tradePayload(ref, 'funded') })).status).toBe(200)
    const before = logEntries().length
    const deliveries: [string, object | string][] = [
      ['webhook payload invalid', { trade_id: `trd_${ref}`, status: 'funded' }],
      ['webhook payload refused by the database; stored as invalid', JSON.stringify(tradePayload(ref, 'delivered')).replace('"delivered"', '"delivered", "event": "trade.delivered\\u0000"')],
      ['webhook trade id differs from the order’s trade, or the order was linked under the other PARTNER_ENV', tradePayload(ref, 'delivered', `trd_other_${ref}`)],
    ]
    const ids: string[] = []
    for (const [, body] of deliveries) {
      const deliveryId = signBody(`another body ${ids.length}`)
      ids.push(deliveryId)
      expect((await sendWebhook(app, { body, deliveryId })).status).toBe(200)
    }
    const lines = logEntries().slice(before)
    for (const [message] of deliveries) {
      const warning = lines.find((entry) => entry.msg === message)
      expect(warning, message).toMatchObject({ deliveryIdSha256: expect.stringMatching(/^[0-9a-f]{16}$/) })
      expect(warning, message).not.toHaveProperty('deliveryId')
    }
    for (const deliveryId of ids) expect(JSON.stringify(lines)).not.toContain(deliveryId.slice('sha256='.length))
  })

  it('logs such an id as a hash when an operator reapplies its delivery too', async () => {
    const deliveryId = signBody('the body of another delivery')
    expect((await sendWebhook(app, { body: tradePayload(`parked-${reference()}`, 'funded'), deliveryId })).status).toBe(200)
    const before = logEntries().length
    const reapplied = await runCommand(['deliveries', 'reapply', deliveryId], database.db, config)
    expect(reapplied.code).toBe(0)
    const lines = logEntries().slice(before)
    expect(lines.find((entry) => entry.msg === 'reapplying a delivery')).toMatchObject({
      deliveryIdSha256: expect.stringMatching(/^[0-9a-f]{16}$/),
    })
    expect(JSON.stringify(lines)).not.toContain(deliveryId.slice('sha256='.length))
  })

  it('answers 200 duplicate and stores nothing new for a seen delivery id', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const body = JSON.stringify(tradePayload(ref, 'funded'))
    expect((await sendWebhook(app, { body, deliveryId: `dup-${ref}` })).body).toEqual({ received: true })
    const again = await sendWebhook(app, { body, deliveryId: `dup-${ref}` })
    expect(again.status).toBe(200)
    expect(again.body).toEqual({ received: true, duplicate: true })
    expect(await storedCount()).toBe(before + 1)
  })

  const refusals: [string, () => Promise<{ status: number; body: unknown }>][] = [
    [
      'a signature made for another body',
      () => sendWebhook(app, { body: tradePayload('x', 'funded'), signature: signBody('{"other":true}') }),
    ],
    [
      'a signature made with another secret',
      () =>
        sendWebhook(app, {
          body: tradePayload('x', 'funded'),
          secret: 'whsec_someone_else_0123456789abcdef',
        }),
    ],
    [
      'a signature without the sha256= prefix',
      () => {
        const body = JSON.stringify(tradePayload('x', 'funded'))
        return sendWebhook(app, { body, signature: signBody(body).slice('sha256='.length) })
      },
    ],
    [
      'a signature of the wrong length',
      () => {
        const body = JSON.stringify(tradePayload('x', 'funded'))
        return sendWebhook(app, { body, signature: signBody(body).slice(0, -2) })
      },
    ],
    ['no signature at all', () => sendWebhook(app, { body: tradePayload('x', 'funded'), signature: null })],
    ['a signature that is not hex', () => sendWebhook(app, { body: '{}', signature: `sha256=${'zz'.repeat(32)}` })],
  ]
  for (const [name, send] of refusals) {
    it(`answers 401 and stores nothing for ${name}`, async () => {
      const response = await send()
      expect(response.status).toBe(401)
      expect(response.body).toEqual({
        error: { code: 'invalid_signature', message: 'Missing, malformed or wrong X-Partner-Signature' },
      })
      expect(await storedCount()).toBe(before)
    })
  }

  const badBodies: [string, string | Buffer][] = [
    ['an empty body', ''],
    ['a JSON array', '[{"trade_id":"t"}]'],
    ['invalid UTF-8', Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d])],
    ['a JSON string', '"funded"'],
    ['text that is not JSON', 'status=funded'],
  ]
  for (const [name, body] of badBodies) {
    it(`answers 400 invalid_payload and stores nothing for ${name}, even correctly signed`, async () => {
      const response = await sendWebhook(app, { body })
      expect(response.status).toBe(400)
      expect((response.body as { error: { code: string } }).error.code).toBe('invalid_payload')
      expect(await storedCount()).toBe(before)
    })
  }

  it('answers 400 for a signed delivery without X-Partner-Delivery-Id', async () => {
    const response = await sendWebhook(app, { body: tradePayload('x', 'funded'), deliveryId: null })
    expect(response.status).toBe(400)
    expect(response.body.error.code).toBe('invalid_payload')
    expect(await storedCount()).toBe(before)
  })

  it('answers 400 for a delivery id with a space, a letter outside ASCII or 201 characters, saying what an id may hold', async () => {
    for (const deliveryId of ['dlv 1', 'dlv-é', 'd'.repeat(201)]) {
      const response = await sendWebhook(app, { body: tradePayload(reference(), 'funded'), deliveryId })
      expect(response.status, deliveryId).toBe(400)
      expect(response.body.error.code).toBe('invalid_payload')
      expect(response.body.error.message).toBe('X-Partner-Delivery-Id must be 1 to 200 characters from ! to ~ (printable ASCII, no space)')
    }
    expect((await sendWebhook(app, { body: tradePayload(reference(), 'funded'), deliveryId: `!~${'d'.repeat(198)}` })).status).toBe(200)
    expect(await storedCount()).toBe(before + 1)
  })

  it('accepts a body one byte under the limit and refuses one byte over with 413', async () => {
    const base = JSON.stringify({ ...tradePayload(reference(), 'funded'), pad: '' })
    const under = base.replace('"pad":""', `"pad":"${'x'.repeat(1023 - base.length)}"`)
    expect(Buffer.byteLength(under)).toBe(1023)
    expect((await sendWebhook(app, { body: under })).status).toBe(200)
    const over = base.replace('"pad":""', `"pad":"${'x'.repeat(1025 - base.length)}"`)
    const response = await sendWebhook(app, { body: over })
    expect(response.status).toBe(413)
    expect(response.body.error.code).toBe('payload_too_large')
    expect(await storedCount()).toBe(before + 1)
  })

  it('answers 200 and parks an unknown external_reference as unmatched', async () => {
    const response = await sendWebhook(app, { body: tradePayload('nobody-ordered-this', 'funded'), deliveryId: 'dlv-unmatched' })
    expect(response.status).toBe(200)
    const row = await database.db
      .selectFrom('webhookDeliveries')
      .selectAll()
      .where('deliveryId', '=', 'dlv-unmatched')
      .executeTakeFirstOrThrow()
    expect(row).toMatchObject({ outcome: 'unmatched', externalReference: 'nobody-ordered-this', observedStatus: 'funded' })
  })

  it('stores seller events as ignored with their raw body', async () => {
    const body = '{"event":"seller.verified","seller_id":"s-1","status":"verified"}'
    const response = await sendWebhook(app, { body, deliveryId: 'dlv-seller' })
    expect(response.status).toBe(200)
    const row = await database.db
      .selectFrom('webhookDeliveries')
      .selectAll()
      .where('deliveryId', '=', 'dlv-seller')
      .executeTakeFirstOrThrow()
    expect(row).toMatchObject({ outcome: 'ignored', eventType: 'seller.verified', rawBody: body })
  })

  it('stores a signed trade event that lacks its fields as invalid and answers 200', async () => {
    const response = await sendWebhook(app, { body: '{"status":"funded"}', deliveryId: 'dlv-invalid' })
    expect(response.status).toBe(200)
    const row = await database.db
      .selectFrom('webhookDeliveries')
      .select('outcome')
      .where('deliveryId', '=', 'dlv-invalid')
      .executeTakeFirstOrThrow()
    expect(row.outcome).toBe('invalid')
  })

  // the trade id goes into the path of every later call on the order: ".." linked to it made each refused (exit 2)
  it('stores a trade event whose trade_id cannot be a path segment as invalid, its order unlinked', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    for (const [tradeId, deliveryId] of [['..', 'dlv-dot-dot'], ['.', 'dlv-dot'], ['   ', 'dlv-blank']] as const) {
      const body = JSON.stringify({ ...tradePayload(ref, 'funded'), trade_id: tradeId })
      expect((await sendWebhook(app, { body, deliveryId })).status).toBe(200)
      const row = await database.db.selectFrom('webhookDeliveries').select('outcome').where('deliveryId', '=', deliveryId).executeTakeFirstOrThrow()
      expect(row.outcome, tradeId).toBe('invalid')
    }
    const order = await findOrderByExternalReference(database.db, ref)
    expect(order?.tradeId ?? null).toBeNull()
    expect(order?.tradeStatus ?? null).toBeNull()
  })

  it('stores a trade event whose event names another status than its status as invalid, its order unmoved', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const body = JSON.stringify({ ...tradePayload(ref, 'funded'), event: 'trade.released' })
    expect((await sendWebhook(app, { body, deliveryId: 'dlv-contradicts' })).status).toBe(200)
    const row = await database.db
      .selectFrom('webhookDeliveries')
      .select(['outcome', 'eventType'])
      .where('deliveryId', '=', 'dlv-contradicts')
      .executeTakeFirstOrThrow()
    expect(row).toEqual({ outcome: 'invalid', eventType: 'trade.released' })
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBeNull()
    // the same body with its own kind is applied
    const agreeing = JSON.stringify({ ...tradePayload(ref, 'funded'), event: 'trade.funded' })
    expect((await sendWebhook(app, { body: agreeing, deliveryId: 'dlv-agrees' })).status).toBe(200)
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('funded')
  })

  it('verifies a signature written in upper-case hex', async () => {
    const body = JSON.stringify(tradePayload(reference(), 'funded'))
    const signature = `sha256=${signBody(body).slice('sha256='.length).toUpperCase()}`
    expect((await sendWebhook(app, { body, signature })).status).toBe(200)
  })

  it('verifies signatures made by independent implementations (octokit, openssl)', async () => {
    const body = JSON.stringify(tradePayload(reference(), 'funded'))
    const octokit = await octokitSign(TEST_WEBHOOK_SECRET, body)
    rememberSecret(octokit.slice(7))
    expect((await sendWebhook(app, { body, signature: octokit })).status).toBe(200)

    const body2 = JSON.stringify(tradePayload(reference(), 'funded'))
    const openssl = execFileSync('openssl', ['dgst', '-sha256', '-hmac', TEST_WEBHOOK_SECRET], { input: body2 })
      .toString()
      .trim()
      .split(' ')
      .at(-1)!
    rememberSecret(openssl)
    expect((await sendWebhook(app, { body: body2, signature: `sha256=${openssl}` })).status).toBe(200)
  })

  it('accepts deliveries signed with either secret during a rotation', async () => {
    for (const secret of [TEST_WEBHOOK_SECRET, NEXT_SECRET]) {
      const response = await sendWebhook(app, { body: tradePayload(reference(), 'funded'), secret })
      expect(response.status).toBe(200)
    }
  })

  it('applies a webhook that arrived before its order the moment the order is created', async () => {
    const ref = reference()
    await sendWebhook(app, { body: tradePayload(ref, 'funded'), deliveryId: `early-1-${ref}` })
    await sendWebhook(app, { body: tradePayload(ref, 'delivered'), deliveryId: `early-2-${ref}` })
    const { order, appliedDeliveries } = await createOrder(database.db, { externalReference: ref })
    expect(appliedDeliveries).toBe(2)
    expect(order).toMatchObject({ tradeStatus: 'delivered', tradeId: `trd_${ref}` })
    expect((await orderHistory(database.db, order.id)).map((change) => change.toStatus)).toEqual(['funded', 'delivered'])
    const parked = await database.db
      .selectFrom('webhookDeliveries')
      .select(['deliveryId', 'outcome'])
      .where('externalReference', '=', ref)
      .orderBy('deliveryId')
      .execute()
    expect(parked).toEqual([
      { deliveryId: `early-1-${ref}`, outcome: 'applied' },
      { deliveryId: `early-2-${ref}`, outcome: 'applied' },
    ])
  })

  it('changes nothing when a captured delivery is replayed under a fresh delivery id', async () => {
    const ref = reference()
    const { order } = await createOrder(database.db, { externalReference: ref })
    const body = JSON.stringify(tradePayload(ref, 'funded'))
    await sendWebhook(app, { body })
    await sendWebhook(app, { body: tradePayload(ref, 'delivered') })
    const replay = await sendWebhook(app, { body, deliveryId: 'dlv-replayed-under-new-id' })
    expect(replay.status).toBe(200)
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: 'delivered' })
    expect((await orderHistory(database.db, order.id)).map((change) => change.toStatus)).toEqual(['funded', 'delivered'])
    const row = await database.db
      .selectFrom('webhookDeliveries')
      .select('outcome')
      .where('deliveryId', '=', 'dlv-replayed-under-new-id')
      .executeTakeFirstOrThrow()
    expect(row.outcome).toBe('stale')
  })

  // the signature is over the bytes as sent: an encoded body would verify and then never parse, or be decoded and
  // never verify; refused before it is read, it is a clear error the sender can act on, and nothing is stored
  it.each(['gzip', 'deflate, gzip', 'br'])('refuses a body sent with Content-Encoding %s 415, storing nothing', async (encoding) => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const encoded = gzipSync(JSON.stringify(tradePayload(ref, 'funded')))
    const response = await request(app)
      .post('/webhooks/partner')
      // bytes go as they are under another type: superagent would serialize a Buffer sent as JSON again
      .set('Content-Type', 'application/octet-stream')
      .set('Content-Encoding', encoding)
      .set('X-Partner-Delivery-Id', `dlv-gzip-${ref}`)
      .set('X-Partner-Signature', signBody(encoded))
      .send(encoded)
    expect(response.status).toBe(415)
    expect(response.headers['accept-encoding']).toBe('identity')
    expect(response.body).toEqual({ error: { code: 'unsupported_media_type', message: expect.stringContaining('Content-Encoding') } })
    expect(await storedCount()).toBe(before)
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: null })
    // identity is no encoding at all
    const plain = JSON.stringify(tradePayload(ref, 'funded'))
    const accepted = await request(app)
      .post('/webhooks/partner')
      .set('Content-Type', 'application/json')
      .set('Content-Encoding', 'identity')
      .set('X-Partner-Delivery-Id', `dlv-identity-${ref}`)
      .set('X-Partner-Signature', signBody(plain))
      .send(plain)
    expect(accepted.status).toBe(200)
  })

  it('answers another method than POST on the webhook path 405, naming POST in Allow', async () => {
    for (const method of ['get', 'put', 'delete', 'head'] as const) {
      const response = await request(app)[method]('/webhooks/partner')
      expect(response.status).toBe(405)
      expect(response.headers.allow).toBe('POST')
      if (method !== 'head') expect(response.body.error.code).toBe('method_not_allowed')
    }
    // the same path as Express matches it (a trailing slash), and an unknown path stays 404
    expect((await request(app).get('/webhooks/partner/')).status).toBe(405)
    expect((await request(app).get('/webhooks/partnerx')).status).toBe(404)
  })

  it('answers another method than GET on /healthz and /readyz 405 naming GET, HEAD in Allow, and OPTIONS 204', async () => {
    for (const path of ['/healthz', '/readyz']) {
      expect((await request(app).get(path)).status, path).toBe(200)
      for (const method of ['put', 'post', 'delete', 'patch'] as const) {
        const response = await request(app)[method](path).send('{"x":1}')
        expect([response.status, response.headers.allow, response.body.error?.code], `${method} ${path}`).toEqual([405, 'GET, HEAD', 'method_not_allowed'])
      }
      const options = await request(app).options(path)
      expect([options.status, options.headers.allow], path).toEqual([204, 'GET, HEAD'])
    }
  })
})
