// Applying an observed trade status to the partner's order: ONE statement, whatever the source.
//
// Webhooks, polls, API answers and parked deliveries all go through `observationStatement`, so the
// rank rules cannot diverge. The statement locks the order row (FOR UPDATE: concurrent observations
// of one order queue on it and each decides on the row as the previous one left it), decides the
// outcome in SQL with the same table as decideTransition() in trade-status.ts, updates the order,
// appends the history row and, for a webhook, records the delivery: all in one round trip, so a
// webhook costs one statement and one commit.
//
// Deduplication: a webhook's delivery row is inserted ON CONFLICT (delivery_id) DO NOTHING, and the
// order update and history insert only happen when that insert did. Two replicas receiving the same
// delivery at once: one inserts and applies, the other's insert conflicts and changes nothing.
import { type Kysely, type RawBuilder, sql, type Transaction } from 'kysely'
import type { Database } from '../db/database.js'
import { PREPARED } from '../db/open-database.js'
import type { ObservationSource } from './order.js'
import { isTerminalStatus, statusRank } from './trade-status.js'

export type ObservationTarget = { externalReference: string } | { tradeId: string } | { orderId: number; leaseToken?: string }

export interface Observation {
  target: ObservationTarget
  tradeId: string
  tradeReference?: string | null
  externalReference?: string | null
  status: string
  source: ObservationSource
  deliveryId?: string | null
  observedAt: Date
}

export interface ObservationSettings {
  /** After any observation a non-terminal order is polled again this many seconds later. */
  staleAfterS: number
}

/**
 * applied: the order moved. duplicate_effect: it already had this status. stale: a lower rank, or a
 * change to a terminal order. unmatched: no such order (yet). lease_lost: a poll whose claim expired
 * and was taken by another replica. trade_mismatch: the order is linked to another trade.
 */
export type ObservationOutcome = 'applied' | 'duplicate_effect' | 'stale' | 'unmatched' | 'lease_lost' | 'trade_mismatch'

export interface ObservationResult {
  outcome: ObservationOutcome
  orderId: number | null
  fromStatus: string | null
  toStatus: string | null
}

/** A webhook to record with the observation; absent for polls, API answers and parked deliveries. */
export interface DeliveryRecord {
  deliveryId: string
  eventType: string
  rawBody: string
}

type Executor = Kysely<Database> | Transaction<Database>

export async function applyObservation(
  db: Executor,
  observation: Observation,
  settings: ObservationSettings,
): Promise<ObservationResult> {
  const { rows } = await observationStatement(observation, settings).execute(db)
  return toResult(rows[0], observation)
}

/** Records a webhook delivery and applies its observation; `duplicate` when the delivery id was seen. */
export async function recordDeliveryAndApply(
  db: Executor,
  delivery: DeliveryRecord,
  observation: Observation,
  settings: ObservationSettings,
): Promise<ObservationResult | 'duplicate'> {
  const { rows } = await observationStatement(observation, settings, delivery).execute(db)
  const row = rows[0]
  if (!row?.inserted) return 'duplicate'
  return toResult(row, observation)
}

interface StatementRow {
  inserted: boolean
  outcome: ObservationOutcome | null
  orderId: number | null
  fromStatus: string | null
}

function toResult(row: StatementRow | undefined, observation: Observation): ObservationResult {
  const leaseTarget = 'orderId' in observation.target && observation.target.leaseToken !== undefined
  const outcome = row?.outcome ?? (leaseTarget ? 'lease_lost' : 'unmatched')
  return {
    outcome,
    orderId: row?.orderId ?? null,
    fromStatus: row?.fromStatus ?? null,
    toStatus: outcome === 'applied' ? observation.status : (row?.fromStatus ?? null),
  }
}

function targetCondition(target: ObservationTarget): RawBuilder<unknown> {
  if ('externalReference' in target) return sql`o.external_reference = ${target.externalReference}::text`
  if ('tradeId' in target) return sql`o.trade_id = ${target.tradeId}::text`
  if (target.leaseToken !== undefined) {
    return sql`o.id = ${target.orderId}::int and o.poll_lease_token = ${target.leaseToken}::text`
  }
  return sql`o.id = ${target.orderId}::int`
}

export function observationStatement(
  observation: Observation,
  { staleAfterS }: ObservationSettings,
  delivery?: DeliveryRecord,
): RawBuilder<StatementRow> {
  const rank = statusRank(observation.status)
  const known = rank !== undefined
  const terminal = isTerminalStatus(observation.status)
  const now = observation.observedAt
  const status = observation.status
  const tradeId = observation.tradeId
  const releasesLease = 'orderId' in observation.target && observation.target.leaseToken !== undefined
  const nextPoll = sql`${now}::timestamptz + make_interval(secs => ${staleAfterS}::int)`

  // decision: the same table as decideTransition(), on the locked row; trade_mismatch guards an
  // order already linked to another trade
  const decision = sql`
    decision as (
      select o.id, o.trade_status as from_status,
        case
          when o.trade_id is not null and o.trade_id <> ${tradeId}::text then 'trade_mismatch'
          when o.trade_status = ${status}::text then 'duplicate_effect'
          when o.is_terminal then 'stale'
          when o.trade_status is null then 'applied'
          when ${known}::boolean and ${rank ?? 0}::int <= o.status_rank then 'stale'
          else 'applied'
        end as outcome
      from orders o
      where ${targetCondition(observation.target)}
        ${
          // a delivery id already stored changes nothing: do not even wait for the order's lock
          delivery
            ? sql`and not exists (select 1 from webhook_deliveries w where w.delivery_id = ${delivery.deliveryId}::text)`
            : sql``
        }
      for update
    )`

  const deliveryInsert = delivery
    ? sql`,
    delivery as (
      insert into webhook_deliveries
        (delivery_id, received_at, event_type, trade_id, external_reference, observed_status, outcome, order_id, raw_body, applied_at)
      select ${delivery.deliveryId}::text, ${now}::timestamptz, ${delivery.eventType}::text, ${tradeId}::text,
        ${observation.externalReference ?? null}::text, ${status}::text, coalesce(d.outcome, 'unmatched'), d.id,
        ${delivery.rawBody}::text, case when d.outcome = 'applied' then ${now}::timestamptz end
      from (select 1) as one left join decision d on true
      on conflict (delivery_id) do nothing
      returning delivery_id
    )`
    : sql``
  // a webhook's effects happen only if its delivery row was new
  const gate = delivery ? sql`and exists (select 1 from delivery)` : sql``

  return sql<StatementRow>`${sql.raw(PREPARED)}
    with ${decision}${deliveryInsert},
    moved as (
      update orders o set
        trade_status = case when d.outcome = 'applied' then ${status}::text else o.trade_status end,
        status_rank = case when d.outcome = 'applied' and ${known}::boolean then ${rank ?? 0}::int else o.status_rank end,
        is_terminal = case when d.outcome = 'applied' then ${terminal}::boolean else o.is_terminal end,
        status_source = case when d.outcome = 'applied' then ${observation.source}::text else o.status_source end,
        status_changed_at = case when d.outcome = 'applied' then ${now}::timestamptz else o.status_changed_at end,
        trade_id = coalesce(o.trade_id, ${tradeId}::text),
        trade_reference = coalesce(o.trade_reference, ${observation.tradeReference ?? null}::text),
        trade_create_state = 'created',
        next_poll_at = case
          when (d.outcome = 'applied' and ${terminal}::boolean) or (d.outcome <> 'applied' and o.is_terminal) then null
          when d.outcome = 'applied' and not ${known}::boolean then ${now}::timestamptz
          when d.outcome in ('applied', 'duplicate_effect') or ${releasesLease}::boolean then ${nextPoll}
          else o.next_poll_at
        end,
        ${
          releasesLease
            ? sql`poll_lease_token = null, poll_lease_expires_at = null, last_polled_at = ${now}::timestamptz, poll_attempts = 0,`
            : sql``
        }
        version = o.version + case when d.outcome = 'applied' then 1 else 0 end,
        updated_at = ${now}::timestamptz
      from decision d
      where o.id = d.id
        and (d.outcome in ('applied', 'duplicate_effect') or ${releasesLease}::boolean)
        ${gate}
      returning o.id
    ),
    history as (
      insert into order_status_history (order_id, from_status, to_status, source, delivery_id, recorded_at)
      select d.id, d.from_status, ${status}::text, ${observation.source}::text, ${observation.deliveryId ?? null}::text, ${now}::timestamptz
      from decision d
      where d.outcome = 'applied' ${gate}
      returning order_id
    )
    select
      ${delivery ? sql`exists (select 1 from delivery)` : sql`true`} as inserted,
      d.outcome, d.id as order_id, d.from_status,
      (select count(*) from moved) + (select count(*) from history) as writes
    from (select 1) as one left join decision d on true`
}
