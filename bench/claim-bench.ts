// Time to claim a batch of 100 due orders with 10,000 and with 1,000,000 orders in the table: the ratio
// shows whether the partial index keeps the claim O(batch).
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { claimDueOrdersQuery } from '../src/orders/poll-schedule.repository.js'

export interface ClaimResult {
  sizes: { orders: number; due: number; medianMs: number }[]
  plan: string
}

const CHUNK = 1_000_000
const ROLLBACK = new Error('rollback: measure without consuming the due orders')

export async function runClaimBench(
  url: string,
  { quick, sizes: orderCounts }: { quick: boolean; sizes?: readonly number[] },
): Promise<ClaimResult> {
  const database = openDatabase({ databaseUrl: url, poolSize: 2 })
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    await migrateToLatest(database.db)
    const sizes: ClaimResult['sizes'] = []
    let plan = ''
    for (const orders of orderCounts ?? (quick ? [10_000, 100_000] : [10_000, 1_000_000])) {
      // seeded on a plain client: the service's pool has a 15 s read timeout, which a million rows
      // into a table with its indexes can outlast on a busy machine
      await client.query('truncate orders restart identity cascade')
      // 1% due now, 20% due later, the rest terminal (next_poll_at null: outside the partial index)
      for (let from = 1; from <= orders; from += CHUNK) {
        await client.query(
          `insert into orders (external_reference, trade_id, trade_status, status_rank, is_terminal, next_poll_at)
           select 'c-' || i, 't-' || i,
             case when i % 100 < 21 then 'funded' else 'released' end,
             case when i % 100 < 21 then 20 else 60 end,
             i % 100 >= 21,
             case when i % 100 = 0 then now() - (i % 1000) * interval '1 second'
                  when i % 100 < 21 then now() + interval '1 hour' end
           from generate_series($1::int, $2::int) i`,
          [from, Math.min(orders, from + CHUNK - 1)],
        )
      }
      await client.query('analyze orders')
      const timings: number[] = []
      const options = { now: new Date(), limit: 100, leaseS: 300, leaseToken: randomUUID() }
      for (let i = 0; i < (quick ? 10 : 30); i++) {
        await database.db
          .transaction()
          .execute(async (trx) => {
            const started = process.hrtime.bigint()
            const claimed = await claimDueOrdersQuery(trx as never, options).execute()
            timings.push(Number(process.hrtime.bigint() - started) / 1e6)
            if (claimed.length !== 100) throw new Error(`claimed ${claimed.length}, expected 100`)
            throw ROLLBACK
          })
          .catch((error) => {
            if (error !== ROLLBACK) throw error
          })
      }
      timings.sort((a, b) => a - b)
      sizes.push({ orders, due: Math.floor(orders / 100), medianMs: timings[Math.floor(timings.length / 2)]! })
      const compiled = claimDueOrdersQuery(database.db, options).compile()
      await client.query('begin')
      const explained = await client.query(`explain (analyze, buffers) ${compiled.sql}`, compiled.parameters as unknown[])
      await client.query('rollback')
      plan = explained.rows.map((row) => row['QUERY PLAN']).join('\n')
    }
    return { sizes, plan }
  } finally {
    await client.end()
    await database.close()
  }
}
