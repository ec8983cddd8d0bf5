import { createHash } from 'node:crypto'
import { sql } from 'kysely'
import { describe, expect, it } from 'vitest'
import { migrateTo, migrateToLatest } from '../src/db/migrate.js'
import { claimDueOrders, countDueOrders } from '../src/orders/poll-schedule.repository.js'
import { createOrder } from './helpers/orders.js'
import { createTestDatabase } from './helpers/test-database.js'

/** A test database with the migrations up to and including `name` applied, and no later one. */
async function databaseMigratedTo(name: string) {
  const database = await createTestDatabase({ migrate: false })
  await migrateTo(database.db, name)
  return database
}

describe('migration 0002 on a database with data', () => {
  it('fills visited statuses from the history and body hashes from the stored bodies, and keys deliveries on both', async () => {
    const database = await databaseMigratedTo('0001_initial')
    try {
      await sql`insert into orders (external_reference, trade_id, trade_status, status_rank)
        values ('old-1', 'tr-1', 'delivered', 30), ('old-2', null, null, 0)`.execute(database.db)
      await sql`insert into order_status_history (order_id, from_status, to_status, source)
        select id, s.from_status, s.to_status, 'webhook' from orders,
          (values (null, 'funded'), ('funded', 'on_hold'), ('on_hold', 'delivered')) s(from_status, to_status)
        where external_reference = 'old-1'`.execute(database.db)
      const body = '{"status":"é"}'
      await sql`insert into webhook_deliveries (delivery_id, event_type, outcome, raw_body) values ('d-1', 'trade.funded', 'applied', ${body})`.execute(
        database.db,
      )

      expect((await migrateToLatest(database.db)).applied).toContain('0002_visited_statuses_and_body_hash')

      const orders = await database.db.selectFrom('orders').select(['externalReference', 'visitedStatuses']).orderBy('id').execute()
      expect(orders.map((order) => [order.externalReference, [...order.visitedStatuses].sort()])).toEqual([
        ['old-1', ['delivered', 'funded', 'on_hold']],
        ['old-2', []],
      ])
      const delivery = await database.db.selectFrom('webhookDeliveries').select('bodySha256').executeTakeFirstOrThrow()
      expect(delivery.bodySha256).toBe(createHash('sha256').update(body).digest('hex'))
      // the same id with another body now fits beside it; the same pair does not
      await sql`insert into webhook_deliveries (delivery_id, body_sha256, event_type, outcome, raw_body)
        values ('d-1', 'other', 'trade.funded', 'applied', '{}')`.execute(database.db)
      await expect(
        sql`insert into webhook_deliveries (delivery_id, body_sha256, event_type, outcome, raw_body)
          values ('d-1', 'other', 'trade.funded', 'applied', '{}')`.execute(database.db),
      ).rejects.toMatchObject({ code: '23505' })
    } finally {
      await database.close()
    }
  })
})

describe('migration 0004 on a database with data', () => {
  it('gives every old history row an event id, its sequence within its order and the order identifiers', async () => {
    const database = await databaseMigratedTo('0003_console_indexes')
    try {
      await sql`insert into orders (external_reference, trade_id, trade_status, status_rank, version)
        values ('old-1', 'tr-1', 'delivered', 30, 3), ('old-2', 'tr-2', 'funded', 20, 1)`.execute(database.db)
      // interleaved: the sequence counts within each order, in the order rows were written
      await sql`insert into order_status_history (order_id, from_status, to_status, source)
        select o.id, s.from_status, s.to_status, 'webhook'
        from (values ('old-1', null, 'funded', 1), ('old-2', null, 'funded', 2), ('old-1', 'funded', 'on_hold', 3),
                     ('old-1', 'on_hold', 'delivered', 4)) s(ref, from_status, to_status, position)
        join orders o on o.external_reference = s.ref
        order by s.position`.execute(database.db)

      expect((await migrateToLatest(database.db)).applied).toContain('0004_reaction_outbox')

      const history = await database.db
        .selectFrom('orderStatusHistory')
        .select(['eventId', 'sequence', 'toStatus', 'tradeId', 'externalReference'])
        .orderBy('id')
        .execute()
      expect(history.map((row) => [row.externalReference, row.tradeId, row.sequence, row.toStatus])).toEqual([
        ['old-1', 'tr-1', 1, 'funded'],
        ['old-2', 'tr-2', 1, 'funded'],
        ['old-1', 'tr-1', 2, 'on_hold'],
        ['old-1', 'tr-1', 3, 'delivered'],
      ])
      expect(new Set(history.map((row) => row.eventId)).size).toBe(4)
      expect(await database.db.selectFrom('reactionJobs').selectAll().execute()).toEqual([])
    } finally {
      await database.close()
    }
  })
})

describe('migration 0006 on a database with data', () => {
  it('gives parked deliveries the trade reference their body carries, and a later order applies it from the column', async () => {
    const database = await databaseMigratedTo('0005_console_reaction_indexes')
    try {
      const parked = JSON.stringify({ event: 'trade.funded', reference: 'TRD-OLD', external_reference: 'late-1' })
      await sql`insert into webhook_deliveries
          (delivery_id, body_sha256, event_type, trade_id, external_reference, observed_status, outcome, raw_body)
        values ('p-1', 'h1', 'trade.funded', 'tr-old', 'late-1', 'funded', 'unmatched', ${parked}),
               ('p-2', 'h2', 'trade.funded', 'tr-bad', 'late-2', 'funded', 'unmatched', 'not json'),
               ('a-1', 'h3', 'trade.funded', 'tr-a', 'other', 'funded', 'applied', ${parked})`.execute(database.db)

      expect((await migrateToLatest(database.db)).applied).toContain('0006_delivery_trade_reference')

      const stored = await database.db
        .selectFrom('webhookDeliveries')
        .select(['deliveryId', 'tradeReference'])
        .orderBy('deliveryId')
        .execute()
      expect(stored).toEqual([
        { deliveryId: 'a-1', tradeReference: null },
        { deliveryId: 'p-1', tradeReference: 'TRD-OLD' },
        { deliveryId: 'p-2', tradeReference: null },
      ])
      // the body is no longer read: the order takes the reference from the column
      await sql`update webhook_deliveries set raw_body = '' where delivery_id = 'p-1'`.execute(database.db)
      const { order, appliedDeliveries } = await createOrder(database.db, { externalReference: 'late-1' })
      expect(appliedDeliveries).toBe(1)
      expect(order).toMatchObject({ tradeId: 'tr-old', tradeReference: 'TRD-OLD', tradeStatus: 'funded' })
    } finally {
      await database.close()
    }
  })
})

describe('migration 0008 on a database with data', () => {
  it('gives new transitions event ids in time order (UUID version 7) and keeps the stored ones', async () => {
    const database = await databaseMigratedTo('0007_retention')
    try {
      const { order } = await createOrder(database.db, { externalReference: 'uuid-1' })
      await sql`insert into order_status_history (order_id, to_status, source, sequence) values (${order.id}, 'funded', 'webhook', 1)`.execute(database.db)
      const [old] = (await sql<{ eventId: string }>`select event_id from order_status_history`.execute(database.db)).rows
      expect(old!.eventId).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)

      expect((await migrateToLatest(database.db)).applied).toContain('0008_time_ordered_event_ids')

      const before = Date.now()
      for (const [sequence, status] of [[2, 'delivered'], [3, 'released']] as const) {
        await sql`insert into order_status_history (order_id, to_status, source, sequence) values (${order.id}, ${status}, 'webhook', ${sequence})`.execute(database.db)
        await new Promise((resolve) => setTimeout(resolve, 5))
      }
      const after = Date.now()
      const ids = (await sql<{ eventId: string }>`select event_id from order_status_history order by id`.execute(database.db)).rows.map((row) => row.eventId)
      expect(ids[0]).toBe(old!.eventId)
      const added = ids.slice(1)
      for (const id of added) {
        // version 7, the RFC 9562 variant, and the first 48 bits the insert's time in milliseconds
        expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
        const millis = Number.parseInt(id.replaceAll('-', '').slice(0, 12), 16)
        expect(millis).toBeGreaterThanOrEqual(before - 1000)
        expect(millis).toBeLessThanOrEqual(after + 1000)
      }
      // in the order they were written, as a btree on event_id sees them
      expect([...added].sort()).toEqual(added)
    } finally {
      await database.close()
    }
  })
})

describe('migration 0018 on a database with data', () => {
  it('keeps the orders linked before it unrecorded (taken as the service’s environment) and refuses an environment it does not know', async () => {
    const database = await databaseMigratedTo('0017_replayed_bodies')
    try {
      await sql`insert into orders (external_reference, trade_id, trade_status, status_rank, next_poll_at)
        values ('linked-before', 'tr-before', 'funded', 20, now() - interval '1 minute'), ('not-linked', null, null, 0, null)`.execute(database.db)

      expect((await migrateToLatest(database.db)).applied).toContain('0018_order_partner_env')

      const orders = await database.db.selectFrom('orders').select(['externalReference', 'partnerEnv']).orderBy('id').execute()
      expect(orders).toEqual([
        { externalReference: 'linked-before', partnerEnv: null },
        { externalReference: 'not-linked', partnerEnv: null },
      ])
      // an unrecorded order is the service's own, whichever that is
      for (const partnerEnv of ['sandbox', 'live'] as const) {
        const claimed = await claimDueOrders(database.db, { now: new Date(), limit: 10, leaseS: 0, leaseToken: `t-${partnerEnv}`, partnerEnv })
        expect(claimed.map((order) => order.externalReference)).toEqual(['linked-before'])
      }
      await expect(sql`update orders set partner_env = 'staging'`.execute(database.db)).rejects.toThrow(/check constraint/)
    } finally {
      await database.close()
    }
  })
})

describe('migration 0021 on a database with data', () => {
  it('counts the orders an older build held or backed off when it ran, from the latest time each can have come due', async () => {
    const database = await databaseMigratedTo('0019_delivery_order_version')
    try {
      const { rows } = await sql<{ at: Date }>`select statement_timestamp() as at`.execute(database.db)
      const at = rows[0]!.at
      const after = (s: number) => new Date(at.getTime() + s * 1000)
      // as a poller of a build before migration 0020 left them: next_poll_at its lease's end or its backoff's, and
      // nothing of when each came due
      const orders: [reference: string, nextPollAt: Date, attempts: number, lease: Date | null][] = [
        ['held', after(250), 1, after(250)],
        // the 7th failure's backoff is 960 to 1,920 s (30 s doubling, half of it fixed): failed by at - 360 s
        ['backing-off', after(600), 7, null],
        // a Retry-After of 50 minutes after one failure: failed before the migration, which is all that is known
        ['throttled', after(3_000), 1, null],
        ['waiting', after(-30), 0, null],
        // put 6 h on by a webhook after a failed poll (no backoff is that long), and answered: neither is due
        ['rescheduled', after(21_600), 2, null],
        ['answered', after(21_600), 0, null],
      ]
      for (const [reference, nextPollAt, attempts, lease] of orders) {
        // last written by a webhook or an API call an hour before: the older build's claims and write-backs leave it
        await sql`insert into orders (external_reference, trade_id, trade_status, status_rank, next_poll_at, poll_attempts,
            poll_lease_token, poll_lease_expires_at, updated_at)
          values (${reference}, ${`tr-${reference}`}, 'funded', 20, ${nextPollAt}, ${attempts}, ${lease ? 'older-cycle' : null}, ${lease},
            ${after(-3_600)})`.execute(database.db)
      }

      // (and any later migration)
      expect((await migrateToLatest(database.db)).applied.slice(0, 2)).toEqual(['0020_poll_due_since', '0021_poll_due_since_of_older_pollers'])
      const migratedBy = (await sql<{ at: Date }>`select statement_timestamp() as at`.execute(database.db)).rows[0]!.at

      const rowsAfter = await database.db
        .selectFrom('orders')
        .select(['externalReference', 'nextPollAt', 'pollDueSince', 'pollRetryAt'])
        .orderBy('id')
        .execute()
      const dueSince = Object.fromEntries(rowsAfter.map((row) => [row.externalReference, row.pollDueSince && new Date(row.pollDueSince).getTime()]))
      // held: due before its claim, which was before the migration's now()
      for (const reference of ['held', 'throttled']) {
        expect(dueSince[reference]).toBeGreaterThanOrEqual(at.getTime())
        expect(dueSince[reference]).toBeLessThanOrEqual(migratedBy.getTime())
      }
      expect(dueSince['backing-off']).toBe(after(-360).getTime())
      expect([dueSince.waiting, dueSince.rescheduled, dueSince.answered]).toEqual([null, null, null])
      for (const row of rowsAfter.filter((row) => row.pollDueSince !== null)) {
        expect(new Date(row.pollRetryAt!).getTime()).toBe(new Date(row.nextPollAt!).getTime())
      }

      // the gauges: the four due, the oldest from the backoff's bound (before: 1 due, the one waiting for a claim)
      const scrapedAt = new Date(migratedBy.getTime() + 1_000)
      expect(await countDueOrders(database.db, scrapedAt)).toEqual({
        ordersDue: 4,
        oldestDueAgeS: (scrapedAt.getTime() - after(-360).getTime()) / 1000,
      })
      // this build's claim once the lease and the backoffs are over keeps the time each came due
      const claimed = await claimDueOrders(database.db, { now: after(3_001), limit: 10, leaseS: 300, leaseToken: 'this-build' })
      expect(claimed.map((order) => order.externalReference).sort()).toEqual(['backing-off', 'held', 'throttled', 'waiting'])
      expect(await countDueOrders(database.db, after(3_010))).toEqual({ ordersDue: 4, oldestDueAgeS: 3_370 })
    } finally {
      await database.close()
    }
  })

  it('does not count an order a webhook put less than an hour on after its 7th failed poll: one after its 1st still counts', async () => {
    const database = await databaseMigratedTo('0019_delivery_order_version')
    try {
      const { rows } = await sql<{ at: Date }>`select statement_timestamp() as at`.execute(database.db)
      const at = rows[0]!.at
      const nextPollAt = new Date(at.getTime() + 600_000)
      // a webhook (EXPECTED_WEBHOOK_S 600) after an earlier failed poll: next_poll_at its time + 600 s, updated_at its
      // time, poll_attempts left as the failures made it (only a poll's answer sets it back to 0)
      for (const [reference, attempts] of [['webhook-after-1-failure', 1], ['webhook-after-7-failures', 7]] as const) {
        await sql`insert into orders (external_reference, trade_id, trade_status, status_rank, next_poll_at, poll_attempts, updated_at)
          values (${reference}, ${`tr-${reference}`}, 'cancelled', 50, ${nextPollAt}, ${attempts}, ${at})`.execute(database.db)
      }

      await migrateToLatest(database.db)
      const migratedBy = (await sql<{ at: Date }>`select statement_timestamp() as at`.execute(database.db)).rows[0]!.at

      const rowsAfter = await database.db.selectFrom('orders').select(['externalReference', 'pollDueSince', 'pollRetryAt']).execute()
      const after = Object.fromEntries(rowsAfter.map((row) => [row.externalReference, row]))
      // the 7th failure's backoff is at least 960 s, which the webhook's 600 s is not: no backoff can have written this
      expect(after['webhook-after-7-failures']).toMatchObject({ pollDueSince: null, pollRetryAt: null })
      // the 1st failure's is at least 15 s: the webhook's schedule looks like one, and counts from the migration's run
      const dueSince = new Date(after['webhook-after-1-failure']!.pollDueSince!).getTime()
      expect(dueSince).toBeGreaterThanOrEqual(at.getTime())
      expect(dueSince).toBeLessThanOrEqual(migratedBy.getTime())

      // the gauges: one due, from the migration's run (before the fix: 2, the oldest from next_poll_at - 960 s, 360 s
      // before the webhook)
      const scrapedAt = new Date(migratedBy.getTime() + 1_000)
      expect(await countDueOrders(database.db, scrapedAt)).toEqual({ ordersDue: 1, oldestDueAgeS: (scrapedAt.getTime() - dueSince) / 1000 })
      // due by the webhook's time: counted from then by this build's claim once it comes
      const claimed = await claimDueOrders(database.db, { now: nextPollAt, limit: 10, leaseS: 300, leaseToken: 'this-build' })
      expect(claimed.map((order) => order.externalReference).sort()).toEqual(['webhook-after-1-failure', 'webhook-after-7-failures'])
    } finally {
      await database.close()
    }
  })
})
