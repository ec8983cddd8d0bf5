// The trades, disputes and proposals commands, run in-process through the CLI runner (the same code path
// and exit-code contract as a real process) against a local platform that checks every signature.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import type { FullProposalRecord } from '../src/partner-api/types.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { disputeRecord, milestoneRecord, proposalRecord, respondResult, tradeRecord } from './helpers/partner-api-fixtures.js'
import {
  type PlannedAnswer,
  type RecordedRequest,
  type RecordingServer,
  startRecordingServer,
} from './helpers/partner-api-recording-server.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

let database: TestDatabase
let server: RecordingServer
let context: CliContext
let answer: ((request: RecordedRequest) => PlannedAnswer) | undefined

beforeAll(async () => {
  database = await createTestDatabase()
  server = await startRecordingServer({
    secret: TEST_API_SECRET,
    answer: (request) => {
      if (answer) return answer(request)
      if (request.method === 'POST' && request.path === '/api/partner/v1/trades/') {
        const sent = JSON.parse(request.rawBody.toString('utf8'))
        return {
          status: 201,
          body: tradeRecord({ trade_id: `tr_${sent.external_reference}`, external_reference: sent.external_reference }),
        }
      }
      return { status: 200, body: recordOfPathTrade(request.path) }
    },
  })
  const config = testConfig({ PARTNER_API_BASE_URL: server.url })
  context = { config, logger: testLogger([TEST_API_SECRET]), db: database.db }
})
afterAll(async () => {
  await server.close()
  await database.close()
})
beforeEach(() => {
  answer = undefined
})

/** What the platform answers on the trade the path names: its own record (the order's reference is the id without tr_). */
function recordOfPathTrade(path: string): unknown {
  const tradeId = decodeURIComponent(path.split('/')[5]!)
  const own = { trade_id: tradeId, external_reference: tradeId.replace(/^tr_/, '') }
  if (path.endsWith('/respond/')) {
    const result = respondResult()
    // the proposal responded to, of this trade
    const proposalId = decodeURIComponent(path.split('/')[7]!)
    return { proposal: { ...result.proposal, proposal_id: proposalId, trade_id: tradeId }, trade: { ...result.trade, ...own } }
  }
  if (path.endsWith('/proposals/')) return proposalRecord({ trade_id: tradeId })
  if (path.endsWith('/dispute/')) return disputeRecord({ trade_id: tradeId })
  return tradeRecord(own)
}

function cli(...args: string[]) {
  return runCommandWith(args, context)
}

const open = (ref: string, ...extra: string[]) =>
  cli('trades', 'open', ref, '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1', ...extra)

let counter = 0
const reference = () => `cli-order-${++counter}`

describe('trades open', () => {
  it('creates a milestone trade with a signed request and links the order', async () => {
    const ref = reference()
    const result = await open(ref, '--milestone', 'Frame:70.00', '--milestone', 'Wheels: 50.00', '--buyer-phone', '+4915112345678', '--json')
    expect(result.stderr).toBe('')
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout).trade.trade_id).toBe(`tr_${ref}`)
    const sent = server.requests.at(-1)!
    expect(sent.signatureValid).toBe(true)
    expect(JSON.parse(sent.rawBody.toString('utf8'))).toEqual({
      title: 'Used bicycle',
      amount: '120.00',
      currency: 'EUR',
      seller_id: 's_1',
      buyer_phone: '+4915112345678',
      milestones: [
        { title: 'Frame', amount: '70.00' },
        { title: 'Wheels', amount: '50.00' },
      ],
      external_reference: ref,
    })
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeId: `tr_${ref}` })
  })

  it('exits 2 naming the field, and sends nothing, when the request fails validation', async () => {
    const before = server.requests.length
    const result = await open(reference(), '--buyer-phone', '0049 151 123')
    expect(result.code).toBe(2)
    expect(result.stderr).toContain('buyer_phone')
    expect(server.requests.length).toBe(before)
  })

  it.each([
    ['a negative amount', ['--amount', '-1']],
    ['a phone without +', ['--buyer-phone', '0049 151 123']],
    ['a milestone of zero', ['--milestone', 'Frame:0']],
  ])('creates no order for a request that fails validation (%s)', async (_, extra) => {
    const ref = reference()
    const result = await open(ref, ...extra)
    expect(result.code).toBe(2)
    expect(result.stderr).toMatch(/^Invalid request: [^\n]+ \[invalid_arguments\]\n$/)
    expect(await findOrderByExternalReference(database.db, ref)).toBeUndefined()
    // and with the mistake corrected, the same command opens the trade
    expect((await open(ref)).code).toBe(0)
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeId: `tr_${ref}` })
  })

  it('exits 2 for an order reference over 200 characters, creating no order and sending nothing', async () => {
    const before = server.requests.length
    const result = await open('o'.repeat(201))
    expect(result.code).toBe(2)
    expect(result.stderr).toContain('external_reference: must be 1 to 200 characters')
    expect(server.requests.length).toBe(before)
    expect(await findOrderByExternalReference(database.db, 'o'.repeat(201))).toBeUndefined()
  })

  it('exits 2 on a malformed --milestone or a missing required option', async () => {
    const badMilestone = await open(reference(), '--milestone', 'Frame-70')
    expect(badMilestone.code).toBe(2)
    expect(badMilestone.stderr).toContain('--milestone must be "title:amount"')
    const missing = await cli('trades', 'open', reference(), '--amount', '1.00', '--currency', 'EUR')
    expect(missing.code).toBe(2)
    expect(missing.stderr).toContain('--title')
  })

  it('exits 1 with the status and code when the platform refuses, and the order can be opened again', async () => {
    const ref = reference()
    answer = () => ({
      status: 422,
      body: {
        error: { code: 'validation_failed', message: 'invalid fields', fields: [{ field: 'currency', message: 'unknown currency' }] },
      },
    })
    const refused = await open(ref)
    expect(refused.code).toBe(1)
    expect(refused.stderr).toContain('422 validation_failed')
    expect(refused.stderr).toContain('currency: unknown currency')
    answer = undefined
    expect((await open(ref)).code).toBe(0)
  })

  // two checkouts: the first one's `npm start` holds SANDBOX_PORT, and the second's command met its sandbox
  it('in local mode, says that a sandbox refusing the key is another service’s on that port', async () => {
    const local = testConfig({ PARTNER_API_BASE_URL: '', SANDBOX_PORT: new URL(server.url).port, DATA_DIR: '/srv/checkout-b/data' })
    expect(local.partner.mode).toBe('local')
    const ref = reference()
    expect((await open(ref)).code).toBe(0)
    for (const code of ['unknown_key', 'invalid_signature']) {
      answer = () => ({ status: 401, body: { error: { code, message: 'The key id is not known' } } })
      const refused = await runCommandWith(['trades', 'get', ref], { ...context, config: local })
      expect(refused.code).toBe(1)
      expect(refused.stderr).toContain(`The platform refused (401 ${code})`)
      expect(refused.stderr).toContain(`the sandbox that \`npm start\` runs from /srv/checkout-b/data`)
      expect(refused.stderr).toContain(`the one at ${server.url} does not know it`)
    }
    // a remote platform's refusal is only the refusal
    answer = () => ({ status: 401, body: { error: { code: 'unknown_key', message: 'The key id is not known' } } })
    const remote = await cli('trades', 'get', ref)
    expect(remote.code).toBe(1)
    expect(remote.stderr).toContain('The platform refused (401 unknown_key)')
    expect(remote.stderr).not.toContain('In local mode')
  })

  it('refuses to open again after a create whose outcome is unknown, until --retry', async () => {
    const ref = reference()
    answer = () => ({ status: 200, body: 'not the trade record' })
    const unknown = await open(ref)
    expect(unknown.code).toBe(1)
    expect(unknown.stderr).toContain('--retry')
    answer = undefined
    const refused = await open(ref)
    expect(refused.code).toBe(1)
    expect(refused.stderr).toContain('trade_create_unknown')
    const retried = await open(ref, '--retry')
    expect(retried.code).toBe(0)
    expect(retried.stdout).toContain(`tr_${ref}`)
  })
})

describe('trades operations', () => {
  it('funds, delivers and releases the order’s trade, and releases a milestone by id', async () => {
    const ref = reference()
    await open(ref)
    for (const kind of ['fund', 'deliver', 'release', 'cancel']) {
      const result = await cli('trades', kind, ref)
      expect(result.code, kind).toBe(0)
      expect(server.requests.at(-1)).toMatchObject({
        method: 'POST',
        path: `/api/partner/v1/trades/tr_${ref}/${kind}/`,
        signatureValid: true,
      })
    }
    expect((await cli('trades', 'milestone', 'release', ref, 'ms_7')).code).toBe(0)
    expect(server.requests.at(-1)!.path).toBe(`/api/partner/v1/trades/tr_${ref}/milestones/ms_7/release/`)
  })

  it('exits 1 with the status and code when the trade is in the wrong state', async () => {
    const ref = reference()
    await open(ref)
    answer = () => ({ status: 409, body: { error: { code: 'invalid_state', message: 'trade is not funded' } } })
    const result = await cli('trades', 'deliver', ref)
    expect(result.code).toBe(1)
    expect(result.stderr).toContain('409 invalid_state')
    expect(result.stderr).toContain('trade is not funded')
  })

  // the platform's answer was printed alone, and `orders show` then showed another status than the command had
  it('says so when the order had moved past the status the answer holds, and keeps the later one', async () => {
    const ref = reference()
    await open(ref)
    answer = () => ({ status: 200, body: tradeRecord({ trade_id: `tr_${ref}`, external_reference: ref, status: 'delivered' }) })
    expect(await cli('trades', 'deliver', ref)).toMatchObject({ code: 0, stderr: '' })
    answer = () => ({ status: 200, body: tradeRecord({ trade_id: `tr_${ref}`, external_reference: ref, status: 'funded' }) })
    const fund = await cli('trades', 'fund', ref)
    expect(fund.code).toBe(0)
    expect(fund.stdout).toBe(`${ref}: trade tr_${ref} (TRD-0001) is funded\n`)
    expect(fund.stderr).toBe('The order is at delivered, past the funded this answer holds: a later event of the trade came first, and the order keeps it\n')
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: 'delivered' })
    // an answer of the status the order is at says nothing more
    answer = () => ({ status: 200, body: tradeRecord({ trade_id: `tr_${ref}`, external_reference: ref, status: 'delivered' }) })
    expect(await cli('trades', 'deliver', ref)).toMatchObject({ code: 0, stderr: '' })
  })

  it('exits 1 for an order it does not know', async () => {
    const result = await cli('trades', 'fund', 'no-such-order')
    expect(result.code).toBe(1)
    expect(result.stderr).toBe('No order with external reference no-such-order [order_not_found]\n')
  })

  it('prints the platform’s trade and the local order with trades get --json', async () => {
    const ref = reference()
    await open(ref)
    answer = (request) => ({ status: 200, body: tradeRecord({ trade_id: `tr_${ref}`, external_reference: ref, status: 'funded', reference: request.path }) })
    const result = await cli('trades', 'get', ref, '--json')
    expect(result.code).toBe(0)
    const printed = JSON.parse(result.stdout)
    expect(printed.trade.status).toBe('funded')
    expect(printed.order).toMatchObject({ externalReference: ref, tradeId: `tr_${ref}` })
    expect(server.requests.at(-1)).toMatchObject({ method: 'GET', path: `/api/partner/v1/trades/tr_${ref}/`, signatureValid: true })
  })
})

// A milestone deliver or release answers the trade record or the milestone record (the spec allows either): the
// command prints the milestone's line from whichever came, and --json the record as it came, under its name.
describe('trades milestone deliver|release', () => {
  const milestonePath = (ref: string, step: string) => `/api/partner/v1/trades/tr_${ref}/milestones/ms_7/${step}/`

  it('prints the milestone’s line, then the trade’s, from a trade record; --json prints {"trade": …}', async () => {
    const ref = reference()
    await open(ref)
    const trade = tradeRecord({
      trade_id: `tr_${ref}`,
      external_reference: ref,
      status: 'funded',
      milestones: [milestoneRecord({ milestone_id: 'ms_6', status: 'released' }), milestoneRecord({ milestone_id: 'ms_7', title: 'Wheels' })],
    })
    answer = () => ({ status: 200, body: trade })
    const text = await cli('trades', 'milestone', 'deliver', ref, 'ms_7')
    expect(text).toMatchObject({ code: 0, stderr: '' })
    expect(text.stdout).toBe(`${ref}: milestone ms_7 (Wheels) is delivered\n${ref}: trade tr_${ref} (TRD-0001) is funded\n`)
    expect(server.requests.at(-1)).toMatchObject({ method: 'POST', path: milestonePath(ref, 'deliver'), signatureValid: true })
    const json = await cli('trades', 'milestone', 'release', ref, 'ms_7', '--json')
    expect(json.code).toBe(0)
    expect(JSON.parse(json.stdout)).toEqual({ trade })
    expect(await findOrderByExternalReference(database.db, ref)).toMatchObject({ tradeStatus: 'funded', statusSource: 'api' })
    // a milestone of the trade record with its id alone: what it leaves out shows as ?, as `trades open` shows it
    answer = () => ({ status: 200, body: { ...trade, milestones: [{ milestone_id: 'ms_7' }] } })
    const bare = await cli('trades', 'milestone', 'release', ref, 'ms_7')
    expect(bare.stdout).toBe(`${ref}: milestone ms_7 (?) is ?\n${ref}: trade tr_${ref} (TRD-0001) is funded\n`)
  })

  // a milestone id of 100,000 characters was sent, and the server refused the request line 431
  it('refuses a milestone id over 200 characters before sending anything, exit 2', async () => {
    const ref = reference()
    await open(ref)
    const sent = server.requests.length
    const result = await cli('trades', 'milestone', 'deliver', ref, 'm'.repeat(100_000))
    expect(result).toEqual({ code: 2, stdout: '', stderr: 'Invalid request: milestone_id: must be at most 200 characters (a platform id) [invalid_arguments]\n' })
    expect(server.requests.length).toBe(sent)
  })

  it('prints the milestone’s line from a milestone record, that it holds no trade status; --json prints {"milestone": …}', async () => {
    const ref = reference()
    await open(ref)
    const opened = (await findOrderByExternalReference(database.db, ref))!
    const milestone = milestoneRecord({ milestone_id: 'ms_7', title: 'Wheels', status: 'released' })
    answer = () => ({ status: 200, body: milestone })
    const text = await cli('trades', 'milestone', 'release', ref, 'ms_7')
    expect(text).toMatchObject({ code: 0, stderr: '' })
    expect(text.stdout).toBe(
      `${ref}: milestone ms_7 (Wheels) is released\n` +
        `  the platform answered the milestone record, which holds no trade status: \`trades get ${ref}\` shows the trade\n`,
    )
    expect(server.requests.at(-1)).toMatchObject({ method: 'POST', path: milestonePath(ref, 'release'), signatureValid: true })
    const json = await cli('trades', 'milestone', 'deliver', ref, 'ms_7', '--json')
    expect(json.code).toBe(0)
    expect(JSON.parse(json.stdout)).toEqual({ milestone })
    // nothing applied from it: the order keeps the status it had, and is polled soon
    const after = (await findOrderByExternalReference(database.db, ref))!
    expect(after).toMatchObject({ tradeStatus: 'created', statusChangedAt: opened.statusChangedAt })
    expect(after.nextPollAt!.getTime()).toBeGreaterThan(opened.nextPollAt!.getTime())
  })

  it('shows what the platform sent in a milestone record escaped, and a missing title or status as ?', async () => {
    const ref = reference()
    await open(ref)
    answer = () => ({
      status: 200,
      body: milestoneRecord({ milestone_id: 'ms_7', title: 'Wheels\n\u001b[2Jforged line', status: 'released\u202e' }),
    })
    const forged = await cli('trades', 'milestone', 'release', ref, 'ms_7')
    expect(forged.code).toBe(0)
    expect(forged.stdout.split('\n')[0]).toBe(`${ref}: milestone ms_7 (Wheels\\u000a\\u001b[2Jforged line) is released\\u202e`)
    answer = () => ({ status: 200, body: { milestone_id: 'ms_7' } })
    const bare = await cli('trades', 'milestone', 'deliver', ref, 'ms_7')
    expect(bare.code).toBe(0)
    expect(bare.stdout.split('\n')[0]).toBe(`${ref}: milestone ms_7 (?) is ?`)
  })

  it('exits 1 [answer_mismatch], applying nothing and polling soon, when the milestone record is another milestone’s', async () => {
    const ref = reference()
    await open(ref)
    const opened = (await findOrderByExternalReference(database.db, ref))!
    answer = () => ({ status: 200, body: milestoneRecord({ milestone_id: 'ms_8' }) })
    const result = await cli('trades', 'milestone', 'deliver', ref, 'ms_7', '--json')
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    expect(result.stderr).toBe(
      `The platform answered for order ${ref} (milestone ms_7 of trade tr_${ref}) with the record of milestone ms_8: ` +
        'another milestone. Nothing of it was applied, and what the call did is not known: check with `trades get`; the ' +
        'order is polled soon. [answer_mismatch]\n',
    )
    const after = (await findOrderByExternalReference(database.db, ref))!
    expect(after).toMatchObject({ tradeStatus: 'created', statusChangedAt: opened.statusChangedAt })
    expect(after.nextPollAt!.getTime()).toBeGreaterThan(opened.nextPollAt!.getTime())
  })
})

describe('disputes and proposals', () => {
  it('opens a dispute, proposes a split and accepts it', async () => {
    const ref = reference()
    await open(ref)
    const dispute = await cli('disputes', 'open', ref, '--party', 'buyer', '--reason', 'The frame arrived bent and scratched', '--category', 'damaged')
    expect(dispute.code).toBe(0)
    expect(JSON.parse(server.requests.at(-1)!.rawBody.toString('utf8'))).toEqual({
      reason: 'The frame arrived bent and scratched',
      party: 'buyer',
      category: 'damaged',
    })
    const proposal = await cli('proposals', 'create', ref, '--party', 'seller', '--outcome', 'split', '--split-buyer-pct', '40', '--json')
    expect(proposal.code).toBe(0)
    expect(JSON.parse(proposal.stdout).proposal.proposal_id).toBe('pr_1')
    const accepted = await cli('proposals', 'respond', ref, 'pr_1', '--party', 'buyer', '--accept')
    expect(accepted.code).toBe(0)
    expect(server.requests.at(-1)).toMatchObject({ path: `/api/partner/v1/trades/tr_${ref}/proposals/pr_1/respond/` })
    expect(JSON.parse(server.requests.at(-1)!.rawBody.toString('utf8'))).toEqual({ accept: true, party: 'buyer' })
  })

  it('exits 2 naming the field for a short dispute reason, a bad party or a split without a share', async () => {
    const ref = reference()
    await open(ref)
    const before = server.requests.length
    const short = await cli('disputes', 'open', ref, '--party', 'buyer', '--reason', 'too short')
    expect(short.code).toBe(2)
    expect(short.stderr).toContain('reason')
    const party = await cli('proposals', 'create', ref, '--party', 'staff', '--outcome', 'buyer_win')
    expect(party.code).toBe(2)
    expect(party.stderr).toContain('party')
    const split = await cli('proposals', 'create', ref, '--party', 'buyer', '--outcome', 'split')
    expect(split.code).toBe(2)
    expect(split.stderr).toContain('split_buyer_pct')
    expect(server.requests.length).toBe(before)
  })

  // found from outside: after a `proposals create` whose outcome was unknown, `trades get` showed the dispute's id and
  // status only, so the operator could not tell whether the proposal had been made before proposing again
  it('a proposal whose outcome is unknown points at `trades get`, which lists the dispute’s proposals, escaped', async () => {
    const ref = reference()
    await open(ref)
    const tradeId = `tr_${ref}`
    // the gateway passes the create on and answers 504: the proposal was made, the answer says nothing of it
    answer = (request) =>
      request.method === 'POST'
        ? { status: 504, body: { error: { code: 'gateway_timeout', message: 'upstream timed out' } } }
        : {
            status: 200,
            body: tradeRecord({
              trade_id: tradeId,
              external_reference: ref,
              status: 'disputed',
              dispute: disputeRecord({
                dispute_id: 'dp_7',
                trade_id: tradeId,
                proposals: [
                  proposalRecord({ proposal_id: 'pr_1', trade_id: tradeId, party: 'buyer', outcome: 'buyer_win', split_buyer_pct: null, status: 'rejected' }),
                  proposalRecord({ proposal_id: 'pr_2', trade_id: tradeId, party: 'seller', outcome: 'split', split_buyer_pct: '40', status: 'pending' }),
                  // the platform's text: a line feed and a bidirectional override cannot forge a line or reorder one
                  // (a number where a decimal string is assumed: shown as written)
                  { proposal_id: 'pr_3', party: 'seller\nforged: accepted', outcome: 'split', split_buyer_pct: 12.5, status: 'pending\u202e' } as unknown as FullProposalRecord,
                ],
              }),
            }),
          }
    const created = await cli('proposals', 'create', ref, '--party', 'seller', '--outcome', 'split', '--split-buyer-pct', '40')
    expect(created.code).toBe(1)
    expect(created.stdout).toBe('')
    expect(created.stderr).toContain('[outcome_unknown]')
    expect(created.stderr).toContain(
      `The proposal may or may not have been made: \`trades get ${ref}\` lists the dispute's proposals, each with who made it and its status`,
    )

    const get = await cli('trades', 'get', ref)
    expect(get.code).toBe(0)
    expect(get.stdout).toContain(
      '  dispute dp_7: open\n' +
        '    proposal pr_1 by buyer: buyer_win, rejected\n' +
        '    proposal pr_2 by seller: split (buyer’s share 40%), pending\n' +
        '    proposal pr_3 by seller\\u000aforged: accepted: split (buyer’s share 12.5%), pending\\u202e\n',
    )

    // none made yet, and a record that leaves the list out: each said, never a silent nothing
    for (const [proposals, line] of [[[], '    no proposals\n'], [undefined, '    proposals: not in the platform’s record\n']] as const) {
      answer = () => ({
        status: 200,
        body: { ...tradeRecord({ trade_id: tradeId, external_reference: ref, status: 'disputed' }), dispute: { ...disputeRecord({ dispute_id: 'dp_7', trade_id: tradeId }), proposals } },
      })
      const shown = await cli('trades', 'get', ref)
      expect(shown.stdout).toContain(`  dispute dp_7: open\n${line}local order: `)
    }
  })

  it('exits 2 unless exactly one of --accept and --reject is given', async () => {
    const ref = reference()
    await open(ref)
    expect((await cli('proposals', 'respond', ref, 'pr_1', '--party', 'buyer')).code).toBe(2)
    expect((await cli('proposals', 'respond', ref, 'pr_1', '--party', 'buyer', '--accept', '--reject')).code).toBe(2)
    const rejected = await cli('proposals', 'respond', ref, 'pr_1', '--party', 'seller', '--reject')
    expect(rejected.code).toBe(0)
    expect(JSON.parse(server.requests.at(-1)!.rawBody.toString('utf8'))).toEqual({ accept: false, party: 'seller' })
  })
})

describe('an answer nested deeper than any record of the API', () => {
  it('is an invalid answer with its code, never a stack overflow after the order was moved', async () => {
    const depth = 200_000
    const { createServer } = await import('node:http')
    const server = createServer((req, res) => {
      req.resume()
      req.on('end', () => {
        const record = JSON.stringify({ trade_id: 'tr_deep-1', reference: 'R', status: 'funded', external_reference: 'deep-1' }).slice(0, -1)
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(`${record},"extra":${'['.repeat(depth)}${']'.repeat(depth)}}`)
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const { port } = server.address() as import('node:net').AddressInfo
      const { insertOrders } = await import('./helpers/reconcile-orders.js')
      await insertOrders(database.db, [{ externalReference: 'deep-1', tradeStatus: 'created' }])
      const deepContext = { ...context, config: testConfig({ PARTNER_API_BASE_URL: `http://127.0.0.1:${port}` }) }
      const result = await runCommandWith(['trades', 'fund', 'deep-1', '--json'], deepContext)
      expect(result.code).toBe(1)
      expect(result.stderr).not.toContain('Maximum call stack size exceeded')
      expect(result.stderr).toContain('nests deeper than 64 levels')
      expect(result.stdout).toBe('')
      // the answer was not taken as the platform's word: the order is as it was, and polled soon
      expect(await findOrderByExternalReference(database.db, 'deep-1')).toMatchObject({ tradeStatus: 'created' })
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()))
    }
  })
})
