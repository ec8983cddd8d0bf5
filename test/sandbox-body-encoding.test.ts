// A signed API body that is not UTF-8 is refused, 400 invalid_body, as the platform must not be assumed to guess:
// the sandbox read it with Buffer's toString, which put U+FFFD in place of the bad bytes, and answered 201 with a
// trade (and webhooks) carrying an external reference the partner never sent.
import { createHmac, randomUUID } from 'node:crypto'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'

const keyId = 'pk_sandbox_encoding'
const apiSecret = 'sandbox-encoding-api-secret-0123456789'
const webhookSecret = 'sandbox-encoding-webhook-secret-0123'
rememberSecret(apiSecret, webhookSecret)

const TRADES = '/api/partner/v1/trades/'

/** A POST signed over exactly `body`'s bytes, as spec section 5 says. */
async function signedPost(base: string, path: string, body: Buffer) {
  const timestamp = String(Math.floor(Date.now() / 1000))
  const nonce = randomUUID()
  const signature = createHmac('sha256', apiSecret)
    .update(Buffer.concat([Buffer.from(`POST.${path}.${timestamp}.${nonce}.`), body]))
    .digest('hex')
  const response = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-partner-key-id': keyId,
      'x-partner-timestamp': timestamp,
      'x-partner-nonce': nonce,
      'x-partner-signature': signature,
    },
    body,
  })
  return { status: response.status, body: (await response.json()) as Record<string, unknown> }
}

const json = (reference: Buffer) =>
  Buffer.concat([Buffer.from('{"title":"T","amount":"1.00","currency":"EUR","seller_id":"s-1","external_reference":"'), reference, Buffer.from('"}')])

describe('an API body’s encoding', () => {
  let sandbox: Sandbox
  let base: string
  beforeAll(async () => {
    sandbox = createSandbox({ keyId, apiSecret, webhookSecret, logger: testLogger() })
    base = await sandbox.listen(0)
  })
  afterAll(() => sandbox.close())

  it.each([
    ['a Latin-1 byte', Buffer.from([0x63, 0x61, 0x66, 0xe9])],
    ['a sequence cut short', Buffer.from([0x63, 0xe2, 0x82])],
    ['an encoded surrogate', Buffer.from([0x63, 0xed, 0xa0, 0x80])],
  ])('refuses %s: 400 invalid_body, and no trade', async (_name, reference) => {
    const answer = await signedPost(base, TRADES, json(reference))
    expect(answer).toEqual({
      status: 400,
      body: { error: { code: 'invalid_body', message: 'The body is not valid UTF-8: send JSON in UTF-8' } },
    })
    expect(sandbox.trades()).toEqual([])
  })

  it('takes UTF-8 as sent, byte for byte', async () => {
    const answer = await signedPost(base, TRADES, json(Buffer.from('café-🚀')))
    expect(answer.status).toBe(201)
    expect(answer.body.external_reference).toBe('café-🚀')
  })
})
