// Group commit of webhook deliveries (src/webhooks/group-commit.ts) and the per-process memory of
// stored delivery ids (src/webhooks/seen-deliveries.ts), on PGlite and on Postgres.
import { createHash, randomUUID } from 'node:crypto'
import { sql } from 'kysely'
import request from 'supertest'
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { openDatabase } from '../src/db/open-database.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { createApp } from '../src/http/app.js'
import { createMetrics } from '../src/metrics/metrics.js'
import type { DeliveryObservation } from '../src/orders/apply-observation.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { createOrder } from './helpers/orders.js'
import { IngestOverloadedError, isDatabaseUnavailable } from '../src/db/database-errors.js'
import { GroupCommit, type WriteResult } from '../src/webhooks/group-commit.js'
import { SeenDeliveries } from '../src/webhooks/seen-deliveries.js'
import { testLogger } from './helpers/log-sink.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { testConfig } from './helpers/test-config.js'
import { describePostgres, useTestDatabase } from './helpers/test-database.js'
import { holdOrderRow } from './helpers/order-row-lock.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'
import { NO_REACTION_HANDLERS } from '../src/orders/apply-observation.js'
import { webhookObservation } from '../src/orders/observations.js'
import { ingestDeliveries } from '../src/webhooks/parked-deliveries.js'

const config = testConfig({ LOG_LEVEL: 'warn' })
const settings = { staleAfterS: config.poll.staleAfterS, handlersFor: NO_REACTION_HANDLERS }

function delivery(externalReference: string, status: string, deliveryId = `gc-${randomUUID()}`): DeliveryObservation {
  const body = tradePayload(externalReference, status)
  const rawBody = JSON.stringify(body)
  return {
    delivery: { deliveryId, eventType: `trade.${status}`, rawBody, bodySha256: createHash('sha256').update(rawBody).digest('hex') },
    observation: webhookObservation(
      { externalReference, tradeId: body.trade_id, tradeReference: body.reference, status },
      deliveryId,
      new Date(),
    ),
  }
}

describe('group commit', () => {
  const database = useTestDatabase()

  const writer = (options: { maxBatch?: number; maxQueued?: number } = {}) => {
    const batches: number[] = []
    const group = new GroupCommit(
      ingestDeliveries({ db: database.db, settings, logger: testLogger() }),
      { maxBatch: options.maxBatch ?? 100, maxInFlight: 1, maxQueued: options.maxQueued ?? 1_000, onBatch: (size) => batches.push(size) },
    )
    return { group, batches }
  }

  it('writes deliveries that arrive together in one statement, each settled with its own outcome', async () => {
    for (const ref of ['gc-a', 'gc-b', 'gc-c']) await createOrder(database.db, { externalReference: ref })
    const { group, batches } = writer()
    const results = await Promise.all([
      group.write(delivery('gc-a', 'funded')),
      group.write(delivery('gc-b', 'created')),
      group.write(delivery('gc-nobody', 'funded')),
    ])
    expect(batches).toEqual([3])
    expect(results.map((result) => (typeof result === 'object' ? result.outcome : result))).toEqual(['applied', 'applied', 'unmatched'])
    expect((await findOrderByExternalReference(database.db, 'gc-a'))?.tradeStatus).toBe('funded')
    expect((await findOrderByExternalReference(database.db, 'gc-b'))?.tradeStatus).toBe('created')
    expect((await findOrderByExternalReference(database.db, 'gc-c'))?.tradeStatus).toBeNull()
  })

  it('puts two deliveries for one order in separate statements, in arrival order', async () => {
    const { order } = await createOrder(database.db, { externalReference: 'gc-order' })
    await createOrder(database.db, { externalReference: 'gc-other' })
    const { group, batches } = writer()
    const results = await Promise.all([
      group.write(delivery('gc-order', 'created')),
      group.write(delivery('gc-order', 'funded')),
      group.write(delivery('gc-other', 'funded')),
    ])
    expect(batches).toEqual([2, 1])
    expect(results.map((result) => (typeof result === 'object' ? result.outcome : result))).toEqual(['applied', 'applied', 'applied'])
    const history = await orderHistory(database.db, order.id)
    expect(history.map((row) => `${row.fromStatus}->${row.toStatus}`)).toEqual(['null->created', 'created->funded'])
  })

  it('stores a delivery id sent twice at once one time; the second is a duplicate', async () => {
    const { order } = await createOrder(database.db, { externalReference: 'gc-twice' })
    const { group, batches } = writer()
    const item = delivery('gc-twice', 'funded', `gc-twice-${randomUUID()}`)
    const results = await Promise.all([group.write(item), group.write(item)])
    expect(batches).toEqual([1, 1])
    expect(results[0]).toMatchObject({ outcome: 'applied' })
    expect(results[1]).toBe('duplicate')
    expect(await orderHistory(database.db, order.id)).toHaveLength(1)
  })

  it('takes at most maxBatch deliveries per statement', async () => {
    const refs = Array.from({ length: 7 }, (_, i) => `gc-max-${i}`)
    for (const ref of refs) await createOrder(database.db, { externalReference: ref })
    const { group, batches } = writer({ maxBatch: 3 })
    await Promise.all(refs.map((ref) => group.write(delivery(ref, 'funded'))))
    expect(batches).toEqual([3, 3, 1])
  })

  it('closes a statement once its bodies pass 4 MB, so large deliveries arriving together split', async () => {
    const { group, batches } = writer()
    const large = (i: number) => {
      const item = delivery(`gc-large-${i}`, 'funded')
      const body = { ...tradePayload(`gc-large-${i}`, 'funded'), padding: 'x'.repeat(1_500_000) }
      return { ...item, delivery: { ...item.delivery, rawBody: JSON.stringify(body) } }
    }
    const results = await Promise.all([0, 1, 2, 3, 4].map((i) => group.write(large(i))))
    expect(batches).toEqual([3, 2])
    expect(results.every((result) => typeof result === 'object' && result.outcome === 'unmatched')).toBe(true)
  })

  it('refuses a delivery at once when maxQueued deliveries are waiting, and writes the others', async () => {
    const { group } = writer({ maxQueued: 2 })
    const first = group.write(delivery('gc-full-1', 'funded'))
    const second = group.write(delivery('gc-full-2', 'funded'))
    await expect(group.write(delivery('gc-full-3', 'funded'))).rejects.toBeInstanceOf(IngestOverloadedError)
    expect(await first).toMatchObject({ outcome: 'unmatched' })
    expect(await second).toMatchObject({ outcome: 'unmatched' })
  })

  it('fails only the delivery the statement cannot take; its neighbours in the batch are stored', async () => {
    // a trigger stands for a delivery the database refuses (a constraint a fork adds, say)
    await sql.raw(`create function refuse_poison() returns trigger language plpgsql as $$
        begin
          if new.delivery_id like 'poison-%' then raise exception 'refused by the test'; end if;
          return new;
        end $$`).execute(database.db)
    await sql.raw('create trigger refuse_poison before insert on webhook_deliveries for each row execute function refuse_poison()').execute(database.db)
    try {
      const refs = Array.from({ length: 5 }, (_, i) => `gc-poison-${i}`)
      for (const ref of refs) await createOrder(database.db, { externalReference: ref })
      const { group, batches } = writer()
      const settled = await Promise.allSettled(
        refs.map((ref, i) => group.write(delivery(ref, 'funded', i === 2 ? `poison-${randomUUID()}` : `ok-${randomUUID()}`))),
      )
      expect(batches).toEqual([5, 1, 1, 1, 1, 1])
      expect(settled.map((result) => result.status)).toEqual(['fulfilled', 'fulfilled', 'rejected', 'fulfilled', 'fulfilled'])
      for (const [i, ref] of refs.entries()) {
        expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe(i === 2 ? null : 'funded')
      }
    } finally {
      await sql.raw('drop trigger refuse_poison on webhook_deliveries').execute(database.db)
    }
  })
})

/** A stand-in for the statement: each call waits until the test settles it; `calls` holds them in order. */
function scriptedWriter() {
  const calls: { items: DeliveryObservation[]; resolve: (results: WriteResult[]) => void; reject: (error: unknown) => void }[] = []
  const write = (items: readonly DeliveryObservation[]) =>
    new Promise<WriteResult[]>((resolve, reject) => calls.push({ items: [...items], resolve, reject }))
  /** The `index`th call, once the group commit has made it (it writes on the next turn of the event loop). */
  const call = async (index: number) => {
    for (let turn = 0; turn < 100 && calls.length <= index; turn++) await new Promise((resolve) => setImmediate(resolve))
    const made = calls[index]
    if (!made) throw new Error(`the writer was called ${calls.length} times, not ${index + 1}`)
    return made
  }
  const deliveryIds = (index: number) => calls[index]!.items.map((item) => item.delivery.deliveryId)
  return { calls, write, call, deliveryIds }
}

/** Settles without throwing: what a pending delivery came to, once it came to something. */
const settled = (promise: Promise<WriteResult>) => promise.then((value) => ({ value }), (error: unknown) => ({ error }))

describe('group commit when the database is not there', () => {
  // pg's words when no connection came within connectionTimeoutMillis: a silent database's, every 5 s
  const unavailable = () => new Error('timeout exceeded when trying to connect')

  it('rejects at once, with the same error, the deliveries held back behind a statement the database was not there for', async () => {
    expect(isDatabaseUnavailable(unavailable())).toBe(true)
    const writer = scriptedWriter()
    const group = new GroupCommit(writer.write, { maxBatch: 100, maxInFlight: 1, maxQueued: 1_000 })
    const first = delivery('gc-away-a', 'created', 'gc-away-a-1')
    const written = settled(group.write(first))
    const firstCall = await writer.call(0)
    // while its statement waits: later deliveries of its order, one under its delivery id (another order's), the
    // later delivery of that order, and deliveries for orders of their own
    const heldBack = [
      delivery('gc-away-a', 'funded', 'gc-away-a-2'),
      delivery('gc-away-c', 'created', 'gc-away-a-1'),
      delivery('gc-away-a', 'released', 'gc-away-a-3'),
      delivery('gc-away-c', 'funded', 'gc-away-c-2'),
    ]
    const others = [delivery('gc-away-b', 'funded', 'gc-away-b-1'), delivery('gc-away-d', 'funded', 'gc-away-d-1')]
    const answers = [heldBack[0]!, others[0]!, heldBack[1]!, heldBack[2]!, heldBack[3]!, others[1]!].map((item) => settled(group.write(item)))
    const error = unavailable()
    firstCall.reject(error)

    expect(await written).toEqual({ error })
    // the next statement holds only the other orders' deliveries: the held-back ones never reach the writer
    const secondCall = await writer.call(1)
    expect(writer.deliveryIds(1)).toEqual(['gc-away-b-1', 'gc-away-d-1'])
    // and were rejected with the first one's error, that statement not answered yet
    const [a2, c1, a3, c2] = await Promise.all([answers[0]!, answers[2]!, answers[3]!, answers[4]!])
    for (const answer of [a2, c1, a3, c2]) expect((answer as { error?: unknown }).error).toBe(error)
    secondCall.resolve(['duplicate', 'duplicate'])
    expect(await Promise.all([answers[1]!, answers[5]!])).toEqual([{ value: 'duplicate' }, { value: 'duplicate' }])
    // an order's delivery that comes after the failure has its own turn
    const later = settled(group.write(delivery('gc-away-a', 'funded', 'gc-away-a-4')))
    ;(await writer.call(2)).resolve(['duplicate'])
    expect(await later).toEqual({ value: 'duplicate' })
    expect(writer.calls.map((_, index) => writer.deliveryIds(index))).toEqual([['gc-away-a-1'], ['gc-away-b-1', 'gc-away-d-1'], ['gc-away-a-4']])
  })

  it('rejects what waits behind a lone rewrite the database was not there for; a failure of another kind holds nothing back', async () => {
    const writer = scriptedWriter()
    const group = new GroupCommit(writer.write, { maxBatch: 100, maxInFlight: 1, maxQueued: 1_000 })
    const answers = [
      delivery('gc-lone-a', 'created', 'gc-lone-a-1'),
      delivery('gc-lone-b', 'created', 'gc-lone-b-1'),
    ].map((item) => settled(group.write(item)))
    const batch = await writer.call(0)
    const behindA = settled(group.write(delivery('gc-lone-a', 'funded', 'gc-lone-a-2')))
    const behindB = settled(group.write(delivery('gc-lone-b', 'funded', 'gc-lone-b-2')))
    // not the database being away: the batch is written again one by one
    batch.reject(new Error('refused by the test'))
    const error = unavailable()
    ;(await writer.call(1)).reject(error)
    ;(await writer.call(2)).resolve(['duplicate'])
    expect(await Promise.all(answers)).toEqual([{ error }, { value: 'duplicate' }])
    // b's later delivery, behind a rewrite that was stored, is written next; a's went with a's rewrite
    const lastCall = await writer.call(3)
    expect(writer.deliveryIds(3)).toEqual(['gc-lone-b-2'])
    expect(await behindA).toEqual({ error })
    lastCall.resolve(['duplicate'])
    expect(await behindB).toEqual({ value: 'duplicate' })
    expect(writer.calls.map((_, index) => writer.deliveryIds(index))).toEqual([['gc-lone-a-1', 'gc-lone-b-1'], ['gc-lone-a-1'], ['gc-lone-b-1'], ['gc-lone-b-2']])
  })
})

// a third statement, not yet committed when a lone write read, links the trade to its order: the write fails on the
// key again, and its delivery was stored invalid (5 of 1,560 deliveries sent six to a trade at once, from outside)
describe('a lone write that meets another statement on a key', () => {
  const keyTaken = () => Object.assign(new Error('duplicate key value violates unique constraint "orders_trade_id_key"'), { code: '23505' })

  it('is written again on a fresh snapshot, up to 5 times alone, and its delivery then stored', async () => {
    const writer = scriptedWriter()
    const group = new GroupCommit(writer.write, { maxBatch: 100, maxInFlight: 1, maxQueued: 1_000 })
    const answer = settled(group.write(delivery('gc-race-a', 'funded', 'gc-race-a-1')))
    ;(await writer.call(0)).reject(keyTaken())
    for (let call = 1; call <= 3; call++) (await writer.call(call)).reject(keyTaken())
    ;(await writer.call(4)).resolve(['duplicate'])
    expect(await answer).toEqual({ value: 'duplicate' })
    expect(writer.calls).toHaveLength(5)
  })

  it('gives up after 5 lone writes, with the last error, and does not write again for another failure', async () => {
    const writer = scriptedWriter()
    const group = new GroupCommit(writer.write, { maxBatch: 100, maxInFlight: 1, maxQueued: 1_000 })
    const raced = settled(group.write(delivery('gc-race-b', 'funded', 'gc-race-b-1')))
    ;(await writer.call(0)).reject(keyTaken())
    const last = keyTaken()
    // the batch's write, then 5 lone ones
    for (let call = 1; call <= 5; call++) (await writer.call(call)).reject(call === 5 ? last : keyTaken())
    expect(await raced).toEqual({ error: last })
    expect(writer.calls).toHaveLength(6)

    const refused = settled(group.write(delivery('gc-race-c', 'funded', 'gc-race-c-1')))
    ;(await writer.call(6)).reject(new Error('refused by the test'))
    const error = new Error('refused again')
    ;(await writer.call(7)).reject(error)
    expect(await refused).toEqual({ error })
    expect(writer.calls).toHaveLength(8)
  })
})

describe('the memory of stored delivery ids', () => {
  it('forgets the least recently seen id first', () => {
    const seen = new SeenDeliveries(2)
    seen.add('a', 'aa')
    seen.add('b', 'bb')
    seen.add('a', 'aa')
    seen.add('c', 'cc')
    expect([seen.has('a', 'aa'), seen.has('b', 'bb'), seen.has('c', 'cc'), seen.size]).toEqual([true, false, true, 2])
  })

  it('knows a delivery by its id and its body: the same id with another body is not seen', () => {
    const seen = new SeenDeliveries(10)
    seen.add('a', 'aa')
    expect([seen.has('a', 'aa'), seen.has('a', 'ab')]).toEqual([true, false])
  })

  it('remembers nothing at capacity 0', () => {
    const seen = new SeenDeliveries(0)
    seen.add('a', 'aa')
    expect(seen.has('a', 'aa')).toBe(false)
  })
})

describePostgres('group commit through the receiver (Postgres)', () => {
  const database = useTestDatabase({ poolSize: 4 })

  it('answers each of 60 concurrent deliveries only after its statement committed, in fewer statements than deliveries', async () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock, metrics })
    const refs = Array.from({ length: 60 }, (_, i) => `gc-http-${i}`)
    for (const ref of refs) await createOrder(database.db, { externalReference: ref })
    const seenOnAnswer = await Promise.all(
      refs.map(async (ref) => {
        const response = await sendWebhook(app, { body: tradePayload(ref, 'funded') })
        expect(response.status).toBe(200)
        // the answer came: the order must already show the change
        return (await findOrderByExternalReference(database.db, ref))?.tradeStatus
      }),
    )
    expect(seenOnAnswer).toEqual(Array(60).fill('funded'))
    const admin = createAdminApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), metrics })
    const scrape = (await request(admin).get('/metrics')).text
    const count = Number(/^webhook_ingest_batch_size_count (\d+)/m.exec(scrape)?.[1])
    const sum = Number(/^webhook_ingest_batch_size_sum (\d+)/m.exec(scrape)?.[1])
    expect(sum).toBe(60)
    expect(count).toBeLessThan(60)
  })

  it('writes a lone delivery again when another statement linked its trade to another order meanwhile: trade_mismatch, not invalid', async () => {
    const app = createApp({ config, db: database.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
    const [first, second] = ['gc-link-first', 'gc-link-second']
    for (const ref of [first, second]) await createOrder(database.db, { externalReference: ref })
    // one trade named under two external references (its reference was changed on the platform, say)
    const tradeId = `trd_${randomUUID()}`
    const holder = await holdOrderRow(database, first)
    try {
      // the first delivery's statement waits for its order, its snapshot taken: the trade is nobody's
      const firstAnswer = sendWebhook(app, { body: tradePayload(first, 'funded', tradeId), deliveryId: `gc-link-1-${tradeId}` }).then((answer) => answer)
      await holder.untilBlocked()
      // a statement beside it links the trade to the second order and commits
      const secondAnswer = await sendWebhook(app, { body: tradePayload(second, 'funded', tradeId), deliveryId: `gc-link-2-${tradeId}` })
      expect([secondAnswer.status, secondAnswer.body]).toEqual([200, { received: true }])
      await holder.release()
      // the first one's link breaks orders_trade_id_key (23505): written again, it sees the trade is the other order's
      expect([(await firstAnswer).status, (await firstAnswer).body]).toEqual([200, { received: true }])
    } finally {
      await holder.end()
    }
    const stored = await database.db.selectFrom('webhookDeliveries').select(['deliveryId', 'outcome', 'tradeId']).where('deliveryId', 'like', `gc-link-%-${tradeId}`).orderBy('deliveryId').execute()
    expect(stored).toEqual([
      { deliveryId: `gc-link-1-${tradeId}`, outcome: 'trade_mismatch', tradeId },
      { deliveryId: `gc-link-2-${tradeId}`, outcome: 'applied', tradeId },
    ])
    expect((await findOrderByExternalReference(database.db, first))?.tradeStatus).toBeNull()
    expect((await findOrderByExternalReference(database.db, second))?.tradeStatus).toBe('funded')
  })

  it('does not hand out again a connection whose answer never came: the next delivery is stored on a new one', async () => {
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    // the client stops waiting 1 s after the statement timeout: 2 s here
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 2, statementTimeoutMs: 1_000, logger: testLogger() })
    try {
      const refs = ['gc-silent-0', 'gc-silent-1', 'gc-silent-2', 'gc-silent-3']
      for (const ref of refs) await createOrder(database.db, { externalReference: ref })
      const app = createApp({ config, db: handle.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
      expect((await sendWebhook(app, { body: tradePayload(refs[0]!, 'funded') })).status).toBe(200)
      // the pool's one connection goes silent (a peer or a path that died without a word); new ones pass
      proxy.stall()
      const unanswered = await sendWebhook(app, { body: tradePayload(refs[1]!, 'funded') })
      expect([unanswered.status, unanswered.body.error?.code]).toEqual([503, 'database_unavailable'])
      // it used to go back to the pool and be handed out again: each of these waited for it and was answered 503
      for (const ref of refs.slice(2)) {
        const response = await sendWebhook(app, { body: tradePayload(ref, 'funded') })
        expect([ref, response.status]).toEqual([ref, 200])
        expect((await findOrderByExternalReference(database.db, ref))?.tradeStatus).toBe('funded')
      }
    } finally {
      await handle.close()
      await proxy.close()
    }
  })

  it('answers a retry of a stored delivery while the database is away, and 503 for a delivery it has not seen', async () => {
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 2, logger: testLogger() })
    const forgetful = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 2, logger: testLogger() })
    try {
      await createOrder(database.db, { externalReference: 'gc-away' })
      const logger = testLogger(config.webhook.secrets)
      const app = createApp({ config, db: handle.db, logger, clock: systemClock })
      const noMemory = testConfig({ LOG_LEVEL: 'warn', WEBHOOK_SEEN_CACHE: '0' })
      const appWithout = createApp({ config: noMemory, db: forgetful.db, logger, clock: systemClock })
      const body = tradePayload('gc-away', 'funded')
      const deliveryId = `gc-away-${randomUUID()}`
      expect((await sendWebhook(app, { body, deliveryId })).status).toBe(200)
      expect((await sendWebhook(appWithout, { body, deliveryId })).body).toEqual({ received: true, duplicate: true })

      proxy.cut()
      const retry = await sendWebhook(app, { body, deliveryId })
      expect([retry.status, retry.body]).toEqual([200, { received: true, duplicate: true }])
      const unseen = await sendWebhook(app, { body, deliveryId: `gc-away-${randomUUID()}` })
      expect([unseen.status, unseen.body.error?.code]).toEqual([503, 'database_unavailable'])
      // without the memory the retry needs the database, so it cannot be answered 200
      const retryWithout = await sendWebhook(appWithout, { body, deliveryId })
      expect(retryWithout.status).toBe(503)
    } finally {
      proxy.restore()
      await handle.close()
      await forgetful.close()
      await proxy.close()
    }
  })
})
