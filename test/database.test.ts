import { sql } from 'kysely'
import { describe, expect, it } from 'vitest'
import { useTestDatabase } from './helpers/test-database.js'

describe('the database layer', () => {
  const database = useTestDatabase()

  it('runs 50 concurrent read-modify-write transactions without interleaving them', async () => {
    const { db } = database
    const { id } = await db
      .insertInto('orders')
      .values({ externalReference: 'counter', pollAttempts: 0 })
      .returning('id')
      .executeTakeFirstOrThrow()

    // each transaction reads, yields to the event loop, then writes what it read plus one: if two ever
    // overlapped, an increment would be lost and the total would come up short
    await Promise.all(
      Array.from({ length: 50 }, () =>
        db.transaction().execute(async (trx) => {
          const row = await trx
            .selectFrom('orders')
            .select('pollAttempts')
            .where('id', '=', id)
            .forUpdate()
            .executeTakeFirstOrThrow()
          await new Promise((resolve) => setTimeout(resolve, 1))
          await trx
            .updateTable('orders')
            .set({ pollAttempts: row.pollAttempts + 1 })
            .where('id', '=', id)
            .execute()
        }),
      ),
    )

    const { pollAttempts } = await db
      .selectFrom('orders')
      .select('pollAttempts')
      .where('id', '=', id)
      .executeTakeFirstOrThrow()
    expect(pollAttempts).toBe(50)
  })

  it('rolls back every write of a transaction that throws', async () => {
    const { db } = database
    await expect(
      db.transaction().execute(async (trx) => {
        await trx.insertInto('orders').values({ externalReference: 'rolled-back' }).execute()
        throw new Error('abort the transaction')
      }),
    ).rejects.toThrow('abort the transaction')
    const found = await db
      .selectFrom('orders')
      .select('id')
      .where('externalReference', '=', 'rolled-back')
      .execute()
    expect(found).toEqual([])
  })

  it('answers a raw statement through the snake_case mapping', async () => {
    const result = await sql<{ orderCount: number }>`select count(*)::int as order_count from orders`.execute(
      database.db,
    )
    expect(result.rows[0]?.orderCount).toBeGreaterThanOrEqual(1)
  })
})
