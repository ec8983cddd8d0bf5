// The console's searches read indexes, not the table: EXPLAIN on Postgres over a table large enough
// (and spread over a month) that the planner would otherwise choose a sequential scan.
import { CompiledQuery, sql } from 'kysely'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { searchOrdersQuery } from '../src/orders/order.repository.js'
import {
  countFailedJobsByHandlerQuery,
  jobsOfEventsQuery,
  type ReactionJobFilter,
  searchJobsQuery,
} from '../src/reactions/reaction-job.repository.js'
import { type DeliveryFilter, searchDeliveriesQuery } from '../src/webhooks/delivery.repository.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const DELIVERIES = 50_000
const ORDERS = 10_000
const EVENTS = 30_000

interface PlanNode {
  'Node Type': string
  'Relation Name'?: string
  'Index Name'?: string
  Plans?: PlanNode[]
}

function nodesOf(plan: PlanNode): PlanNode[] {
  return [plan, ...(plan.Plans ?? []).flatMap(nodesOf)]
}

describePostgres('console search queries (Postgres)', () => {
  let database: TestDatabase

  async function plan(query: { compile(): CompiledQuery }): Promise<PlanNode[]> {
    const compiled = query.compile()
    const result = await database.db.executeQuery<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
      CompiledQuery.raw(`explain (format json) ${compiled.sql}`, [...compiled.parameters]),
    )
    return nodesOf(result.rows[0]!['QUERY PLAN'][0].Plan)
  }

  beforeAll(async () => {
    database = await createTestDatabase()
    // a month of deliveries; 1 in 100 is trade_mismatch, 1 in 50 is a seller event
    await sql`
      insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference,
                                      observed_status, outcome, raw_body)
      select 'dlv-' || i, md5(i::text) || md5(i::text), now() - (i * interval '50 seconds'),
             case when i % 50 = 0 then 'seller.updated' else 'trade.funded' end,
             'trd-' || (i % ${ORDERS}), 'order-' || (i % ${ORDERS}), 'funded',
             case when i % 100 = 0 then 'trade_mismatch' else 'applied' end, '{}'
      from generate_series(1, ${DELIVERIES}) as i`.execute(database.db)
    // one reference replayed thousands of times (each stored duplicate_effect: not applied)
    await sql`
      insert into webhook_deliveries (delivery_id, body_sha256, received_at, event_type, trade_id, external_reference,
                                      observed_status, outcome, raw_body)
      select 'replay-' || i, md5(i::text) || md5(i::text), now() - (i * interval '1 second'), 'trade.funded',
             'trd-7', 'order-7', 'funded', 'duplicate_effect', '{}'
      from generate_series(1, 5000) as i`.execute(database.db)
    await sql`
      insert into orders (external_reference, trade_id, trade_status, attention, next_poll_at)
      select 'order-' || i, 'trd-' || i, case when i % 100 = 0 then 'disputed' else 'funded' end,
             case when i % 500 = 0 then 'trade_not_found' end, now() + (i * interval '1 minute')
      from generate_series(0, ${ORDERS - 1}) as i`.execute(database.db)
    // an event per order and status, and two handlers' jobs for each: mostly done, 1 in 1,000 failed, 1 in
    // 200 pending; a third handler subscribed to one event in 500
    await sql`
      insert into order_status_history (order_id, from_status, to_status, source, sequence, trade_id, external_reference, recorded_at)
      select (i % ${ORDERS}) + 1, 'created', 'funded', 'webhook', 1 + i / ${ORDERS}, 'trd-' || (i % ${ORDERS}), 'order-' || (i % ${ORDERS}),
             now() - (i * interval '1 minute')
      from generate_series(0, ${EVENTS - 1}) as i`.execute(database.db)
    await sql`
      insert into reaction_jobs (event_id, order_id, sequence, handler, state, attempts, run_at, created_at)
      select h.event_id, h.order_id, h.sequence, handler.name,
             case when h.id % 1000 = 0 then 'failed' when h.id % 200 = 0 then 'pending' else 'done' end, 1,
             h.recorded_at, h.recorded_at
      from order_status_history h
      cross join (values ('ledger'), ('crm-sync'), ('rare')) as handler(name)
      where handler.name <> 'rare' or h.id % 500 = 0
      order by h.id`.execute(database.db)
    await sql`analyze webhook_deliveries`.execute(database.db)
    await sql`analyze orders`.execute(database.db)
    await sql`analyze order_status_history`.execute(database.db)
    await sql`analyze reaction_jobs`.execute(database.db)
  })
  afterAll(async () => {
    await database?.close()
  })

  const deliverySearches: [string, DeliveryFilter, string][] = [
    ['external reference', { externalReference: 'order-42' }, 'webhook_deliveries_unapplied_reference_idx'],
    ['trade id', { tradeId: 'trd-42' }, 'webhook_deliveries_unapplied_trade_idx'],
    ['delivery id', { deliveryId: 'dlv-42' }, 'webhook_deliveries_pkey'],
    ['outcome', { outcome: 'trade_mismatch' }, 'webhook_deliveries_outcome_idx'],
    ['event kind', { eventType: 'seller.updated' }, 'webhook_deliveries_event_type_idx'],
    ['time range', { from: new Date(Date.now() - 3_600_000) }, 'webhook_deliveries_received_idx'],
  ]

  for (const [name, filter, index] of deliverySearches) {
    it(`searches deliveries by ${name} through ${index}, on the first page and a later one`, async () => {
      for (const after of [undefined, { receivedAt: new Date(Date.now() - 86_400_000).toISOString(), deliveryId: 'dlv-9', bodySha256: 'f'.repeat(64) }]) {
        const nodes = await plan(searchDeliveriesQuery(database.db, filter, { after, limit: 51 }))
        expect(nodes.filter((node) => node['Node Type'] === 'Seq Scan')).toEqual([])
        expect(nodes.map((node) => node['Index Name'])).toContain(index)
      }
    })
  }

  it('pages the deliveries of a reference with thousands not applied off its index, in order, without sorting them', async () => {
    for (const filter of [{ externalReference: 'order-7' }, { tradeId: 'trd-7' }]) {
      for (const after of [undefined, { receivedAt: new Date(Date.now() - 600_000).toISOString(), deliveryId: 'replay-600', bodySha256: 'f'.repeat(64) }]) {
        const nodes = await plan(searchDeliveriesQuery(database.db, filter, { after, limit: 51 }))
        expect(nodes.map((node) => node['Node Type'])).toContain('Merge Append')
        expect(nodes.map((node) => node['Index Name'])).toContain(filter.tradeId ? 'webhook_deliveries_unapplied_trade_idx' : 'webhook_deliveries_unapplied_reference_idx')
        expect(nodes.filter((node) => node['Node Type'] === 'Seq Scan')).toEqual([])
      }
    }
  })

  it('lists orders by status and the flagged ones through their indexes', async () => {
    for (const [filter, index] of [
      [{ status: 'disputed' }, 'orders_status_idx'],
      [{ needsAttention: true }, 'orders_attention_idx'],
      [{ externalReference: 'order-42' }, 'orders_external_reference_key'],
    ] as const) {
      const nodes = await plan(searchOrdersQuery(database.db, filter, { limit: 51 }))
      expect(nodes.filter((node) => node['Node Type'] === 'Seq Scan')).toEqual([])
      expect(nodes.map((node) => node['Index Name'])).toContain(index)
    }
  })

  const reactionLists: [string, ReactionJobFilter, string][] = [
    ['failed', { state: 'failed' }, 'reaction_jobs_state_idx'],
    ['pending', { state: 'pending' }, 'reaction_jobs_state_idx'],
    // done jobs are nearly every row, and not in the state index (migrations/0010)
    ['done', { state: 'done' }, 'reaction_jobs_pkey'],
    ['a handler', { handler: 'rare' }, 'reaction_jobs_handler_idx'],
    ['a handler and a state', { handler: 'rare', state: 'failed' }, 'reaction_jobs_'],
    ['every state', {}, 'reaction_jobs_pkey'],
  ]
  for (const [name, filter, index] of reactionLists) {
    it(`lists reaction jobs by ${name} through ${index}, with their events by event id, on the first page and a later one`, async () => {
      for (const beforeId of [undefined, '20000']) {
        const nodes = await plan(searchJobsQuery(database.db, filter, { beforeId, limit: 51 }))
        expect(nodes.filter((node) => node['Node Type'] === 'Seq Scan')).toEqual([])
        expect(nodes.some((node) => node['Index Name']?.startsWith(index))).toBe(true)
        expect(nodes.map((node) => node['Index Name'])).toContain('order_status_history_event_id_key')
      }
    })
  }

  it('keeps done jobs out of the state index: the stream writes one for every handled event', async () => {
    const { rows } = await sql<{ indexdef: string }>`select indexdef from pg_indexes where indexname = 'reaction_jobs_state_idx'`.execute(database.db)
    expect(rows[0]?.indexdef).toMatch(/WHERE \(state <> 'done'::text\)/)
  })

  it("finds an order's reactions by event id and counts the failed ones through indexes", async () => {
    const events = await sql<{ eventId: string }>`select event_id from order_status_history where order_id = 42`.execute(database.db)
    const byEvent = await plan(jobsOfEventsQuery(database.db, events.rows.map((row) => row.eventId)))
    expect(byEvent.filter((node) => node['Node Type'] === 'Seq Scan')).toEqual([])
    expect(byEvent.map((node) => node['Index Name'])).toContain('reaction_jobs_event_handler_key')
    const failed = await plan(countFailedJobsByHandlerQuery(database.db))
    expect(failed.filter((node) => node['Node Type'] === 'Seq Scan')).toEqual([])
  })
})
