// The spec says only "sha256=<hex digest>": the digest's case is not fixed. The header's 64 hex digits are decoded
// to the 32 bytes they stand for and those are compared, so upper, lower and mixed case verify alike, and a wrong
// digest is refused in any case. The platform (and the sandbox) send lower case.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { signWebhookBody, verifySignature } from '../src/webhooks/verify-signature.js'
import { createOrder } from './helpers/orders.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, signBody, tradePayload } from './helpers/webhook-delivery.js'

// HMAC-SHA256 of the classic sentence under the key "key" (the vector Wikipedia and many libraries use)
const KEY = 'key'
const BODY = Buffer.from('The quick brown fox jumps over the lazy dog')
const DIGEST = 'f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8'
rememberSecret(DIGEST)

/** Every other hex letter upper-cased: `f7BC83F4…`. */
const mixedCase = (hex: string) => [...hex].map((digit, i) => (i % 2 ? digit.toUpperCase() : digit)).join('')
/** The digest with its last digit changed, in the same case. */
const wrongLastDigit = (hex: string) => `${hex.slice(0, -1)}${hex.endsWith('0') ? '1' : '0'}`

describe('verifySignature, on a fixed vector', () => {
  it('accepts the digest in lower, upper and mixed case', () => {
    expect(signWebhookBody(KEY, BODY)).toBe(`sha256=${DIGEST}`)
    for (const hex of [DIGEST, DIGEST.toUpperCase(), mixedCase(DIGEST)]) {
      expect(verifySignature([KEY], BODY, `sha256=${hex}`), hex).toBe(true)
    }
  })

  it('refuses a wrong digest in any case, and the digest of another body', () => {
    for (const hex of [wrongLastDigit(DIGEST), wrongLastDigit(DIGEST).toUpperCase(), mixedCase(wrongLastDigit(DIGEST))]) {
      expect(verifySignature([KEY], BODY, `sha256=${hex}`), hex).toBe(false)
    }
    expect(verifySignature([KEY], Buffer.from('The quick brown fox jumps over the lazy cog'), `sha256=${DIGEST.toUpperCase()}`)).toBe(false)
  })
})

describe('the webhook endpoint', () => {
  let database: TestDatabase
  let app: App
  let counter = 0
  const reference = () => `hex-case-${++counter}`
  const config = testConfig()

  beforeAll(async () => {
    database = await createTestDatabase()
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
  })
  afterAll(() => database.close())

  const hexOf = (body: string) => signBody(body).slice('sha256='.length)

  it('answers 200 and applies a delivery signed in upper-case hex', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const body = JSON.stringify(tradePayload(ref, 'funded'))
    const response = await sendWebhook(app, { body, signature: `sha256=${hexOf(body).toUpperCase()}` })
    expect([response.status, response.body]).toEqual([200, { received: true }])
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: 'funded' })
  })

  it('answers 200 to a delivery signed in mixed case', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const body = JSON.stringify(tradePayload(ref, 'funded'))
    const response = await sendWebhook(app, { body, signature: `sha256=${mixedCase(hexOf(body))}` })
    expect(response.status).toBe(200)
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: 'funded' })
  })

  it('answers 401 invalid_signature, and moves nothing, for a wrong digest in upper case', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const body = JSON.stringify(tradePayload(ref, 'funded'))
    const response = await sendWebhook(app, { body, signature: `sha256=${wrongLastDigit(hexOf(body)).toUpperCase()}` })
    expect(response.status).toBe(401)
    expect(response.body.error.code).toBe('invalid_signature')
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: null })
  })
})
