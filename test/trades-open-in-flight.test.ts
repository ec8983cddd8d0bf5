// `trades open` beside another command sending the same order's create: two replicas on one database (two handles
// on Postgres; PGlite has one), and a platform that holds each create until the test answers it, so a create is at
// the platform for certain while the others run. Time is a FakeClock the commands sign and time out with; a create's
// pending mark is stamped and judged by the database's clock, so a test ages one by moving its mark back
// (backdateCreateMark), and a command's own clock, however far from the database's, judges nothing.
//
// Found by an attack: a second open called a create still in flight "sent and its answer never came" and advised
// --retry; the --retry sent a second create, which made a second trade; its answer, a trade other than the one
// linked meanwhile, was reported "marked unknown" while the row said created, and the second trade was recorded
// nowhere.
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Kysely } from 'kysely'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import type { Database } from '../src/db/database.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { findOrderByExternalReference, setTradeCreateState } from '../src/orders/order.repository.js'
import { CREATE_MARGIN_MS } from '../src/trades/open-trade-for-order.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { FakeClock } from './helpers/fake-clock.js'
import { countingFetcher } from './helpers/reconcile-orders.js'
import { testPoller } from './helpers/reconcile-poller.js'
import { testLogger } from './helpers/log-sink.js'
import { backdateCreateMark, createOrder, restoreCreateMark, TEST_OBSERVATION_SETTINGS, markCreateSent } from './helpers/orders.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const TIMEOUT_MS = 10_000
const WHOLE_TIME_MS = TIMEOUT_MS + CREATE_MARGIN_MS

interface HeldCreate {
  externalReference: string
  answered: boolean
  answer(tradeId: string): void
}

// a platform that holds every create until the test answers it
const held: HeldCreate[] = []
let arrived: () => void = () => {}
const platform = createServer((request, response: ServerResponse) => {
  let body = ''
  request.setEncoding('utf8')
  request.on('data', (chunk: string) => (body += chunk))
  request.on('end', () => {
    const externalReference = String(JSON.parse(body).external_reference)
    const create: HeldCreate = {
      externalReference,
      answered: false,
      answer: (tradeId) => {
        create.answered = true
        response.writeHead(201, { 'content-type': 'application/json' })
        response.end(JSON.stringify(tradeRecord({ trade_id: tradeId, external_reference: externalReference })))
      },
    }
    held.push(create)
    arrived()
  })
})

let database: TestDatabase
/** The second replica's database: another pool on Postgres, the same handle on PGlite. */
let other: { db: Kysely<Database>; close(): Promise<void> }
let config: ReturnType<typeof testConfig>
const logger = testLogger([TEST_API_SECRET])

beforeAll(async () => {
  platform.listen(0, '127.0.0.1')
  await once(platform, 'listening')
  config = testConfig({
    PARTNER_API_BASE_URL: `http://127.0.0.1:${(platform.address() as AddressInfo).port}`,
    PARTNER_API_TIMEOUT_MS: String(TIMEOUT_MS),
  })
  database = await createTestDatabase()
  other = database.kind === 'postgres' ? database.openAnother() : { db: database.db, close: async () => {} }
})
// a create a test did not expect (one that should not have been sent) is answered, so its command ends
afterEach(() => {
  for (const create of held) if (!create.answered) create.answer(`tr_unexpected_${create.externalReference}`)
})
afterAll(async () => {
  platform.closeAllConnections()
  platform.close()
  await other.close()
  await database.close()
})

let counter = 0
const reference = () => `flight-${++counter}`

function open(db: Kysely<Database>, clock: FakeClock, ref: string, ...extra: string[]) {
  return openWith(config, db, clock, ref, ...extra)
}

function openWith(commandConfig: typeof config, db: Kysely<Database>, clock: FakeClock, ref: string, ...extra: string[]) {
  const context: CliContext = { config: commandConfig, logger, db, clock }
  return runCommandWith(
    ['trades', 'open', ref, '--title', 'T', '--amount', '1.00', '--currency', 'EUR', '--seller', 's', ...extra],
    context,
  )
}

/** The create the platform holds for `ref`, once it arrived. */
async function heldCreate(ref: string): Promise<HeldCreate> {
  for (;;) {
    const found = held.find((create) => create.externalReference === ref)
    if (found) return found
    await new Promise<void>((resolve) => (arrived = resolve))
  }
}

const createsFor = (ref: string) => held.filter((create) => create.externalReference === ref).length

async function order(ref: string) {
  const found = await findOrderByExternalReference(database.db, ref)
  if (!found) throw new Error(`no order ${ref}`)
  return found
}

/** An order whose create was marked pending `ageMs` ago by a command that then stopped (a crash mid-call). */
async function leftPending(ref: string, ageMs: number) {
  const { order: created } = await createOrder(database.db, { externalReference: ref })
  expect(await markCreateSent(database.db, created.id, 'none', { waitMs: WHOLE_TIME_MS })).toBeDefined()
  await backdateCreateMark(database.db, created.id, ageMs)
  return created.id
}

const escaped = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')

// the timeout only turns a command held at the platform by a create that should never have been sent into a failure
describe('trades open while another command is sending the same create', () => {
  it('refuses a second open and a --retry, sending nothing, says when the create would count as unknown, and the first links its trade', async () => {
    const ref = reference()
    const clock = new FakeClock()
    const first = open(database.db, clock, ref)
    const create = await heldCreate(ref)
    const mark = (await order(ref)).updatedAt
    const since = escaped(mark.toISOString())
    const settledBy = escaped(new Date(mark.getTime() + WHOLE_TIME_MS).toISOString())

    const second = await open(other.db, clock, ref)
    expect(second.code).toBe(1)
    expect(second.stdout).toBe('')
    expect(second.stderr).toMatch(
      new RegExp(
        `^A trade create for order ${ref} is being sent by another command right now \\(pending since ${since}, \\d\\.\\d s ago\\): ` +
          `nothing was sent\\. Its answer links the trade \\(see \`trades get ${ref}\`\\); if it is not answered, it counts as ` +
          `unanswered \\(unknown\\) from ${settledBy} on \\[trade_create_in_flight\\]\n$`,
      ),
    )
    expect(second.stderr).not.toContain('--retry')

    const retried = await open(other.db, clock, ref, '--retry')
    expect(retried.code).toBe(1)
    expect(retried.stderr).toMatch(
      new RegExp(
        `^A trade create for order ${ref} is being sent by another command right now \\(pending since ${since}, \\d\\.\\d s ago\\): ` +
          `--retry sends nothing while its answer may still come and link the trade; if it is not answered, it counts as ` +
          `unanswered \\(unknown\\) from ${settledBy} on \\[trade_create_in_flight\\]\n$`,
      ),
    )
    expect(createsFor(ref)).toBe(1)
    expect(await order(ref)).toMatchObject({ tradeCreateState: 'pending', tradeId: null })

    create.answer(`tr_${ref}`)
    const answered = await first
    expect(answered.code).toBe(0)
    expect(answered.stdout).toContain(`trade tr_${ref}`)
    expect(await order(ref)).toMatchObject({ tradeId: `tr_${ref}`, tradeCreateState: 'created', attention: null, tradeCreateWaitMs: null })
    expect((await open(other.db, clock, ref, '--retry')).stderr).toContain('[trade_exists]')
    expect(createsFor(ref)).toBe(1)
  })

  // found by an outside review: the mark was stamped with the sender's clock and judged with the judge's. A CLI whose
  // clock ran 20 s ahead called a create 2.5 s old "past its timeout: the command sending it stopped", and the --retry
  // it advised made a second trade on the platform; with the judge 20 s behind it said "-17.8 s ago"
  it("judges a pending create by the database's clock, a judge's own 20 s ahead or behind changing nothing", async () => {
    const ref = reference()
    const first = open(database.db, new FakeClock(Date.now()), ref)
    const create = await heldCreate(ref)
    const { id, updatedAt: mark } = await order(ref)
    // marked 2.5 s ago by the database's clock
    await backdateCreateMark(database.db, id, 2_500)
    for (const offsetMs of [20_000, -20_000]) {
      const judge = new FakeClock(Date.now() + offsetMs)
      for (const extra of [[], ['--retry']]) {
        const judged = await open(other.db, judge, ref, ...extra)
        expect(judged.code).toBe(1)
        expect(judged.stderr).toContain('[trade_create_in_flight]')
        expect(judged.stderr).not.toContain('past its timeout')
        const ageS = Number(/pending since \S+, (-?\d+\.\d) s ago\)/.exec(judged.stderr)?.[1])
        expect(ageS, judged.stderr).toBeGreaterThanOrEqual(2.5)
        expect(ageS, judged.stderr).toBeLessThan(10)
      }
      // the poller's check for creates never answered, on the same clock, leaves it alone too
      const cycle = await testPoller({ db: other.db, fetcher: countingFetcher(() => 'funded'), clock: judge, settings: { unresolvedCreateAfterS: 1 } }).runOnce()
      expect(cycle.flaggedCreates).not.toContain(ref)
    }
    expect(createsFor(ref)).toBe(1)
    expect(await order(ref)).toMatchObject({ tradeCreateState: 'pending', attention: null })
    // the mark its command wrote, which it records its answer under
    await restoreCreateMark(database.db, id, mark)
    create.answer(`tr_${ref}`)
    expect((await first).code).toBe(0)
    expect(await order(ref)).toMatchObject({ tradeId: `tr_${ref}`, tradeCreateState: 'created' })
  })

  it('takes a pending create for its command stopped only once its whole time is past: unknown, then --retry sends it', async () => {
    const ref = reference()
    const clock = new FakeClock()
    const orderId = await leftPending(ref, WHOLE_TIME_MS - 3_000)

    const early = await open(other.db, clock, ref, '--retry')
    expect(early.code).toBe(1)
    expect(early.stderr).toContain('[trade_create_in_flight]')
    expect(createsFor(ref)).toBe(0)

    await backdateCreateMark(database.db, orderId, WHOLE_TIME_MS)
    const markedAt = (await order(ref)).updatedAt
    const refused = await open(other.db, clock, ref)
    expect(refused.code).toBe(1)
    expect(refused.stderr).toBe(
      `A trade create for order ${ref} was sent at ${markedAt.toISOString()} and its answer was never recorded (state ` +
        'pending, past its timeout: the command sending it stopped): the trade may exist and will be linked when its ' +
        'webhook arrives. Check the platform, then send it again only on purpose with --retry (a second create can ' +
        'make a second trade). [trade_create_unknown]\n',
    )
    expect(createsFor(ref)).toBe(0)

    const retried = open(other.db, clock, ref, '--retry')
    ;(await heldCreate(ref)).answer(`tr_${ref}`)
    expect((await retried).code).toBe(0)
    expect(createsFor(ref)).toBe(1)
    expect(await order(ref)).toMatchObject({ tradeId: `tr_${ref}`, tradeCreateState: 'created' })
  })

  // found by an outside look at the last fix: judged by the judge's own timeout, a CLI with a shorter
  // PARTNER_API_TIMEOUT_MS than the service's took the service's create, still at the platform, for stopped
  it("judges a pending create by the whole time of the command that sent it, not by its own shorter timeout", async () => {
    const ref = reference()
    const clock = new FakeClock()
    const senderWholeMs = 40_000 + CREATE_MARGIN_MS
    const patient = { ...config, partner: { ...config.partner, timeoutMs: 40_000 } }
    const first = openWith(patient, database.db, clock, ref)
    const create = await heldCreate(ref)
    const { id, updatedAt: mark } = await order(ref)
    // past this command's own whole time (15 s), within the sender's (45 s)
    await backdateCreateMark(database.db, id, WHOLE_TIME_MS + 5_000)
    const since = (await order(ref)).updatedAt.toISOString()

    const retried = await open(other.db, clock, ref, '--retry')
    expect(retried.code).toBe(1)
    expect(retried.stderr).toMatch(
      new RegExp(
        `^A trade create for order ${ref} is being sent by another command right now \\(pending since ${escaped(since)}, 20\\.\\d s ago\\): ` +
          `--retry sends nothing while its answer may still come and link the trade; if it is not answered, it counts as ` +
          `unanswered \\(unknown\\) from ${escaped(new Date(Date.parse(since) + senderWholeMs).toISOString())} on \\[trade_create_in_flight\\]\n$`,
      ),
    )
    expect(createsFor(ref)).toBe(1)

    await restoreCreateMark(database.db, id, mark)
    create.answer(`tr_${ref}`)
    expect((await first).code).toBe(0)
    expect(await order(ref)).toMatchObject({ tradeId: `tr_${ref}`, tradeCreateState: 'created' })
  })

  it("judges a pending create marked by an older version by its own whole time, none being left from an earlier create", async () => {
    const ref = reference()
    const clock = new FakeClock()
    const orderId = await leftPending(ref, 60_000)
    // this version's create ends (unknown here): its whole time goes with it
    await setTradeCreateState(database.db, orderId, 'unknown')
    expect(await order(ref)).toMatchObject({ tradeCreateState: 'unknown', tradeCreateWaitMs: null })
    // an older replica, which knows nothing of the column, marks its own create pending (a rolling upgrade)
    await database.db.updateTable('orders').set({ tradeCreateState: 'pending' }).where('id', '=', orderId).execute()
    await backdateCreateMark(database.db, orderId, WHOLE_TIME_MS - 3_000)
    expect((await open(other.db, clock, ref, '--retry')).stderr).toContain('[trade_create_in_flight]')
    await backdateCreateMark(database.db, orderId, WHOLE_TIME_MS)
    const retried = open(other.db, clock, ref, '--retry')
    ;(await heldCreate(ref)).answer(`tr_${ref}`)
    expect((await retried).code).toBe(0)
    expect(createsFor(ref)).toBe(1)
  })

  it('sends one create when two --retry race for a pending create whose command stopped', async () => {
    const ref = reference()
    const clock = new FakeClock()
    await leftPending(ref, WHOLE_TIME_MS)
    const retries = [open(database.db, clock, ref, '--retry'), open(other.db, clock, ref, '--retry')]
    ;(await heldCreate(ref)).answer(`tr_${ref}`)
    const results = await Promise.all(retries)
    expect(results.map((result) => result.code).sort()).toEqual([0, 1])
    // the one that lost is refused as in flight, or, when it read the order after the winner's answer, as linked
    expect(results.find((result) => result.code === 1)?.stderr).toMatch(/\[trade_create_in_flight\]\n$|^Order \S+ already has trade tr_\S+ \(created\) \[trade_exists\]\n$/)
    expect(createsFor(ref)).toBe(1)
    expect(await order(ref)).toMatchObject({ tradeId: `tr_${ref}`, tradeCreateState: 'created' })
  })

  it('flags the order trade_mismatch, and says so, when a --retry is answered with a trade other than the one linked meanwhile', async () => {
    const ref = reference()
    const clock = new FakeClock()
    const orderId = await leftPending(ref, 60_000)
    await setTradeCreateState(database.db, orderId, 'unknown')
    const retried = open(other.db, clock, ref, '--retry')
    const create = await heldCreate(ref)
    // the first create did make a trade: its webhook links it while the --retry is at the platform
    const linked = await applyObservation(
      database.db,
      {
        target: { externalReference: ref },
        tradeId: 'tr_280',
        tradeReference: 'TRD-280',
        externalReference: ref,
        status: 'created',
        source: 'webhook',
        deliveryId: `dlv_${ref}`,
        observedAt: new Date(clock.now()),
      },
      TEST_OBSERVATION_SETTINGS,
    )
    expect(linked.outcome).toBe('applied')
    create.answer('tr_281')

    const result = await retried
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(
      `The platform answered for order ${ref} (a trade create) with the record of trade tr_281 for external reference ` +
        `${ref}: another trade or order. Nothing of it was applied: the order was linked to trade tr_280 meanwhile (by ` +
        'its webhook or another command), so the platform may now hold a second trade for it. The order is flagged ' +
        'trade_mismatch and polled no more: check its trades on the platform, cancel the one not linked, then ' +
        `\`reconcile --requeue ${ref}\`. [answer_mismatch]\n`,
    )
    expect(result.stderr).not.toContain('marked unknown')
    expect(await order(ref)).toMatchObject({
      tradeId: 'tr_280',
      tradeStatus: 'created',
      tradeCreateState: 'created',
      attention: 'trade_mismatch',
      nextPollAt: null,
    })
  })
})
