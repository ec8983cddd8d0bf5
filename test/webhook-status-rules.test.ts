// The status rules as a sender sees them, through the HTTP contract: an unknown status from a webhook
// never moves an order (it makes the order due for a poll), no status is entered twice, and no sequence
// of signed deliveries, replayed under fresh or reused ids in any order, makes an order oscillate.
import { randomUUID } from 'node:crypto'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type App, createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { createOrder } from './helpers/orders.js'
import { isTerminalStatus, statusRank } from '../src/orders/trade-status.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { countingFetcher } from './helpers/reconcile-orders.js'
import { testPoller } from './helpers/reconcile-poller.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig({ LOG_LEVEL: 'warn' })
const KNOWN = ['created', 'funded', 'delivered', 'disputed', 'cancelled', 'refunded', 'released', 'resolved']
const UNKNOWN = ['milestone_delivered', 'milestone_funded', 'on_hold']

describe('the status rules over HTTP', () => {
  let database: TestDatabase
  let app: App
  let clock: FakeClock

  beforeAll(async () => {
    database = await createTestDatabase()
    clock = new FakeClock()
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock })
  })
  afterAll(async () => {
    await database.close()
  })

  // the body is the same for every send of a status: what a replayer holding a captured delivery has
  const body = (ref: string, status: string) => JSON.stringify(tradePayload(ref, status, `tr_${ref}`))
  const send = async (ref: string, status: string, deliveryId = `dlv-${randomUUID()}`) => {
    const response = await sendWebhook(app, { body: body(ref, status), deliveryId })
    expect(response.status, JSON.stringify(response.body)).toBe(200)
    return response.body as { received: true; duplicate?: true }
  }
  const outcomeOf = async (deliveryId: string) =>
    (await database.db.selectFrom('webhookDeliveries').select('outcome').where('deliveryId', '=', deliveryId).executeTakeFirstOrThrow())
      .outcome
  const statusesEntered = async (ref: string) => {
    const order = await findOrderByExternalReference(database.db, ref)
    return (await orderHistory(database.db, order!.id)).map((change) => change.toStatus)
  }

  it('keeps an order where it is when webhooks name statuses the table does not know, replayed under fresh ids', async () => {
    const ref = 'issue-repro'
    await createOrder(database.db, { externalReference: ref })
    await send(ref, 'funded')
    await send(ref, 'delivered')
    await clock.advance(1_000)
    const unknown: string[] = []
    for (const status of ['milestone_delivered', 'milestone_funded', 'milestone_delivered', 'milestone_funded']) {
      const id = `dlv-${randomUUID()}`
      unknown.push(id)
      await send(ref, status, id)
    }
    // the first of each body is stored; its replays under fresh ids are answered as duplicates and not stored
    expect(await outcomeOf(unknown[0]!)).toBe('unknown_status')
    expect(await outcomeOf(unknown[1]!)).toBe('unknown_status')
    expect(await database.db.selectFrom('webhookDeliveries').select('deliveryId').where('deliveryId', 'in', unknown.slice(2)).execute()).toEqual([])
    const order = await findOrderByExternalReference(database.db, ref)
    expect(order?.tradeStatus).toBe('delivered')
    // due for a poll at once: the platform's own answer decides
    expect(order?.nextPollAt?.getTime()).toBe(clock.now())
    const later = `dlv-${randomUUID()}`
    await send(ref, 'delivered', later)
    expect(await outcomeOf(later)).toBe('duplicate_effect')
    await send(ref, 'released')
    expect(await statusesEntered(ref)).toEqual(['funded', 'delivered', 'released'])
  })

  it('lets the poll set an unknown status, never twice, and a known status of higher rank follow it', async () => {
    const ref = 'polled-unknown'
    await createOrder(database.db, { externalReference: ref })
    await send(ref, 'funded')
    await send(ref, 'milestone_delivered')
    const answers = ['milestone_delivered']
    const fetcher = countingFetcher(() => answers.shift() ?? 'milestone_delivered')
    const poller = testPoller({ db: database.db, fetcher, clock })
    expect((await poller.runOnce()).polled).toBeGreaterThanOrEqual(1)
    expect(fetcher.calls).toContain(`tr_${ref}`)
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('milestone_delivered')
    // a poll's unknown status is the platform's word: not polled again at once (no hot loop)
    expect((await findOrderByExternalReference(database.db, ref))!.nextPollAt!.getTime()).toBeGreaterThan(clock.now())

    await send(ref, 'milestone_funded') // unknown, from a webhook: held back
    await send(ref, 'delivered') // known, above funded: follows the unknown status
    expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('delivered')
    // the platform answering the old unknown status again cannot move the order back to it
    await clock.advance(config.poll.staleAfterS * 1000 + 1)
    const again = testPoller({ db: database.db, fetcher: countingFetcher(() => 'milestone_delivered'), clock })
    await again.runOnce()
    expect(again.reported.find((result) => result.externalReference === ref)?.result).toBe('stale')
    expect(await statusesEntered(ref)).toEqual(['funded', 'milestone_delivered', 'delivered'])
  })

  it('never revisits a status, and ends at the first terminal or else the highest known status, whatever the deliveries (property)', async () => {
    let run = 0
    const ids = new Set<string>()
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.record({
            status: fc.constantFrom(...KNOWN, ...UNKNOWN),
            // a small pool of ids per run: fresh ids, retries (same id, same body) and reused ids (same id,
            // another body) all occur
            id: fc.nat(5),
          }),
          { minLength: 1, maxLength: 12 },
        ),
        fc.boolean(),
        async (deliveries, concurrent) => {
          const ref = `prop-${++run}`
          await createOrder(database.db, { externalReference: ref })
          const idOf = (n: number) => `prop-${run}-${n}`
          if (concurrent) await Promise.all(deliveries.map(({ status, id }) => send(ref, status, idOf(id))))
          else for (const { status, id } of deliveries) await send(ref, status, idOf(id))
          for (const { id } of deliveries) ids.add(idOf(id))

          const entered = await statusesEntered(ref)
          expect(new Set(entered).size, `history ${entered.join(' → ')}`).toBe(entered.length)
          const final = (await findOrderByExternalReference(database.db, ref))?.tradeStatus ?? null
          const observed = deliveries.map((each) => each.status)
          const terminals = observed.filter(isTerminalStatus)
          const known = observed.filter((status) => statusRank(status) !== undefined)
          const highest = known.length === 0 ? null : known.reduce((a, b) => (statusRank(b)! > statusRank(a)! ? b : a))
          // in arrival order the first terminal status wins; sent at once, any of them may have come first
          if (terminals.length > 0) {
            if (concurrent) expect(terminals).toContain(final)
            else expect(final).toBe(terminals[0])
          } else expect(final).toBe(highest)
          // the history only climbs, and only through statuses the table knows (webhooks alone)
          const ranks = entered.map((status) => statusRank(status))
          expect(ranks.every((rank) => rank !== undefined)).toBe(true)
          expect([...(ranks as number[])].sort((a, b) => a - b)).toEqual(ranks)
          // every body is stored, no (id, body) twice, and a body under a second id only beside a copy that moved the
          // order, or, for one that asks for a poll, once more each time the order moved (a copy that changed nothing
          // makes the next a replay, not stored: migrations/0017; "moved" by the order's version: migrations/0019)
          const rows = await database.db
            .selectFrom('webhookDeliveries')
            .select(['deliveryId', 'bodySha256', 'observedStatus', 'outcome', 'orderVersion'])
            .where('externalReference', '=', ref)
            .execute()
          expect(new Set(rows.map((row) => row.observedStatus))).toEqual(new Set(observed))
          expect(new Set(rows.map((row) => `${row.deliveryId} ${row.bodySha256}`)).size).toBe(rows.length)
          if (!concurrent) {
            for (const status of new Set(observed)) {
              const copies = rows.filter((row) => row.observedStatus === status)
              expect(copies.filter((row) => row.outcome === 'applied').length, status).toBeLessThanOrEqual(1)
              const unchanged = copies.filter((row) => row.outcome !== 'applied')
              expect(unchanged.every((row) => row.orderVersion !== null), status).toBe(true)
              expect(new Set(unchanged.map((row) => row.orderVersion)).size, status).toBe(unchanged.length)
            }
          }
        },
      ),
      { numRuns: database.url ? 60 : 40 },
    )
    const outcomes = await database.db
      .selectFrom('webhookDeliveries')
      .select(['outcome', (eb) => eb.fn.countAll<string>().as('deliveries')])
      .where('externalReference', 'like', 'prop-%')
      .groupBy('outcome')
      .orderBy('outcome')
      .execute()
    process.stdout.write(
      `status property: ${run} runs, ${ids.size} delivery ids, stored outcomes ${outcomes.map((row) => `${row.outcome}=${row.deliveries}`).join(' ')}\n`,
    )
  })
})
