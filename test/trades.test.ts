import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { applyObservation } from '../src/orders/apply-observation.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { backdateCreateMark, createOrder, markCreateSent } from './helpers/orders.js'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import {
  PartnerAnswerAbandonedError,
  PartnerApiError,
  PartnerNetworkError,
  PartnerTimeoutError,
  PartnerValidationError,
} from '../src/partner-api/partner-api-error.js'
import { CREATE_MARGIN_MS, openTradeForOrder } from '../src/trades/open-trade-for-order.js'
import { runTradeOperation } from '../src/trades/run-trade-operation.js'
import type { CallGuard, PartnerTradeApi, TradeDeps } from '../src/trades/trade-deps.js'
import { TradeOperationError } from '../src/trades/trade-operation-error.js'
import { FakeClock } from './helpers/fake-clock.js'
import { taggedLogger } from './helpers/log-sink.js'
import { fakeTradeApi } from './helpers/partner-api-fake-client.js'
import { milestoneRecord, tradeRecord } from './helpers/partner-api-fixtures.js'
import { startRecordingServer } from './helpers/partner-api-recording-server.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { NO_REACTION_HANDLERS } from '../src/orders/apply-observation.js'

const SECRET = 'apisec_trades_test_9d8c7b6a5f4e3d2c1b0a'
const EXPECTED_WEBHOOK_S = 600
const CREATE_TIMEOUT_MS = 10_000
const STALE_AFTER_S = 21_600
// the operations' own lines: another file's in the same worker are not theirs (log-sink.ts, taggedLogger)
const own = taggedLogger([SECRET])
const logger = own.logger

const request = { title: 'Used bicycle', amount: '120.00', currency: 'EUR', seller_id: 'seller_1' }

let database: TestDatabase
let counter = 0
const reference = () => `order-${++counter}`

beforeAll(async () => {
  database = await createTestDatabase()
})
afterAll(async () => {
  await database.close()
})

function deps(client: PartnerTradeApi, clock = new FakeClock()): TradeDeps & { clock: FakeClock } {
  return {
    db: database.db,
    client,
    clock,
    logger,
    settings: { expectedWebhookS: EXPECTED_WEBHOOK_S, observation: { staleAfterS: STALE_AFTER_S, handlersFor: NO_REACTION_HANDLERS }, partnerKind: 'marketplace', createTimeoutMs: CREATE_TIMEOUT_MS },
  }
}

/** A promise the test resolves when it wants (Promise.withResolvers, which Node 20 lacks). */
function gate(): { promise: Promise<void>; resolve: () => void } {
  let resolve: () => void = () => {}
  const promise = new Promise<void>((done) => (resolve = done))
  return { promise, resolve }
}

async function order(ref: string) {
  const found = await findOrderByExternalReference(database.db, ref)
  if (!found) throw new Error(`no order ${ref}`)
  return found
}

async function history(orderId: number) {
  return database.db
    .selectFrom('orderStatusHistory')
    .select(['fromStatus', 'toStatus', 'source'])
    .where('orderId', '=', orderId)
    .orderBy('id')
    .execute()
}

describe('openTradeForOrder', () => {
  it('links the order to the new trade and schedules its first poll EXPECTED_WEBHOOK_S later', async () => {
    const ref = reference()
    const clock = new FakeClock()
    const client = fakeTradeApi({
      createTrade: async (req) => tradeRecord({ trade_id: 'tr_link', reference: 'TRD-LINK', external_reference: req.external_reference }),
    })
    const trade = await openTradeForOrder(deps(client, clock), ref, request)

    expect(trade.trade_id).toBe('tr_link')
    expect(client.calls).toEqual([{ method: 'createTrade', args: [{ ...request, external_reference: ref }] }])
    const linked = await order(ref)
    expect(linked).toMatchObject({
      tradeId: 'tr_link',
      tradeReference: 'TRD-LINK',
      tradeStatus: 'created',
      tradeCreateState: 'created',
    })
    expect(linked.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
    expect(await history(linked.id)).toEqual([{ fromStatus: null, toStatus: 'created', source: 'api' }])
  })

  it('marks the order pending before the create is sent', async () => {
    const ref = reference()
    let stateDuringCall: string | undefined
    const client = fakeTradeApi({
      createTrade: async (req) => {
        stateDuringCall = (await order(ref)).tradeCreateState
        return tradeRecord({ trade_id: `tr_${ref}`, external_reference: req.external_reference })
      },
    })
    await openTradeForOrder(deps(client), ref, request)
    expect(stateDuringCall).toBe('pending')
  })

  it('sends nothing and sets the order back when a stop comes while the create is being marked pending', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const client = fakeTradeApi()
    // no stop at the first look (before anything is written), a stop at the second (right before sending)
    let looks = 0
    const guard: CallGuard = { stopRequested: () => ++looks >= 2, sending: () => new AbortController().signal, settled: () => {} }
    await expect(openTradeForOrder({ ...deps(client), guard }, ref, request)).rejects.toMatchObject({ code: 'stopped' })
    expect(looks).toBe(2)
    expect(client.calls).toEqual([])
    expect((await order(ref)).tradeCreateState).toBe('none')
  })

  it('keeps the order it created, with no trade, when a stop comes before the create is sent, and says so', async () => {
    const ref = reference()
    const client = fakeTradeApi()
    let looks = 0
    const guard: CallGuard = { stopRequested: () => ++looks >= 2, sending: () => new AbortController().signal, settled: () => {} }
    let created = 0
    const stopped = await openTradeForOrder({ ...deps(client), guard }, ref, request, { onOrderCreated: () => created++ }).catch((e) => e)
    expect(stopped).toMatchObject({ code: 'stopped' })
    expect(stopped.message).toMatch(/nothing sent to the platform, the order created locally, with no trade$/)
    expect(created).toBe(1)
    expect(client.calls).toEqual([])
    expect(await order(ref)).toMatchObject({ tradeId: null, tradeCreateState: 'none' })
  })

  it('uses an existing order rather than making a second one', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const before = await order(ref)
    await openTradeForOrder(deps(fakeTradeApi()), ref, request)
    expect((await order(ref)).id).toBe(before.id)
  })

  for (const [name, failure] of [
    ['times out', new PartnerTimeoutError('POST /api/partner/v1/trades/: no answer within 10000 ms', 10_000)],
    ['loses its connection', new PartnerNetworkError('POST /api/partner/v1/trades/ failed: ECONNRESET')],
    // the spec's base URL is a gateway: its 502 or 504, or a server failing part-way, may come after the trade was made
    ...[500, 502, 503, 504].map((status) => [`is answered ${status}`, new PartnerApiError(status, `http_${status}`, 'upstream failed', undefined)] as const),
  ] as const) {
    it(`marks the order unknown when the create ${name}, refuses a second open without retry, and sends again with retry`, async () => {
      const ref = reference()
      let attempts = 0
      const client = fakeTradeApi({
        createTrade: async (req) => {
          attempts++
          if (attempts === 1) throw failure
          return tradeRecord({ trade_id: `tr_${ref}`, external_reference: req.external_reference })
        },
      })
      await expect(openTradeForOrder(deps(client), ref, request)).rejects.toBe(failure)
      expect(await order(ref)).toMatchObject({ tradeCreateState: 'unknown', tradeId: null, nextPollAt: null })

      const refused = await openTradeForOrder(deps(client), ref, request).catch((e) => e)
      expect(refused).toBeInstanceOf(TradeOperationError)
      expect(refused.code).toBe('trade_create_unknown')
      expect(refused.message).toContain('--retry')
      expect(client.calls).toHaveLength(1)

      await openTradeForOrder(deps(client), ref, request, { retry: true })
      expect(client.calls).toHaveLength(2)
      expect(await order(ref)).toMatchObject({ tradeCreateState: 'created', tradeId: `tr_${ref}` })
    })
  }

  it('refuses a second open of an order left pending by a crash mid-call, unless retried', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    // marked longer ago than the create's whole time: the command that sent it is gone
    const clock = new FakeClock()
    const { id } = await order(ref)
    expect(await markCreateSent(database.db, id, 'none', { waitMs: CREATE_TIMEOUT_MS + CREATE_MARGIN_MS })).toBeDefined()
    await backdateCreateMark(database.db, id, CREATE_TIMEOUT_MS + CREATE_MARGIN_MS)
    const client = fakeTradeApi()
    await expect(openTradeForOrder(deps(client, clock), ref, request)).rejects.toMatchObject({ code: 'trade_create_unknown' })
    expect(client.calls).toHaveLength(0)
    await openTradeForOrder(deps(client, clock), ref, request, { retry: true })
    expect((await order(ref)).tradeCreateState).toBe('created')
  })

  it('leaves a pending create it took over unknown, not freshly pending, when the platform refuses the --retry', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    const clock = new FakeClock()
    const { id } = await order(ref)
    expect(await markCreateSent(database.db, id, 'none', { waitMs: CREATE_TIMEOUT_MS + CREATE_MARGIN_MS })).toBeDefined()
    await backdateCreateMark(database.db, id, CREATE_TIMEOUT_MS + CREATE_MARGIN_MS)
    const refusal = new PartnerApiError(422, 'validation_failed', 'invalid fields', undefined)
    const client = fakeTradeApi({
      createTrade: async () => {
        throw refusal
      },
    })
    await expect(openTradeForOrder(deps(client, clock), ref, request, { retry: true })).rejects.toBe(refusal)
    // its command is gone and nothing is sending it: as unknown as a create that timed out, not one in flight
    expect((await order(ref)).tradeCreateState).toBe('unknown')
    await expect(openTradeForOrder(deps(client, clock), ref, request)).rejects.toMatchObject({ code: 'trade_create_unknown' })
  })

  it('leaves a create taken over by a --retry to that command when the first one’s timeout comes late', async () => {
    const ref = reference()
    const clock = new FakeClock()
    const timeOut = gate()
    const answerRetry = gate()
    const sent = [gate(), gate()]
    const client = fakeTradeApi({
      createTrade: async (req) => {
        const attempt = client.calls.length
        sent[attempt - 1]!.resolve()
        if (attempt === 1) {
          // the first command's timer fires only after its create was judged stopped and taken over
          await timeOut.promise
          throw new PartnerTimeoutError('no answer', CREATE_TIMEOUT_MS)
        }
        await answerRetry.promise
        return tradeRecord({ trade_id: `tr_${ref}`, external_reference: req.external_reference })
      },
    })
    const first = openTradeForOrder(deps(client, clock), ref, request).catch((e) => e)
    await sent[0]!.promise
    // the first create's whole time past, by the database's clock that stamped its mark
    await backdateCreateMark(database.db, (await order(ref)).id, CREATE_TIMEOUT_MS + CREATE_MARGIN_MS)
    const retried = openTradeForOrder(deps(client, clock), ref, request, { retry: true })
    await sent[1]!.promise
    const retryMark = (await order(ref)).updatedAt
    timeOut.resolve()
    expect(await first).toBeInstanceOf(PartnerTimeoutError)
    // still the retry's create, marked when it was sent: another open is told it is in flight
    expect(await order(ref)).toMatchObject({ tradeCreateState: 'pending', updatedAt: retryMark })
    await expect(openTradeForOrder(deps(client, clock), ref, request)).rejects.toMatchObject({ code: 'trade_create_in_flight' })
    answerRetry.resolve()
    await retried
    expect(await order(ref)).toMatchObject({ tradeId: `tr_${ref}`, tradeCreateState: 'created' })
    expect(client.calls).toHaveLength(2)
  })

  it('links an unknown create when the webhook with its external reference arrives, and then refuses to open again', async () => {
    const ref = reference()
    const client = fakeTradeApi({
      createTrade: async () => {
        throw new PartnerTimeoutError('no answer', 10_000)
      },
    })
    await expect(openTradeForOrder(deps(client), ref, request)).rejects.toBeInstanceOf(PartnerTimeoutError)
    await applyObservation(
      database.db,
      {
        target: { externalReference: ref },
        tradeId: 'tr_from_webhook',
        tradeReference: 'TRD-WH',
        externalReference: ref,
        status: 'created',
        source: 'webhook',
        deliveryId: `dlv_${ref}`,
        observedAt: new Date(),
      },
      { staleAfterS: STALE_AFTER_S, handlersFor: NO_REACTION_HANDLERS },
    )
    expect(await order(ref)).toMatchObject({ tradeId: 'tr_from_webhook', tradeReference: 'TRD-WH' })
    const refused = await openTradeForOrder(deps(client), ref, request, { retry: true }).catch((e) => e)
    expect(refused).toMatchObject({ code: 'trade_exists' })
    expect(client.calls).toHaveLength(1)
  })

  it('sets the create state back to none when the platform refuses the create, so it can be sent again', async () => {
    const ref = reference()
    const refusal = new PartnerApiError(422, 'validation_failed', 'invalid fields', {
      error: { code: 'validation_failed', message: 'invalid fields' },
    })
    let attempts = 0
    const client = fakeTradeApi({
      createTrade: async (req) => {
        if (++attempts === 1) throw refusal
        return tradeRecord({ trade_id: `tr_${ref}`, external_reference: req.external_reference })
      },
    })
    await expect(openTradeForOrder(deps(client), ref, request)).rejects.toBe(refusal)
    expect(await order(ref)).toMatchObject({ tradeCreateState: 'none', tradeId: null })
    await openTradeForOrder(deps(client), ref, request)
    expect((await order(ref)).tradeCreateState).toBe('created')
  })

  it('keeps the evidence of an earlier unknown create when a retry is refused', async () => {
    const ref = reference()
    const answers = [
      new PartnerTimeoutError('no answer', 10_000),
      new PartnerApiError(409, 'invalid_state', 'duplicate external_reference', undefined),
    ]
    const client = fakeTradeApi({
      createTrade: async () => {
        throw answers.shift()
      },
    })
    await expect(openTradeForOrder(deps(client), ref, request)).rejects.toBeInstanceOf(PartnerTimeoutError)
    await expect(openTradeForOrder(deps(client), ref, request, { retry: true })).rejects.toBeInstanceOf(
      PartnerApiError,
    )
    expect((await order(ref)).tradeCreateState).toBe('unknown')
  })

  it('sends nothing and creates no order when the request fails validation', async () => {
    const ref = reference()
    const { fetch, calls } = (await import('./helpers/partner-api-fake-fetch.js')).scriptedFetch([])
    const client = new PartnerApiClient({
      baseUrl: 'http://platform.test',
      keyId: 'pk_trades',
      secret: SECRET,
      env: 'sandbox',
      kind: 'marketplace',
      timeoutMs: 1000,
      clock: new FakeClock(),
      logger,
      fetch,
    })
    const { seller_id: _seller, ...withoutSeller } = request
    const error = await openTradeForOrder(deps(client), ref, withoutSeller).catch((e) => e)
    expect(error).toBeInstanceOf(PartnerValidationError)
    expect(error.field).toBe('seller_id')
    expect(calls).toHaveLength(0)
    expect(await findOrderByExternalReference(database.db, ref)).toBeUndefined()
  })

  it('links nothing and marks the create unknown when the platform answers with another order’s trade', async () => {
    const ref = reference()
    const client = fakeTradeApi({
      createTrade: async () => tradeRecord({ trade_id: 'tr_stranger', status: 'released', external_reference: 'someone-else' }),
    })
    await expect(openTradeForOrder(deps(client), ref, request)).rejects.toMatchObject({
      name: 'TradeOperationError',
      code: 'answer_mismatch',
      message: expect.stringContaining('--retry'),
    })
    const after = await order(ref)
    expect(after).toMatchObject({ tradeId: null, tradeStatus: null, tradeCreateState: 'unknown' })
    expect(await history(after.id)).toEqual([])
    await expect(openTradeForOrder(deps(fakeTradeApi()), ref, request)).rejects.toMatchObject({ code: 'trade_create_unknown' })
  })

  it('links nothing and marks the create unknown when the platform answers with a trade another order has', async () => {
    const first = reference()
    const second = reference()
    const sameTrade = fakeTradeApi({
      createTrade: async (req) => tradeRecord({ trade_id: 'tr_shared', external_reference: req.external_reference }),
    })
    await openTradeForOrder(deps(sameTrade), first, request)
    await expect(openTradeForOrder(deps(sameTrade), second, request)).rejects.toMatchObject({
      name: 'TradeOperationError',
      code: 'answer_mismatch',
    })
    expect(await order(second)).toMatchObject({ tradeId: null, tradeStatus: null, tradeCreateState: 'unknown' })
    expect(await order(first)).toMatchObject({ tradeId: 'tr_shared', tradeStatus: 'created' })
  })

  it('refuses to open a trade for an order that already has one', async () => {
    const ref = reference()
    const client = fakeTradeApi()
    await openTradeForOrder(deps(client), ref, request)
    await expect(openTradeForOrder(deps(client), ref, request, { retry: true })).rejects.toMatchObject({
      code: 'trade_exists',
    })
    expect(client.calls).toHaveLength(1)
  })

  it('sends one create when two opens of the same order race', async () => {
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    let release: () => void = () => {}
    const gate = new Promise<void>((resolve) => {
      release = resolve
    })
    const client = fakeTradeApi({
      createTrade: async (req) => {
        await gate
        return tradeRecord({ trade_id: `tr_${ref}`, external_reference: req.external_reference })
      },
    })
    const first = openTradeForOrder(deps(client), ref, request)
    const second = openTradeForOrder(deps(client), ref, request)
    const outcomes = await Promise.allSettled([
      first,
      second.finally(() => release()),
    ])
    release()
    expect(outcomes.filter((outcome) => outcome.status === 'fulfilled')).toHaveLength(1)
    expect(client.calls).toHaveLength(1)
  })
})

describe('runTradeOperation', () => {
  async function openedOrder(clock = new FakeClock()) {
    const ref = reference()
    await openTradeForOrder(deps(fakeTradeApi(), clock), ref, request)
    return { ref, clock, opened: await order(ref) }
  }

  it('applies the status the platform answered (source api) and schedules a poll EXPECTED_WEBHOOK_S later', async () => {
    const { ref, clock, opened } = await openedOrder()
    await clock.advance(60_000)
    const client = fakeTradeApi()
    const trade = await runTradeOperation(deps(client, clock), ref, { kind: 'fund' })

    expect(trade.status).toBe('funded')
    expect(client.calls).toEqual([{ method: 'fundTrade', args: [opened.tradeId] }])
    const funded = await order(ref)
    expect(funded).toMatchObject({ tradeStatus: 'funded', statusSource: 'api' })
    expect(funded.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
    expect((await history(funded.id)).at(-1)).toEqual({ fromStatus: 'created', toStatus: 'funded', source: 'api' })
  })

  it('keeps the webhook\'s status when a call answers an unknown status the order moved past while it was on its way, and polls now', async () => {
    const { ref, clock, opened } = await openedOrder()
    // the fund was taken while the trade's funding was pending; its webhook came before the call's answer
    const client = fakeTradeApi({
      fundTrade: async (tradeId) => {
        const funded = { target: { externalReference: ref }, tradeId, externalReference: ref, status: 'funded', source: 'webhook' as const, deliveryId: `d-${ref}`, observedAt: new Date(clock.now()) }
        expect((await applyObservation(database.db, funded, { staleAfterS: STALE_AFTER_S, handlersFor: NO_REACTION_HANDLERS })).outcome).toBe('applied')
        return tradeRecord({ trade_id: tradeId, status: 'funding_pending', external_reference: ref })
      },
    })
    const answer = await runTradeOperation(deps(client, clock), ref, { kind: 'fund' })
    expect(answer.status).toBe('funding_pending')
    const funded = await order(ref)
    expect(funded).toMatchObject({ tradeStatus: 'funded', statusSource: 'webhook' })
    expect(funded.nextPollAt!.getTime()).toBeLessThanOrEqual(clock.now())
    expect((await history(opened.id)).map((row) => `${row.fromStatus}->${row.toStatus} ${row.source}`)).toEqual([
      'null->created api',
      'created->funded webhook',
    ])
  })

  it('calls the milestone operations with the milestone id', async () => {
    const { ref, opened } = await openedOrder()
    const client = fakeTradeApi()
    await runTradeOperation(deps(client), ref, { kind: 'deliver_milestone', milestoneId: 'ms_1' })
    await runTradeOperation(deps(client), ref, { kind: 'release_milestone', milestoneId: 'ms_1' })
    expect(client.calls).toEqual([
      { method: 'deliverMilestone', args: [opened.tradeId, 'ms_1'] },
      { method: 'releaseMilestone', args: [opened.tradeId, 'ms_1'] },
    ])
  })

  it('applies no trade status from a milestone record, which carries none, and still polls EXPECTED_WEBHOOK_S later', async () => {
    const { ref, clock, opened } = await openedOrder()
    await runTradeOperation(deps(fakeTradeApi(), clock), ref, { kind: 'fund' })
    const funded = await order(ref)
    await clock.advance(30_000)
    const before = own.entries().length
    // what the platform says of the milestone, even a status that reads like a trade's, is not the trade's
    const delivered = milestoneRecord({ milestone_id: 'ms_1', status: 'released' })
    const client = fakeTradeApi({
      deliverMilestone: async () => ({ record: 'milestone', milestone: delivered }),
      releaseMilestone: async () => ({ record: 'milestone', milestone: { milestone_id: 'ms_1' } }),
    })

    const answer = await runTradeOperation(deps(client, clock), ref, { kind: 'deliver_milestone', milestoneId: 'ms_1' })
    expect(answer).toEqual({ record: 'milestone', milestone: delivered })
    const after = await order(ref)
    expect(after).toMatchObject({ tradeId: opened.tradeId, tradeStatus: 'funded', statusSource: 'api', statusChangedAt: funded.statusChangedAt })
    expect(after.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
    expect(await history(after.id)).toEqual([
      { fromStatus: null, toStatus: 'created', source: 'api' },
      { fromStatus: 'created', toStatus: 'funded', source: 'api' },
    ])
    const done = own.entries().slice(before).filter((entry) => entry.msg === 'trade operation done')
    expect(done).toEqual([
      expect.objectContaining({ operation: 'deliver_milestone', record: 'milestone', milestoneId: 'ms_1', milestoneStatus: 'released' }),
    ])
    expect(done[0]).not.toHaveProperty('status')

    await clock.advance(5_000)
    expect(await runTradeOperation(deps(client, clock), ref, { kind: 'release_milestone', milestoneId: 'ms_1' })).toEqual({
      record: 'milestone',
      milestone: { milestone_id: 'ms_1' },
    })
    expect((await order(ref)).nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
    expect((await order(ref)).tradeStatus).toBe('funded')
  })

  it('applies the trade status of a trade record that a milestone operation answered', async () => {
    const { ref, clock, opened } = await openedOrder()
    const before = own.entries().length
    const trade = tradeRecord({ trade_id: opened.tradeId!, external_reference: ref, status: 'released' })
    const client = fakeTradeApi({ releaseMilestone: async () => ({ record: 'trade', trade }) })
    expect(await runTradeOperation(deps(client, clock), ref, { kind: 'release_milestone', milestoneId: 'ms_1' })).toEqual({
      record: 'trade',
      trade,
    })
    const after = await order(ref)
    expect(after).toMatchObject({ tradeStatus: 'released', statusSource: 'api' })
    expect((await history(after.id)).at(-1)).toEqual({ fromStatus: 'created', toStatus: 'released', source: 'api' })
    expect(own.entries().slice(before).filter((entry) => entry.msg === 'trade operation done')).toEqual([
      expect.objectContaining({ operation: 'release_milestone', record: 'trade', status: 'released' }),
    ])
  })

  it('applies nothing, says so and polls soon when a milestone operation answers another milestone’s record', async () => {
    const { ref, clock, opened } = await openedOrder()
    await clock.advance(1_000)
    const before = own.entries().length
    const client = fakeTradeApi({
      deliverMilestone: async () => ({ record: 'milestone', milestone: milestoneRecord({ milestone_id: 'ms_other\nforged' }) }),
    })
    const error = await runTradeOperation(deps(client, clock), ref, { kind: 'deliver_milestone', milestoneId: 'ms_1' }).catch((e) => e)
    expect(error).toMatchObject({ name: 'TradeOperationError', code: 'answer_mismatch' })
    // the answered id on one line: a line feed in it forges no line
    expect(error.message).toBe(
      `The platform answered for order ${ref} (milestone ms_1 of trade ${opened.tradeId}) with the record of milestone ` +
        'ms_other\\u000aforged: another milestone. Nothing of it was applied, and what the call did is not known: check ' +
        'with `trades get`; the order is polled soon.',
    )
    const after = await order(ref)
    expect(after).toMatchObject({ tradeId: opened.tradeId, tradeStatus: 'created' })
    expect(after.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
    expect(await history(after.id)).toEqual([{ fromStatus: null, toStatus: 'created', source: 'api' }])
    const entries = own.entries().slice(before)
    expect(entries.filter((entry) => entry.msg === 'trade operation done')).toEqual([])
    expect(entries).toContainEqual(
      expect.objectContaining({ msg: 'the platform answered the record of another milestone: order not changed', milestoneId: 'ms_1', answeredMilestoneId: 'ms_other\nforged' }),
    )
  })

  it('applies nothing, says so and polls soon when a respond answers another proposal, or a dispute or proposal names another trade', async () => {
    const { ref, clock, opened } = await openedOrder()
    await clock.advance(1_000)
    const ownTrade = tradeRecord({ trade_id: opened.tradeId!, external_reference: ref, status: 'resolved' })
    const client = fakeTradeApi({
      respondToProposal: async () => ({ proposal: { proposal_id: 'pr_other' }, trade: ownTrade }),
      openDispute: async () => ({ dispute_id: 'dp_9', trade_id: 'tr_someone_else' }),
      createProposal: async () => ({ proposal_id: 'pr_9', trade_id: 'tr_someone_else' }),
    })
    const failure = (operation: Parameters<typeof runTradeOperation>[2]) => runTradeOperation(deps(client, clock), ref, operation).catch((e) => e)
    const respond = await failure({ kind: 'respond', proposalId: 'pr_1', request: { accept: true, party: 'seller' } })
    expect(respond).toMatchObject({ name: 'TradeOperationError', code: 'answer_mismatch' })
    expect(respond.message).toBe(
      `The platform answered for order ${ref} (proposal pr_1 of trade ${opened.tradeId}) with the record of proposal pr_other: ` +
        'another proposal. Nothing of it was applied, and what the call did is not known: check with `trades get`; the order is polled soon.',
    )
    const dispute = await failure({ kind: 'dispute', request: { reason: 'The frame arrived bent and scratched', party: 'buyer' } })
    expect(dispute.message).toContain(`(a dispute on trade ${opened.tradeId}) with the record of dispute dp_9 of trade tr_someone_else: another trade.`)
    const proposal = await failure({ kind: 'proposal', request: { outcome: 'buyer_win', party: 'buyer' } })
    expect(proposal.message).toContain(`(a proposal on trade ${opened.tradeId}) with the record of proposal pr_9 of trade tr_someone_else: another trade.`)
    // the respond's trade record (resolved) was not applied
    const after = await order(ref)
    expect(after).toMatchObject({ tradeStatus: 'created' })
    expect(after.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
    expect(await history(after.id)).toEqual([{ fromStatus: null, toStatus: 'created', source: 'api' }])
  })

  it('schedules a poll after opening a dispute, whose answer carries no trade status', async () => {
    const { ref, clock } = await openedOrder()
    await clock.advance(5_000)
    const dispute = await runTradeOperation(deps(fakeTradeApi(), clock), ref, {
      kind: 'dispute',
      request: { reason: 'The frame arrived bent and scratched', party: 'buyer' },
    })
    expect(dispute.dispute_id).toBe('dp_1')
    const after = await order(ref)
    expect(after.tradeStatus).toBe('created')
    expect(after.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
  })

  it('applies the trade status that comes back with an accepted proposal', async () => {
    const { ref } = await openedOrder()
    const client = fakeTradeApi()
    await runTradeOperation(deps(client), ref, { kind: 'proposal', request: { outcome: 'buyer_win', party: 'seller' } })
    const result = await runTradeOperation(deps(client), ref, {
      kind: 'respond',
      proposalId: 'pr_1',
      request: { accept: true, party: 'buyer' },
    })
    expect(result.proposal.status).toBe('accepted')
    expect((await order(ref)).tradeStatus).toBe(result.trade.status)
  })

  it.each([
    ['times out', new PartnerTimeoutError('no answer', 10_000)],
    ['is answered 504', new PartnerApiError(504, 'gateway_timeout', 'upstream timed out', undefined)],
  ])('schedules a poll and rethrows when the outcome of an operation is unknown: it %s', async (_, failure) => {
    const { ref, clock } = await openedOrder()
    await clock.advance(1_000)
    const client = fakeTradeApi({
      releaseTrade: async () => {
        throw failure
      },
    })
    await expect(runTradeOperation(deps(client, clock), ref, { kind: 'release' })).rejects.toBe(failure)
    expect((await order(ref)).nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
  })

  it('records a call whose answer the operator stopped waiting for as a timeout: polled soon, the status as it was', async () => {
    const { ref, clock } = await openedOrder()
    await clock.advance(1_000)
    const stop = new AbortController()
    const client = fakeTradeApi({
      fundTrade: (_tradeId, options) => {
        const signal = options!.signal!
        // the operator's second Ctrl-C, once the call is in flight
        queueMicrotask(() => stop.abort(new PartnerAnswerAbandonedError('Stopped waiting')))
        return new Promise((_resolve, reject) => signal.addEventListener('abort', () => reject(signal.reason)))
      },
    })
    const settled: string[] = []
    const guard: CallGuard = { stopRequested: () => false, sending: () => stop.signal, settled: () => settled.push('settled') }
    await expect(runTradeOperation({ ...deps(client, clock), guard }, ref, { kind: 'fund' })).rejects.toBeInstanceOf(
      PartnerAnswerAbandonedError,
    )
    expect(settled).toEqual(['settled'])
    const after = await order(ref)
    expect(after.tradeStatus).toBe('created')
    expect(after.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
  })

  it('sends nothing when a stop came before the operation was sent', async () => {
    const { ref, opened } = await openedOrder()
    const client = fakeTradeApi()
    const guard: CallGuard = { stopRequested: () => true, sending: () => new AbortController().signal, settled: () => {} }
    await expect(runTradeOperation({ ...deps(client), guard }, ref, { kind: 'release' })).rejects.toMatchObject({ code: 'stopped' })
    expect(client.calls).toEqual([])
    expect(await order(ref)).toMatchObject({ tradeStatus: 'created', nextPollAt: opened.nextPollAt })
  })

  it('applies nothing, says so and polls soon when an operation answers another trade’s or another order’s record', async () => {
    const { ref, clock, opened } = await openedOrder()
    await clock.advance(1_000)
    const answers = [
      tradeRecord({ trade_id: 'tr_other', status: 'released', external_reference: ref }),
      tradeRecord({ trade_id: opened.tradeId!, status: 'released', external_reference: 'someone-else' }),
    ]
    for (const answer of answers) {
      const client = fakeTradeApi({ releaseTrade: async () => answer })
      await expect(runTradeOperation(deps(client, clock), ref, { kind: 'release' })).rejects.toMatchObject({
        name: 'TradeOperationError',
        code: 'answer_mismatch',
      })
      const after = await order(ref)
      expect(after).toMatchObject({ tradeId: opened.tradeId, tradeStatus: 'created' })
      expect(after.nextPollAt?.getTime()).toBe(clock.now() + EXPECTED_WEBHOOK_S * 1000)
      expect(await history(after.id)).toEqual([{ fromStatus: null, toStatus: 'created', source: 'api' }])
    }
  })

  it('changes nothing when the platform refuses the operation', async () => {
    const { ref, opened } = await openedOrder()
    const refusal = new PartnerApiError(409, 'invalid_state', 'not funded', undefined)
    const client = fakeTradeApi({
      deliverTrade: async () => {
        throw refusal
      },
    })
    await expect(runTradeOperation(deps(client), ref, { kind: 'deliver' })).rejects.toBe(refusal)
    const after = await order(ref)
    expect(after.tradeStatus).toBe('created')
    expect(after.nextPollAt?.getTime()).toBe(opened.nextPollAt?.getTime())
  })

  it('refuses an unknown order and an order without a trade, sending nothing', async () => {
    const client = fakeTradeApi()
    await expect(runTradeOperation(deps(client), 'order-missing', { kind: 'fund' })).rejects.toMatchObject({
      code: 'order_not_found',
    })
    const ref = reference()
    await createOrder(database.db, { externalReference: ref })
    await expect(runTradeOperation(deps(client), ref, { kind: 'fund' })).rejects.toMatchObject({ code: 'no_trade' })
    expect(client.calls).toHaveLength(0)
  })
})

describe('the trades service against a local platform that checks signatures', () => {
  afterEach(() => {})

  it('creates the trade with a signed request and links the order from the answer', async () => {
    const ref = reference()
    const server = await startRecordingServer({
      secret: SECRET,
      answer: (received) => {
        const sent = JSON.parse(received.rawBody.toString('utf8'))
        return { status: 201, body: tradeRecord({ trade_id: 'tr_signed', external_reference: sent.external_reference }) }
      },
    })
    try {
      const client = new PartnerApiClient({
        baseUrl: server.url,
        keyId: 'pk_trades',
        secret: SECRET,
        env: 'sandbox',
        kind: 'marketplace',
        timeoutMs: 10_000,
        clock: new FakeClock(),
        logger,
      })
      await openTradeForOrder(deps(client), ref, request)
      expect(server.requests).toHaveLength(1)
      expect(server.requests[0]!.signatureValid).toBe(true)
      expect(JSON.parse(server.requests[0]!.rawBody.toString('utf8')).external_reference).toBe(ref)
      expect((await order(ref)).tradeId).toBe('tr_signed')
    } finally {
      await server.close()
    }
  })
})
