// What a trade command shows of the platform's answer, found by an outside review: nothing the request carried
// (signature, nonce, key id, body) in any quoted part of a refusal; a refusal stands on its status whatever its
// body's size; a made trade is kept over a field the service does not use; a redirect says where it points; a
// retried read says how often it was sent. In-process, against a platform of the test's own.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { type PlannedAnswer, type RecordedRequest, type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const openArgs = (reference: string) => ['trades', 'open', reference, '--title', 'A lamp for the hall', '--amount', '10.50', '--currency', 'KES', '--seller', 'usr_1']

describe('what a trade command shows of the platform’s answer', () => {
  let database: TestDatabase
  let server: RecordingServer
  let context: CliContext
  let answer: (request: RecordedRequest) => PlannedAnswer
  beforeAll(async () => {
    database = await createTestDatabase()
    server = await startRecordingServer({ secret: TEST_API_SECRET, answer: (request) => answer(request) })
    context = { config: testConfig({ PARTNER_API_BASE_URL: server.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
    await insertOrders(database.db, [{ externalReference: 'quoted-1', tradeId: 'trd_quoted_1' }])
  })
  afterAll(async () => {
    await server.close()
    await database.close()
  })

  const orderOf = async (reference: string) => JSON.parse((await runCommandWith(['orders', 'show', reference, '--json'], context)).stdout) as Record<string, unknown>
  const creates = () => server.requests.filter((request) => request.method === 'POST' && request.path === '/api/partner/v1/trades/').length

  // an undecodable refusal stood on its status, but one past the answer limit marked the create unknown
  it('a create refused 422 with a 2 MiB body is a refusal: the order is left with no create pending, and the same command sends it again', async () => {
    answer = () => ({ status: 422, headers: { 'content-type': 'text/html' }, text: `<html>${'x'.repeat(2 * 1024 * 1024)}</html>` })
    const before = creates()
    const result = await runCommandWith(openArgs('huge-refusal'), context)
    expect(result.code).toBe(1)
    expect(result.stderr).toMatch(/^The platform refused \(422 http_422\) \[invalid_request\]\n/)
    expect(result.stderr).not.toContain('xxxxxxxx')
    expect(await orderOf('huge-refusal')).toMatchObject({ tradeId: null, tradeCreateState: 'none' })
    const again = await runCommandWith(openArgs('huge-refusal'), context)
    expect(again.stderr).toMatch(/^The platform refused \(422 http_422\) \[invalid_request\]\n/)
    expect(creates() - before).toBe(2)
  })

  it('a create answered with a field the service does not use in another type (a number amount, a numeric date) opens the trade and links it', async () => {
    answer = () => ({
      status: 201,
      body: { trade_id: 'trd_X1', reference: 'REF-X1', status: 'created', external_reference: 'typed-otherwise', amount: 10.5, created_at: 1796546600, milestones: null },
    })
    const result = await runCommandWith(openArgs('typed-otherwise'), context)
    expect(result).toEqual({ code: 0, stdout: 'typed-otherwise: trade trd_X1 (REF-X1) is created\n', stderr: '' })
    expect(await orderOf('typed-otherwise')).toMatchObject({ tradeId: 'trd_X1', tradeCreateState: 'created' })
    const json = await runCommandWith(['trades', 'get', 'typed-otherwise', '--json'], context)
    expect(JSON.parse(json.stdout)).toMatchObject({ trade: { trade_id: 'trd_X1', amount: 10.5, created_at: 1796546600 } })
  })

  // a redirect printed `The platform refused (301 http_301) [refused]`, nothing of where it pointed
  it('a redirect says so, shows its Location (password hidden, controls escaped) and points at PARTNER_API_BASE_URL', async () => {
    const advice = "  Check PARTNER_API_BASE_URL: it should be the platform's base URL itself, which answers without redirecting (a signed call is never sent on to another address)\n"
    answer = () => ({ status: 301, headers: { location: 'https://ops:hunter2@platform.example/partner/\u0085x' }, text: '' })
    expect(await runCommandWith(['trades', 'get', 'quoted-1'], context)).toEqual({
      code: 1,
      stdout: '',
      stderr: `The platform answered 301 http_301: a redirect to https://ops:***@platform.example/partner/\\u0085x, not followed [refused]\n${advice}`,
    })
    answer = () => ({ status: 302, text: '' })
    expect((await runCommandWith(['trades', 'get', 'quoted-1'], context)).stderr).toBe(`The platform answered 302 http_302: a redirect with no Location, not followed [refused]\n${advice}`)
    answer = () => ({ status: 307, headers: { location: '/elsewhere/api/partner/v1/trades/' }, text: '' })
    const open = await runCommandWith(openArgs('redirected-open'), context)
    expect(open.code).toBe(1)
    expect(open.stderr).toBe(
      'The platform answered 307 http_307, a redirect to /elsewhere/api/partner/v1/trades/, not followed, so the call may or may not have taken effect [outcome_unknown]\n' +
        advice +
        '  The trade may or may not exist: the order is marked unknown and is linked when the trade’s webhook arrives. ' +
        'Send the create again only on purpose: `trades open redirected-open ... --retry`.\n',
    )
  })

  // a read answered 503 took 4 attempts and said only "asks to wait 5 s"; `Retry-After: 0` printed "asks to wait 0 s"
  it('a read retried on 503 says how many times it was sent; a Retry-After of 0 or a date past asks for no wait', async () => {
    const gets = () => server.requests.filter((request) => request.method === 'GET').length
    answer = () => ({ status: 503, headers: { 'retry-after': '1' }, body: { error: { code: 'maintenance', message: 'back soon' } } })
    let before = gets()
    expect(await runCommandWith(['trades', 'get', 'quoted-1'], context)).toEqual({
      code: 1,
      stdout: '',
      stderr:
        // each retry told as it comes: the read took 18 s (Retry-After: 5) with no word
        'GET /api/partner/v1/trades/trd_quoted_1/: answered 503 maintenance; sending it again in 1 s (attempt 2 of 4)\n' +
        'GET /api/partner/v1/trades/trd_quoted_1/: answered 503 maintenance; sending it again in 1 s (attempt 3 of 4)\n' +
        'GET /api/partner/v1/trades/trd_quoted_1/: answered 503 maintenance; sending it again in 1 s (attempt 4 of 4)\n' +
        'The platform refused (503 maintenance): back soon [platform_error]\n' +
        '  Sent 4 times, each answered with an error; this is the last answer\n' +
        '  The platform asks to wait 1 s before the next call (Retry-After)\n',
    })
    expect(gets() - before).toBe(4)
    for (const retryAfter of ['0', 'Thu, 01 Jan 2026 00:00:00 GMT']) {
      answer = () => ({ status: 503, headers: { 'retry-after': retryAfter }, body: { error: { code: 'maintenance', message: 'back soon' } } })
      before = gets()
      const read = await runCommandWith(['trades', 'get', 'quoted-1'], context)
      expect(read.stderr.match(/sending it again in/g), retryAfter).toHaveLength(3)
      expect(read.stderr.replace(/^.*sending it again.*\n/gm, ''), retryAfter).toBe('The platform refused (503 maintenance): back soon [platform_error]\n  Sent 4 times, each answered with an error; this is the last answer\n')
      expect(gets() - before).toBe(4)
      answer = () => ({ status: 429, headers: { 'retry-after': retryAfter }, body: { error: { code: 'rate_limited', message: 'slow down' } } })
      // a POST is sent once: no count, and no wait of 0 s
      expect((await runCommandWith(['trades', 'fund', 'quoted-1'], context)).stderr, retryAfter).toBe('The platform refused (429 rate_limited): slow down [throttled]\n')
    }
  })

  describe('an answer that quotes the request', () => {
    // what the request carried, as the platform (or a gateway in front of it) could quote it back
    const echoed = (request: RecordedRequest) => {
      const signature = String(request.headers['x-partner-signature'])
      const nonce = String(request.headers['x-partner-nonce'])
      return { signature, nonce, body: request.rawBody.toString('utf8') }
    }
    let seen: ReturnType<typeof echoed>[] = []
    const expectNothingOfOurs = (stderr: string) => {
      expect(seen.length).toBeGreaterThan(0)
      for (const { signature, nonce, body } of seen) {
        expect(stderr).not.toContain(signature)
        expect(stderr).not.toContain(nonce)
        // a body as short as `{}` (a deliver's) is no secret and would match any JSON
        if (body.length >= 8) {
          expect(stderr).not.toContain(body)
          expect(stderr).not.toContain(JSON.stringify(body).slice(1, -1))
        }
      }
      expect(stderr).not.toContain(TEST_API_SECRET)
      expect(stderr).not.toContain(TEST_API_KEY_ID)
      expect(stderr).toContain('[from our request]')
    }

    it('a 401 whose message and fields quote the signature, nonce and body shows none of them', async () => {
      seen = []
      answer = (request) => {
        const { signature, nonce, body } = echoed(request)
        seen.push(echoed(request))
        return {
          status: 401,
          body: {
            error: {
              code: 'invalid_signature',
              message: `signature ${signature} key ${TEST_API_KEY_ID} nonce ${nonce} body ${body} secret ${TEST_API_SECRET}`,
              fields: { 'X-Partner-Signature': signature, 'X-Partner-Nonce': [nonce], [`sig ${signature}`]: 'as a key' },
            },
          },
        }
      }
      for (const args of [['trades', 'deliver', 'quoted-1'], openArgs('quoted-open-401')]) {
        const result = await runCommandWith(args, context)
        expect(result.code, args.join(' ')).toBe(1)
        expect(result.stderr).toContain('[unauthorized]')
        expectNothingOfOurs(result.stderr)
      }
    })

    it('the same quoted through \\u escapes, which JSON reads as the same characters', async () => {
      seen = []
      const spelled = (value: string) => [...value].map((character) => `\\u${character.charCodeAt(0).toString(16).padStart(4, '0')}`).join('')
      answer = (request) => {
        const { signature, nonce } = echoed(request)
        seen.push(echoed(request))
        return { status: 403, text: `{"error":{"code":"forbidden","message":"nonce ${spelled(nonce)} sig ${spelled(signature)}"}}` }
      }
      const result = await runCommandWith(['trades', 'deliver', 'quoted-1'], context)
      expect(result.stderr).toContain('[forbidden]')
      expectNothingOfOurs(result.stderr)
    })

    it('a 403 in plain text and a 502 not in the platform’s shape, quoting them, show none of them', async () => {
      for (const [status, contentType] of [
        [403, 'text/plain'],
        [502, 'text/html'],
      ] as const) {
        seen = []
        answer = (request) => {
          const { signature, nonce, body } = echoed(request)
          seen.push(echoed(request))
          return { status, headers: { 'content-type': contentType }, text: `refused: X-Partner-Signature: ${signature} X-Partner-Nonce: ${nonce} body ${body}` }
        }
        for (const args of [['trades', 'deliver', 'quoted-1'], openArgs(`quoted-open-${status}`)]) {
          const result = await runCommandWith(args, context)
          expect(result.code, `${status} ${args.join(' ')}`).toBe(1)
          expect(result.stderr).toContain("the platform's answer: refused: X-Partner-Signature: [from our request]")
          expectNothingOfOurs(result.stderr)
        }
      }
    })

    it('a 502 in the platform’s shape that quotes the JSON-escaped body shows none of it', async () => {
      seen = []
      answer = (request) => {
        const { signature, nonce, body } = echoed(request)
        seen.push(echoed(request))
        return { status: 502, body: { error: { code: 'bad_gateway', message: `upstream rejected ${signature} ${nonce} body ${body}` }, request: body } }
      }
      const result = await runCommandWith(openArgs('quoted-open-502-json'), context)
      expect(result.stderr).toContain('[outcome_unknown]')
      expectNothingOfOurs(result.stderr)
    })
  })
})
