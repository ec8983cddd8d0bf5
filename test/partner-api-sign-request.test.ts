import { spawnSync } from 'node:child_process'
import { describe, expect, it } from 'vitest'
import { newNonce, signRequest } from '../src/partner-api/sign-request.js'
import { rememberSecret } from './helpers/log-sink.js'

const SECRET = 'apisec_vector_7f3a9c1e5b2d4f6a8c0e'
rememberSecret(SECRET)

/** openssl, fed the payload on stdin: the independent tool the spec's formula is checked against. */
function opensslHmac(secret: string, payload: Buffer): string {
  const run = spawnSync('openssl', ['dgst', '-sha256', '-hmac', secret], { input: payload })
  if (run.status !== 0) throw new Error(`openssl failed: ${run.stderr}`)
  const match = /= ([0-9a-f]{64})\s*$/.exec(String(run.stdout))
  if (!match) throw new Error(`unexpected openssl output: ${run.stdout}`)
  return match[1]!
}

/** A second implementation, straight from spec section 5, on WebCrypto rather than node:crypto's Hmac. */
async function specSignature(
  secret: string,
  parts: { method: string; path: string; timestamp: string; nonce: string; body: string },
): Promise<string> {
  const payload = [parts.method, parts.path, parts.timestamp, parts.nonce, parts.body].join('.')
  const encoder = new TextEncoder()
  const key = await crypto.subtle.importKey(
    'raw',
    encoder.encode(secret),
    { name: 'HMAC', hash: 'SHA-256' },
    false,
    ['sign'],
  )
  const mac = new Uint8Array(await crypto.subtle.sign('HMAC', key, encoder.encode(payload)))
  return Array.from(mac, (byte) => byte.toString(16).padStart(2, '0')).join('')
}

const vectors = [
  {
    name: 'a POST with an ASCII JSON body',
    method: 'POST',
    path: '/api/partner/v1/trades/',
    timestamp: 1767225600,
    nonce: '00112233445566778899aabbccddeeff',
    body: '{"title":"Used bicycle","amount":"120.00","currency":"EUR","external_reference":"order-1"}',
  },
  {
    name: 'a POST whose body holds non-ASCII characters (signed as UTF-8 bytes)',
    method: 'POST',
    path: '/api/partner/v1/trades/',
    timestamp: 1767225601,
    nonce: 'ffeeddccbbaa99887766554433221100',
    body: '{"title":"Fahrrad – grün ✓","buyer_name":"Zoë 山田 🚲","amount":"12.50"}',
  },
  {
    name: 'a GET (the empty string is signed)',
    method: 'GET',
    path: '/api/partner/v1/trades/tr_9f8e7d/',
    timestamp: 1767225602,
    nonce: '0f1e2d3c4b5a69788796a5b4c3d2e1f0',
    body: '',
  },
  {
    name: 'a POST with an empty JSON object to a percent-encoded path',
    method: 'POST',
    path: '/api/partner/v1/trades/tr%201/milestones/ms_2/release/',
    timestamp: 1767225603,
    nonce: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
    body: '{}',
  },
]

describe('signRequest', () => {
  for (const vector of vectors) {
    it(`matches openssl and the spec's formula for ${vector.name}`, async () => {
      const headers = signRequest({ ...vector, keyId: 'pk_vector', secret: SECRET })
      const payload = Buffer.from(
        `${vector.method}.${vector.path}.${vector.timestamp}.${vector.nonce}.${vector.body}`,
        'utf8',
      )
      const fromOpenssl = opensslHmac(SECRET, payload)
      const fromSpec = await specSignature(SECRET, { ...vector, timestamp: String(vector.timestamp) })
      rememberSecret(fromOpenssl)

      expect(headers).toEqual({
        'X-Partner-Key-Id': 'pk_vector',
        'X-Partner-Timestamp': String(vector.timestamp),
        'X-Partner-Nonce': vector.nonce,
        'X-Partner-Signature': fromOpenssl,
      })
      expect(headers['X-Partner-Signature']).toBe(fromSpec)
    })
  }

  it('signs the same bytes whether the body is given as a string or as its UTF-8 bytes', () => {
    const vector = vectors[1]!
    const asString = signRequest({ ...vector, keyId: 'k', secret: SECRET })
    const asBytes = signRequest({
      ...vector,
      body: new TextEncoder().encode(vector.body),
      keyId: 'k',
      secret: SECRET,
    })
    expect(asBytes['X-Partner-Signature']).toBe(asString['X-Partner-Signature'])
  })

  it('signs the uppercase method, so a lowercase method gives the same signature', () => {
    const vector = vectors[0]!
    const lower = signRequest({ ...vector, method: 'post', keyId: 'k', secret: SECRET })
    const upper = signRequest({ ...vector, keyId: 'k', secret: SECRET })
    expect(lower['X-Partner-Signature']).toBe(upper['X-Partner-Signature'])
  })

  it('gives a different signature when any signed part changes', () => {
    const base = { ...vectors[0]!, keyId: 'k', secret: SECRET }
    const signature = signRequest(base)['X-Partner-Signature']
    const variants = [
      { method: 'GET' },
      { path: '/api/partner/v1/trades/x/' },
      { timestamp: base.timestamp + 1 },
      { nonce: 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb' },
      { body: `${base.body} ` },
      { secret: `${SECRET}x` },
    ]
    for (const variant of variants) {
      expect(signRequest({ ...base, ...variant })['X-Partner-Signature'], JSON.stringify(variant)).not.toBe(
        signature,
      )
    }
  })

  it('makes nonces of 16 random bytes in hex', () => {
    const nonces = new Set(Array.from({ length: 1000 }, () => newNonce()))
    expect(nonces.size).toBe(1000)
    for (const nonce of nonces) expect(nonce).toMatch(/^[0-9a-f]{32}$/)
  })
})
