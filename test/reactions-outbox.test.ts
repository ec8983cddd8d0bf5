// The outbox: every transition writes its event (the history row, with its place in the handlers' streams)
// in the statement that moves the order, whatever brought the transition; stale, duplicate and no-op
// observations write none. Each handler's stream then gives it the events of its types, in order.
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { type App, createApp } from '../src/http/app.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { createOrder } from './helpers/orders.js'
import { hasReached } from '../src/orders/trade-status.js'
import { AMQP_HANDLER, configuredReactions, FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { ensureReactionStreams, readReactionStream } from '../src/reactions/reaction-stream.repository.js'
import { runCommand } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { untilEventsReadable } from './helpers/reaction-jobs.js'
import { testPoller } from './helpers/reconcile-poller.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { reactionChannel } from '../src/db/reaction-channel.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig()
const noop = async () => {}
const reactions = createReactionRegistry()
  .on('trade.funded', 'ship-goods', noop)
  .on('trade.*', 'ledger', noop)
const settings = { staleAfterS: 3_600, handlersFor: reactions.handlersFor }

describe('the reaction outbox', () => {
  let database: TestDatabase
  let app: App
  let counter = 0
  const reference = () => `outbox-${++counter}`

  const eventsOf = (orderId: number) =>
    database.db
      .selectFrom('orderStatusHistory')
      .select(['eventId', 'sequence', 'fromStatus', 'toStatus', 'source', 'tradeId', 'externalReference'])
      .where('orderId', '=', orderId)
      .orderBy('id')
      .execute()
  /** What each handler's stream gives it of this order (read without moving the stream: nothing runs here). */
  const jobsOf = async (orderId: number, routing = reactions, handlers = reactions.names) => {
    // a transaction of another suite on the same server withholds the events from the reads until it ends
    await untilEventsReadable(database.db)
    const taken: { eventId: string; sequence: number; handler: string }[] = []
    for (const handler of handlers) {
      const now = new Date()
      const { events } = await readReactionStream(database.db, {
        handler,
        leaseToken: 'outbox-test',
        now,
        leaseEnd: new Date(now.getTime() + 60_000),
        limit: 10_000,
      })
      for (const { event } of events) {
        if (event.orderId === orderId && routing.handlersFor(event.type).includes(handler)) {
          taken.push({ eventId: event.eventId, sequence: event.sequence, handler })
        }
      }
    }
    return taken.sort((a, b) => a.sequence - b.sequence || a.handler.localeCompare(b.handler))
  }
  const orderOf = async (ref: string) => (await findOrderByExternalReference(database.db, ref))!

  beforeAll(async () => {
    database = await createTestDatabase()
    await ensureReactionStreams(database.db, [...reactions.names, FORWARDER_HANDLER], new Date())
    app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock, reactions })
  })
  afterAll(async () => {
    await database.close()
  })

  it('writes one event per webhook transition, numbered 1, 2, 3 per order, which each matching handler’s stream gives it', async () => {
    const ref = reference()
    const { order } = await createOrder(database.db, { externalReference: ref }, settings)
    for (const status of ['created', 'funded', 'delivered']) {
      expect((await sendWebhook(app, { body: tradePayload(ref, status) })).status).toBe(200)
    }
    const events = await eventsOf(order.id)
    expect(events).toMatchObject([
      { sequence: 1, fromStatus: null, toStatus: 'created', source: 'webhook', tradeId: `trd_${ref}`, externalReference: ref },
      { sequence: 2, fromStatus: 'created', toStatus: 'funded', tradeId: `trd_${ref}`, externalReference: ref },
      { sequence: 3, fromStatus: 'funded', toStatus: 'delivered', tradeId: `trd_${ref}`, externalReference: ref },
    ])
    expect(new Set(events.map((event) => event.eventId)).size).toBe(3)
    for (const event of events) expect(event.eventId).toMatch(/^[0-9a-f-]{36}$/)
    const [created, funded, delivered] = events
    expect(await jobsOf(order.id)).toEqual([
      { eventId: created!.eventId, sequence: 1, handler: 'ledger' },
      { eventId: funded!.eventId, sequence: 2, handler: 'ledger' },
      { eventId: funded!.eventId, sequence: 2, handler: 'ship-goods' },
      { eventId: delivered!.eventId, sequence: 3, handler: 'ledger' },
    ])
  })

  it('writes no event and no job for a duplicate delivery, a repeated status or a stale one', async () => {
    const ref = reference()
    const { order } = await createOrder(database.db, { externalReference: ref }, settings)
    const funded = tradePayload(ref, 'funded')
    expect((await sendWebhook(app, { body: funded, deliveryId: `dlv-${ref}` })).status).toBe(200)
    // the same delivery again, the same status under a new id, a lower rank, a status already left
    expect((await sendWebhook(app, { body: funded, deliveryId: `dlv-${ref}` })).status).toBe(200)
    expect((await sendWebhook(app, { body: funded })).status).toBe(200)
    expect((await sendWebhook(app, { body: tradePayload(ref, 'created') })).status).toBe(200)
    const poll = { target: { orderId: order.id }, tradeId: `trd_${ref}`, source: 'poll' as const, observedAt: new Date() }
    expect((await applyObservation(database.db, { ...poll, status: 'funded' }, settings)).outcome).toBe('duplicate_effect')
    expect(await eventsOf(order.id)).toHaveLength(1)
    expect(await jobsOf(order.id)).toHaveLength(2)
  })

  it('gives a handler nothing of a type it does not take, and the event is written all the same', async () => {
    const ref = reference()
    const { order } = await createOrder(database.db, { externalReference: ref }, settings)
    const onlyFunded = createReactionRegistry().on('trade.funded', 'ship-goods', noop)
    const result = await applyObservation(
      database.db,
      { target: { orderId: order.id }, tradeId: `trd_${ref}`, status: 'created', source: 'api', observedAt: new Date() },
      { staleAfterS: 3_600, handlersFor: onlyFunded.handlersFor },
    )
    expect(result.outcome).toBe('applied')
    expect(await eventsOf(order.id)).toMatchObject([{ sequence: 1, toStatus: 'created', source: 'api' }])
    expect(await jobsOf(order.id, onlyFunded, ['ship-goods'])).toEqual([])
  })

  it('a parked delivery applied when its order is created, and a poll, reach the handlers like a webhook', async () => {
    const ref = reference()
    expect((await sendWebhook(app, { body: tradePayload(ref, 'funded') })).status).toBe(200)
    const { order, appliedDeliveries } = await createOrder(database.db, { externalReference: ref }, settings)
    expect(appliedDeliveries).toBe(1)
    await database.db.updateTable('orders').set({ nextPollAt: new Date(Date.now() - 1_000) }).where('id', '=', order.id).execute()
    const fetcher = {
      getTrade: async () => ({ ...tradePayload(ref, 'delivered'), amount: '1.00', currency: 'EUR' }) as never,
    }
    const poller = testPoller({ db: database.db, fetcher, clock: systemClock, settings: { observation: settings } })
    expect((await poller.runOnce()).changed).toBe(1)
    expect((await jobsOf(order.id)).map((job) => [job.sequence, job.handler])).toEqual([
      [1, 'ledger'],
      [1, 'ship-goods'],
      [2, 'ledger'],
    ])
    expect((await eventsOf(order.id)).map((event) => event.source)).toEqual(['webhook', 'poll'])
  })

  it('a CLI command that moves an order writes the event the forwarder’s stream gives it', async () => {
    const forwarding = testConfig({
      FORWARD_URL: 'http://127.0.0.1:1/hooks',
      FORWARD_SECRET: `whsec_${randomBytes(32).toString('base64')}`,
    })
    const ref = reference()
    expect((await sendWebhook(app, { body: tradePayload(ref, 'funded') })).status).toBe(200)
    const { code, stderr } = await runCommand(['orders', 'create', '--external-reference', ref], database.db, forwarding)
    expect(stderr).toBe('')
    expect(code).toBe(0)
    const forwarder = createReactionRegistry().on('trade.*', FORWARDER_HANDLER, noop)
    expect((await jobsOf((await orderOf(ref)).id, forwarder, [FORWARDER_HANDLER])).map((job) => job.handler)).toEqual([FORWARDER_HANDLER])
  })

  it('commits a transition and its event together or not at all', async () => {
    const ref = reference()
    const { order } = await createOrder(database.db, { externalReference: ref }, settings)
    // test-only: the event's insert, the statement's last write, fails
    await sql`create function refuse_reaction_job() returns trigger language plpgsql as
      $$ begin raise exception 'refused by the test'; end $$`.execute(database.db)
    await sql`create trigger refuse_reaction_job before insert on order_status_history
      for each row execute function refuse_reaction_job()`.execute(database.db)
    try {
      await expect(
        applyObservation(
          database.db,
          { target: { orderId: order.id }, tradeId: `trd_${ref}`, status: 'funded', source: 'api', observedAt: new Date() },
          settings,
        ),
      ).rejects.toThrow(/refused by the test/)
    } finally {
      await sql`drop trigger refuse_reaction_job on order_status_history`.execute(database.db)
      await sql`drop function refuse_reaction_job()`.execute(database.db)
    }
    expect(await orderOf(ref)).toMatchObject({ tradeStatus: null, tradeId: null })
    expect(await eventsOf(order.id)).toEqual([])
    expect(await jobsOf(order.id)).toEqual([])
    // and the same observation, the trigger gone, commits both, and both handlers' streams give the event
    await applyObservation(
      database.db,
      { target: { orderId: order.id }, tradeId: `trd_${ref}`, status: 'funded', source: 'api', observedAt: new Date() },
      settings,
    )
    expect(await orderOf(ref)).toMatchObject({ tradeStatus: 'funded' })
    expect(await eventsOf(order.id)).toHaveLength(1)
    expect(await jobsOf(order.id)).toHaveLength(2)
  })

  it('notifies listeners on commit when a handler takes the event, and not when none does', async () => {
    let notified = 0
    const unlisten = await database.listen(await reactionChannel(database.db), () => notified++)
    try {
      const settle = async () => {
        // a Postgres notification travels on another connection: give it a generous bound
        for (let i = 0; i < 200 && notified === 0; i++) await new Promise((resolve) => setTimeout(resolve, 10))
      }
      await settle()
      notified = 0 // the Postgres listener looks once when it connects
      const ref = reference()
      const { order } = await createOrder(database.db, { externalReference: ref }, settings)
      const observe = (status: string, handlersFor = settings.handlersFor) =>
        applyObservation(
          database.db,
          { target: { orderId: order.id }, tradeId: `trd_${ref}`, status, source: 'api', observedAt: new Date() },
          { staleAfterS: 3_600, handlersFor },
        )
      await observe('created', () => [])
      await new Promise((resolve) => setTimeout(resolve, 200))
      // on Postgres another test file's commit in the same database may notify the channel meanwhile
      if (database.kind === 'pglite') expect(notified).toBe(0)
      notified = 0
      await observe('funded')
      await settle()
      expect(notified).toBeGreaterThanOrEqual(1)
    } finally {
      await unlisten()
    }
  })
})

describe('the registry', () => {
  it('answers the sorted names whose pattern matches, and refuses bad patterns, names and duplicates', () => {
    const registry = createReactionRegistry()
      .on('trade.*', 'ledger', noop)
      .on('trade.funded', 'ship-goods', noop)
      .on('trade.funded', 'analytics', noop)
    expect(registry.handlersFor('trade.funded')).toEqual(['analytics', 'ledger', 'ship-goods'])
    expect(registry.handlersFor('trade.released')).toEqual(['ledger'])
    expect(registry.handlersFor('order.funded')).toEqual([])
    expect(() => registry.on('trade.funded', 'ledger', noop)).toThrow(/already registered/)
    // @ts-expect-error: not a pattern (a JavaScript caller, or a cast, is refused at run time)
    expect(() => registry.on('funded', 'x', noop)).toThrow(/pattern/)
    // @ts-expect-error: not a pattern
    expect(() => registry.on('trade.fund*', 'x', noop)).toThrow(/pattern/)
    expect(() => registry.on('trade.funded', 'Ship Goods', noop)).toThrow(/name/)
    expect(() => registry.on('trade.funded', 'a,b', noop)).toThrow(/name/)
  })

  it('registers the built-in handlers for the types of FORWARD_EVENTS and AMQP_EVENTS', async () => {
    const chosen = testConfig({
      FORWARD_URL: 'http://127.0.0.1:9/hook',
      FORWARD_SECRET: `whsec_${Buffer.alloc(32, 9).toString('base64')}`,
      FORWARD_EVENTS: 'trade.funded,trade.released',
      AMQP_URL: 'amqp://127.0.0.1:9',
      AMQP_EVENTS: 'trade.funded',
    })
    // the publisher connects on its first event: none is sent here; the fork's handlers (partner-handlers.ts) left out
    const builtIn = configuredReactions(chosen, { logger: testLogger(), partnerHandlers: false })
    expect(builtIn.handlersFor('trade.funded')).toEqual([AMQP_HANDLER, FORWARDER_HANDLER])
    expect(builtIn.handlersFor('trade.released')).toEqual([FORWARDER_HANDLER])
    expect(builtIn.handlersFor('trade.delivered')).toEqual([])
    // named when a job of a type a handler no longer takes is skipped; a handler registered in code has none
    expect([AMQP_HANDLER, FORWARDER_HANDLER, 'crm'].map((name) => builtIn.typesSetting(name))).toEqual(['AMQP_EVENTS', 'FORWARD_EVENTS', undefined])
    await builtIn.close()
  })

  it('takes a list of patterns for one handler: an event matching any of them, once', () => {
    const registry = createReactionRegistry()
      .on(['trade.funded', 'trade.released'], 'crm', noop)
      .on(['trade.*', 'trade.funded'], 'ledger', noop)
    expect(registry.handlersFor('trade.funded')).toEqual(['crm', 'ledger'])
    expect(registry.handlersFor('trade.released')).toEqual(['crm', 'ledger'])
    expect(registry.handlersFor('trade.delivered')).toEqual(['ledger'])
    expect(registry.names).toEqual(['crm', 'ledger'])
    expect(() => registry.on([], 'nothing', noop)).toThrow(/no pattern/)
    // @ts-expect-error: 'funded' is not a pattern
    expect(() => registry.on(['trade.funded', 'funded'], 'half', noop)).toThrow(/pattern "funded"/)
    expect(registry.names).toEqual(['crm', 'ledger'])
  })
})

describe('hasReached, for handlers of orders that jumped', () => {
  it('compares ranks: a jump to released has reached funded, created has not, unknown statuses only themselves', () => {
    expect(hasReached({ to: 'released' }, 'funded')).toBe(true)
    expect(hasReached({ to: 'funded' }, 'funded')).toBe(true)
    expect(hasReached({ to: 'created' }, 'funded')).toBe(false)
    expect(hasReached({ to: 'step_4' }, 'funded')).toBe(false)
    expect(hasReached({ to: 'step_4' }, 'step_4')).toBe(true)
  })
})
