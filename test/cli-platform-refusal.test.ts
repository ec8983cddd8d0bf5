// A refusal by the platform, as a command prints it: one line ending in a code of ours in brackets, like every
// failed command's, the platform's status, code and message before it as detail; exit 1 (2 is for a command line
// or a configuration that is wrong before anything is sent). In-process against a platform of the test's own,
// then the compiled CLI against the sandbox.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { createSandbox } from '../src/sandbox/create-sandbox.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { testLogger } from './helpers/log-sink.js'
import { type PlannedAnswer, type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

describe('a refusal by the platform, in-process', () => {
  let database: TestDatabase
  let server: RecordingServer
  let context: CliContext
  let answer: PlannedAnswer
  beforeAll(async () => {
    database = await createTestDatabase()
    server = await startRecordingServer({ secret: TEST_API_SECRET, answer: () => answer })
    context = { config: testConfig({ PARTNER_API_BASE_URL: server.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
    await insertOrders(database.db, [{ externalReference: 'refused-1' }])
  })
  afterAll(async () => {
    await server.close()
    await database.close()
  })

  it('a 404 ends in [not_found], the platform’s code and message kept, exit 1', async () => {
    answer = { status: 404, body: { error: { code: 'trade_not_found', message: 'No trade tr_refused-1' } } }
    const result = await runCommandWith(['trades', 'get', 'refused-1'], context)
    expect(result).toEqual({ code: 1, stdout: '', stderr: 'The platform refused (404 trade_not_found): No trade tr_refused-1 [not_found]\n' })
  })

  // JSON.stringify of a field nested 100,000 deep overflowed the stack: the command printed `Maximum call stack
  // size exceeded` and nothing of the refusal
  it('a refusal whose fields nest 100,000 deep: its line and each field cut at 16 levels, exit 1', async () => {
    const deep = `${'['.repeat(100_000)}${']'.repeat(100_000)}`
    answer = { status: 409, text: `{"error":{"code":"deep","message":"m","fields":[${deep},{"field":${deep},"message":"x"}]}}` }
    for (const args of [['trades', 'fund', 'refused-1'], ['trades', 'fund', 'refused-1', '--json']]) {
      const result = await runCommandWith(args, context)
      expect(result).toEqual({
        code: 1,
        stdout: '',
        stderr: `The platform refused (409 deep): m [conflict]\n  ${'['.repeat(16)}…${']'.repeat(16)}\n  ${'['.repeat(16)}…${']'.repeat(16)}: x\n`,
      })
    }
  })

  it('every status has a code of ours, whatever the platform calls it, and exits 1', async () => {
    const codes: [number, string][] = [
      [400, 'invalid_request'],
      [401, 'unauthorized'],
      [403, 'forbidden'],
      [404, 'not_found'],
      [409, 'conflict'],
      [410, 'refused'],
      [422, 'invalid_request'],
      [429, 'throttled'],
    ]
    for (const [status, code] of codes) {
      answer = { status, body: { error: { code: 'its_own_word', message: 'no' } } }
      // a POST: sent once, never retried, whatever the status
      const result = await runCommandWith(['trades', 'fund', 'refused-1'], context)
      expect(result.code, String(status)).toBe(1)
      expect(result.stderr, String(status)).toBe(`The platform refused (${status} its_own_word): no [${code}]\n`)
    }
    // a 5xx to a read: the GET changed nothing, whatever failed behind the gateway (it was sent 4 times)
    for (const status of [500, 503]) {
      answer = { status, body: { error: { code: 'its_own_word', message: 'no' } } }
      const result = await runCommandWith(['trades', 'get', 'refused-1'], context)
      const retries = [2, 3, 4].map((attempt) => `GET /api/partner/v1/trades/tr_refused-1/: answered ${status} its_own_word; sending it again in \\d\\.\\d s \\(attempt ${attempt} of 4\\)\\n`)
      const tried = '  Sent 4 times, each answered with an error; this is the last answer\n'
      expect([result.code, result.stdout], String(status)).toEqual([1, ''])
      expect(result.stderr, String(status)).toMatch(new RegExp(`^${retries.join('')}`))
      expect(result.stderr.replace(/^.*sending it again.*\n/gm, ''), String(status)).toBe(`The platform refused (${status} its_own_word): no [platform_error]\n${tried}`)
    }
  })

  // a 429 printed no word of the wait it asked for: run again at once, the command was refused again
  it('a 429 or 503 that asks for a wait with Retry-After names the wait under the refusal', async () => {
    answer = { status: 429, headers: { 'retry-after': '120' }, body: { error: { code: 'rate_limited', message: 'slow down' } } }
    expect(await runCommandWith(['trades', 'fund', 'refused-1'], context)).toEqual({
      code: 1,
      stdout: '',
      stderr: 'The platform refused (429 rate_limited): slow down [throttled]\n  The platform asks to wait 120 s before the next call (Retry-After)\n',
    })
    answer = { status: 503, headers: { 'retry-after': '3600' }, body: { error: { code: 'maintenance', message: 'back soon' } } }
    const unknown = await runCommandWith(['trades', 'fund', 'refused-1'], context)
    expect(unknown.code).toBe(1)
    expect(unknown.stderr).toBe(
      'The platform answered 503 maintenance: back soon, so the call may or may not have taken effect [outcome_unknown]\n' +
        '  The platform asks to wait 3,600 s (about 1 h) before the next call (Retry-After)\n' +
        '  The platform may or may not have done it: check with `trades get` (the order is polled soon).\n',
    )
    // a read waits out a short one itself; a long one is named the same way
    const read = await runCommandWith(['trades', 'get', 'refused-1'], context)
    expect(read.stderr).toBe('The platform refused (503 maintenance): back soon [platform_error]\n  The platform asks to wait 3,600 s (about 1 h) before the next call (Retry-After)\n')
    // found from outside: a Retry-After of 99999999999 s was printed as given, as if it were a wait to sit out
    answer = { status: 429, headers: { 'retry-after': '99999999999' }, body: { error: { code: 'rate_limited', message: 'slow down' } } }
    expect((await runCommandWith(['trades', 'fund', 'refused-1'], context)).stderr).toBe(
      'The platform refused (429 rate_limited): slow down [throttled]\n' +
        '  The platform asks to wait 99,999,999,999 s (about 3,171 years) before the next call (Retry-After): longer than a day, which looks like a mistake; ask the platform before waiting it out\n',
    )
    answer = { status: 429, headers: { 'retry-after': String(3 * 86_400) }, body: { error: { code: 'rate_limited', message: 'slow down' } } }
    expect((await runCommandWith(['trades', 'fund', 'refused-1'], context)).stderr).toContain('259,200 s (about 3 days) before the next call (Retry-After): longer than a day')
    // a Retry-After on another refusal is not a wait asked for
    answer = { status: 409, headers: { 'retry-after': '5' }, body: { error: { code: 'state', message: 'no' } } }
    expect((await runCommandWith(['trades', 'fund', 'refused-1'], context)).stderr).toBe('The platform refused (409 state): no [conflict]\n')
  })

  // found from outside: a refusal in another shape than {"error": …} (the spec shows none) printed its status alone,
  // and "once what the platform refused is put right" could not be followed
  it('shows a refusal in another shape: an object’s keys as fields, fields as an object, or the text as it came', async () => {
    answer = { status: 400, body: { amount: ['Ensure this value is greater than or equal to 0.01.'], currency: ['"XXX" is not a valid choice.', 'Required.'] } }
    expect((await runCommandWith(['trades', 'fund', 'refused-1'], context)).stderr).toBe(
      'The platform refused (400 http_400) [invalid_request]\n' +
        '  amount: Ensure this value is greater than or equal to 0.01.\n' +
        '  currency: "XXX" is not a valid choice.; Required.\n',
    )
    answer = { status: 400, body: { error: { code: 'validation_failed', message: 'Invalid fields', fields: { amount: ['must be positive'] } } } }
    expect((await runCommandWith(['trades', 'fund', 'refused-1'], context)).stderr).toBe(
      'The platform refused (400 validation_failed): Invalid fields [invalid_request]\n  amount: must be positive\n',
    )
    answer = { status: 409, text: `Conflict: the trade is not funded\u0007${'x'.repeat(600)}` }
    const text = (await runCommandWith(['trades', 'fund', 'refused-1'], context)).stderr
    expect(text).toMatch(/^The platform refused \(409 http_409\) \[conflict\]\n {2}the platform's answer: Conflict: the trade is not funded\\u0007x+… \(634 characters\)\n$/)
  })

  // the spec's base URL is a gateway: its 502 or 504, or a server failing part-way, may come after the call was done
  it('a 5xx to a call that changes something is no refusal: it may have been done, [outcome_unknown], exit 1', async () => {
    for (const status of [500, 502, 503, 504]) {
      answer = { status, body: { error: { code: 'its_own_word', message: 'no' } } }
      const result = await runCommandWith(['trades', 'fund', 'refused-1'], context)
      expect(result, String(status)).toEqual({
        code: 1,
        stdout: '',
        stderr:
          `The platform answered ${status} its_own_word: no, so the call may or may not have taken effect [outcome_unknown]\n` +
          '  The platform may or may not have done it: check with `trades get` (the order is polled soon).\n',
      })
    }
  })

  it('a `trades open` answered 504 marks the create unknown and sends no second create without --retry', async () => {
    answer = { status: 504, body: { error: { code: 'gateway_timeout', message: 'upstream timed out' } } }
    const open = ['trades', 'open', 'gateway-504', '--title', 'A lamp', '--amount', '1.00', '--currency', 'KES', '--seller', 'usr_1']
    const creates = () => server.requests.filter((request) => request.method === 'POST' && request.path === '/api/partner/v1/trades/').length
    const before = creates()
    const result = await runCommandWith(open, context)
    expect(result).toEqual({
      code: 1,
      stdout: '',
      stderr:
        'The platform answered 504 gateway_timeout: upstream timed out, so the call may or may not have taken effect [outcome_unknown]\n' +
        '  The trade may or may not exist: the order is marked unknown and is linked when the trade’s webhook arrives. ' +
        'Send the create again only on purpose: `trades open gateway-504 ... --retry`.\n',
    })
    const shown = await runCommandWith(['orders', 'show', 'gateway-504', '--json'], context)
    expect(JSON.parse(shown.stdout)).toMatchObject({ externalReference: 'gateway-504', tradeId: null, tradeCreateState: 'unknown' })
    const again = await runCommandWith(open, context)
    expect(again.code).toBe(1)
    expect(again.stderr).toContain('[trade_create_unknown]')
    // the 504 was an answer: one that did not say whether the trade was made (it said "its answer never came")
    expect(again.stderr).toContain('A trade create for order gateway-504 was sent and no answer said whether it made the trade (state unknown)')
    expect(creates() - before).toBe(1)
  })

  // a 303 to a POST is "done, see there": a refusal's advice, the same command again, opened a second trade
  it('a 3xx to a call that changes something is no refusal either: a create answered 303 is marked unknown, and not sent again without --retry', async () => {
    answer = { status: 303, headers: { location: '/api/partner/v1/trades/tr_seen_there/' }, body: { trade_id: 'tr_seen_there' } }
    const open = ['trades', 'open', 'see-other-303', '--title', 'A lamp', '--amount', '1.00', '--currency', 'KES', '--seller', 'usr_1']
    const creates = () => server.requests.filter((request) => request.method === 'POST' && request.path === '/api/partner/v1/trades/').length
    const before = creates()
    const result = await runCommandWith(open, context)
    expect(result.code).toBe(1)
    expect(result.stderr).toMatch(/^The platform answered 303 .*, so the call may or may not have taken effect \[outcome_unknown\]\n/)
    const shown = await runCommandWith(['orders', 'show', 'see-other-303', '--json'], context)
    expect(JSON.parse(shown.stdout)).toMatchObject({ tradeId: null, tradeCreateState: 'unknown' })
    const again = await runCommandWith(open, context)
    expect([again.code, again.stderr]).toEqual([1, expect.stringContaining('[trade_create_unknown]')])
    expect(creates() - before).toBe(1)
    for (const status of [301, 302, 304, 307]) {
      answer = { status, headers: { location: '/elsewhere/' }, body: '' }
      const fund = await runCommandWith(['trades', 'fund', 'refused-1'], context)
      expect([fund.code, fund.stderr], String(status)).toEqual([1, expect.stringContaining('[outcome_unknown]')])
    }
  })

  it('the code stays on the failure line, the platform’s fields below it', async () => {
    answer = {
      status: 422,
      body: { error: { code: 'validation_failed', message: 'invalid fields', fields: [{ field: 'currency', message: 'unknown currency' }] } },
    }
    const result = await runCommandWith(['trades', 'fund', 'refused-1'], context)
    expect(result.code).toBe(1)
    expect(result.stderr).toBe('The platform refused (422 validation_failed): invalid fields [invalid_request]\n  currency: unknown currency\n')
  })

  it('a refused `trades open` says the order it created stays, with no trade, after the failure line', async () => {
    answer = { status: 422, body: { error: { code: 'validation_failed', message: 'invalid fields', fields: [{ field: 'amount', message: 'too small' }] } } }
    const open = ['trades', 'open', 'refused-new', '--title', 'A lamp', '--amount', '1.00', '--currency', 'KES', '--seller', 'usr_1']
    const result = await runCommandWith(open, context)
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(
      'The platform refused (422 validation_failed): invalid fields [invalid_request]\n  amount: too small\n' +
        '  No trade was opened, but order refused-new was created locally, with no trade: the same command opens its trade once what the platform refused is put right\n',
    )
    const shown = await runCommandWith(['orders', 'show', 'refused-new', '--json'], context)
    expect(JSON.parse(shown.stdout)).toMatchObject({ externalReference: 'refused-new', tradeId: null })
    // a second refusal for the order that now exists says nothing of creating it
    const again = await runCommandWith(open, context)
    expect(again.stderr).toBe('The platform refused (422 validation_failed): invalid fields [invalid_request]\n  amount: too small\n')
  })

  it('a platform’s words that read like a database failure are still the platform’s answer', async () => {
    answer = { status: 503, body: { error: { code: 'upstream', message: 'Connection terminated unexpectedly' } } }
    const read = await runCommandWith(['trades', 'get', 'refused-1'], context)
    expect(read.code).toBe(1)
    expect(read.stderr.replace(/^.*sending it again.*\n/gm, '')).toBe(
      'The platform refused (503 upstream): Connection terminated unexpectedly [platform_error]\n  Sent 4 times, each answered with an error; this is the last answer\n',
    )
    const write = await runCommandWith(['trades', 'fund', 'refused-1'], context)
    expect(write.code).toBe(1)
    expect(write.stderr).toMatch(/^The platform answered 503 upstream: Connection terminated unexpectedly, so the call may or may not have taken effect \[outcome_unknown\]\n/)
  })
})

describe('the compiled CLI against the sandbox', () => {
  const sandboxOptions = { keyId: TEST_API_KEY_ID, apiSecret: TEST_API_SECRET, webhookSecret: TEST_WEBHOOK_SECRET, logger: testLogger([TEST_API_SECRET]) }

  it('exits 1 with [not_found] for a milestone and for a trade the platform does not know', async () => {
    const dataDir = migratedDataDir('platform-refusal-')
    const sandbox = createSandbox(sandboxOptions)
    const env = { ...receiverEnv(dataDir), PARTNER_API_BASE_URL: await sandbox.listen(0) }
    try {
      const open = ['trades', 'open', 'ref-404', '--title', 'Bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1', '--milestone', 'Frame:120.00']
      expect((await runCli(open, env)).code).toBe(0)
      const release = await runCli(['trades', 'milestone', 'release', 'ref-404', 'ms_nope'], env)
      expect(release.code).toBe(1)
      expect(release.stderr).toMatch(/^The platform refused \(404 milestone_not_found\): No milestone ms_nope on trade \S+ \[not_found\]\n$/)
    } finally {
      await sandbox.close()
    }
    // a sandbox started afresh knows no trade of the last one's
    const fresh = createSandbox(sandboxOptions)
    try {
      const get = await runCli(['trades', 'get', 'ref-404'], { ...env, PARTNER_API_BASE_URL: await fresh.listen(0) })
      expect(get.code).toBe(1)
      expect(get.stdout).toBe('')
      expect(get.stderr).toMatch(/^The platform refused \(404 trade_not_found\): No trade \S+ \[not_found\]\n$/)
    } finally {
      await fresh.close()
    }
  })
})
