// Migration 0021 at 1,000,000 open orders on Postgres: what its trigger costs a claim of 100 orders (this build's,
// which the trigger's WHEN passes by, and an older build's, which calls it for each row), how long its backfill takes
// when an older build left every order backing off (a platform outage at the upgrade), and the due gauges' statement
// over the backfilled orders. Run: npx tsx bench/due-since-trigger-bench.ts postgres://…/an_empty_database
import { randomUUID } from 'node:crypto'
import pg from 'pg'
import { migrateTo, migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { claimDueOrdersQuery, countDueOrdersQuery } from '../src/orders/poll-schedule.repository.js'

const ORDERS = 1_000_000
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
const range = (values: number[]) => `${median(values).toFixed(2)} ms median (${Math.min(...values).toFixed(2)}-${Math.max(...values).toFixed(2)})`

// the claim of a build before migration 0020 (test/helpers/older-poller.ts): neither poll_due_since nor poll_retry_at
const olderClaim = (now: Date, token: string) => ({
  text: `with due as materialized (
      select id, next_poll_at from orders where next_poll_at <= $1 and trade_id is not null and is_terminal = false
        and (partner_env is null or partner_env = 'sandbox') and (poll_lease_expires_at is null or poll_lease_expires_at <= $1)
      order by next_poll_at limit 100 for update skip locked)
    update orders set poll_lease_token = $2, poll_lease_expires_at = $3, next_poll_at = $3, poll_attempts = orders.poll_attempts + 1
    from due where orders.id = due.id returning orders.id`,
  values: [now, token, new Date(now.getTime() + 300_000)],
})

async function main(url: string): Promise<void> {
  const database = openDatabase({ databaseUrl: url, poolSize: 2 })
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  const to = (name: string) => migrateTo(database.db, name)
  try {
    await to('0021_poll_due_since_of_older_pollers')
    await client.query('truncate orders restart identity cascade')
    // every order open, 1% due now, the rest an hour on
    await client.query(`insert into orders (external_reference, trade_id, trade_status, status_rank, next_poll_at)
      select 'c-' || i, 't-' || i, 'funded', 20,
        case when i % 100 = 0 then now() - (i % 1000) * interval '1 second' else now() + interval '1 hour' end
      from generate_series(1, ${ORDERS}) i`)
    await client.query('analyze orders')

    const claimTimes = async (claim: (trx: pg.Client) => Promise<number>) => {
      const times: number[] = []
      for (let i = 0; i < 20; i++) {
        await client.query('begin')
        const started = process.hrtime.bigint()
        const claimed = await claim(client)
        times.push(Number(process.hrtime.bigint() - started) / 1e6)
        await client.query('rollback')
        if (claimed !== 100) throw new Error(`claimed ${claimed}, expected 100`)
      }
      return times
    }
    const thisBuild = async (c: pg.Client) => {
      const compiled = claimDueOrdersQuery(database.db, { now: new Date(), limit: 100, leaseS: 300, leaseToken: randomUUID() }).compile()
      return (await c.query(compiled.sql, compiled.parameters as unknown[])).rowCount ?? 0
    }
    const olderBuild = async (c: pg.Client) => (await c.query(olderClaim(new Date(), randomUUID()))).rowCount ?? 0
    // interleaved, the trigger on and off by turns, so a machine busy for a while weighs on both alike
    const times = { thisBuild: { on: [] as number[], off: [] as number[] }, olderBuild: { on: [] as number[], off: [] as number[] } }
    for (let round = 0; round < (process.env.SKIP_CLAIMS ? 0 : 10); round++) {
      for (const state of ['on', 'off'] as const) {
        await client.query(`alter table orders ${state === 'on' ? 'enable' : 'disable'} trigger orders_poll_due_since_of_older_pollers`)
        times.thisBuild[state].push(...(await claimTimes(thisBuild)))
        times.olderBuild[state].push(...(await claimTimes(olderBuild)))
      }
    }
    await client.query('alter table orders enable trigger orders_poll_due_since_of_older_pollers')
    if (!process.env.SKIP_CLAIMS) console.log(`a claim of 100 of ${ORDERS.toLocaleString('en')} orders, ${times.thisBuild.on.length} of each`)
    if (!process.env.SKIP_CLAIMS) console.log(`  this build's:  with the trigger ${range(times.thisBuild.on)}, without ${range(times.thisBuild.off)}`)
    if (!process.env.SKIP_CLAIMS) console.log(`  older build's: with the trigger ${range(times.olderBuild.on)}, without ${range(times.olderBuild.off)}`)

    // the platform answering: 1% of the orders due, none held or backing off; the backfill reads them all
    const timed = async (what: string) => {
      await to('0020_poll_due_since')
      await client.query('vacuum analyze orders')
      // as a start migrates: one transaction, no statement timeout (src/db/migrate.ts)
      const started = process.hrtime.bigint()
      const { applied } = await migrateToLatest(database.db)
      // and any later migration (0022 adds a column to reaction_jobs, empty here)
      if (applied[0] !== '0021_poll_due_since_of_older_pollers') throw new Error(`applied ${applied.join()}`)
      console.log(`migration 0021 over ${ORDERS.toLocaleString('en')} orders, ${what}: ${(Number(process.hrtime.bigint() - started) / 1e6).toFixed(0)} ms`)
    }
    await timed('none held or backing off')

    // a platform outage at the upgrade: an older build left every order backing off, nothing of when each came due
    await to('0020_poll_due_since')
    await client.query(`update orders set poll_attempts = 3, next_poll_at = now() + (10 + id % 40) * interval '1 minute'`)
    await timed('every one backing off')
    await client.query('vacuum analyze orders')
    const gauge = countDueOrdersQuery(database.db, new Date()).compile()
    const gaugeTimes: number[] = []
    for (let i = 0; i < 5; i++) {
      const started = process.hrtime.bigint()
      const { rows } = await client.query(gauge.sql, gauge.parameters as unknown[])
      gaugeTimes.push(Number(process.hrtime.bigint() - started) / 1e6)
      if (i === 0) console.log('  gauges read', JSON.stringify(rows[0]))
    }
    console.log(`  the gauges' statement: ${gaugeTimes.map((t) => t.toFixed(1)).join(', ')} ms`)
  } finally {
    await client.end()
    await database.close()
  }
}

await main(process.argv[2] ?? process.env.DATABASE_URL ?? '')
