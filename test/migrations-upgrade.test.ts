import { createHash } from 'node:crypto'
import { sql } from 'kysely'
import { Migrator } from 'kysely/migration'
import { describe, expect, it } from 'vitest'
import { migrations } from '../migrations/index.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { createTestDatabase } from './helpers/test-database.js'

describe('migration 0002 on a database with data', () => {
  it('fills visited statuses from the history and body hashes from the stored bodies, and keys deliveries on both', async () => {
    const database = await createTestDatabase({ migrate: false })
    try {
      const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(database.db)
      const migrator = new Migrator({
        db: database.db,
        provider: { getMigrations: async () => migrations },
        migrationTableSchema: rows[0]!.schema,
      })
      expect((await migrator.migrateTo('0001_initial')).error).toBeUndefined()
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
