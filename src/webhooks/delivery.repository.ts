// Queries on stored webhook deliveries (the trade-event insert lives in orders/apply-observation.ts,
// which records the delivery and its effect in one statement).
import type { Kysely, Selectable } from 'kysely'
import type { Database, WebhookDeliveriesTable } from '../db/database.js'

export type DeliveryOutcome =
  | 'applied'
  | 'duplicate_effect'
  | 'stale'
  | 'unmatched'
  | 'ignored'
  | 'invalid'
  | 'trade_mismatch'
  | 'lease_lost'

export interface StoredDelivery {
  deliveryId: string
  receivedAt: Date
  eventType: string
  tradeId: string | null
  externalReference: string | null
  observedStatus: string | null
  outcome: DeliveryOutcome
  orderId: number | null
  appliedAt: Date | null
  rawBody: string
}

function toDelivery(row: Selectable<WebhookDeliveriesTable>): StoredDelivery {
  return { ...row, outcome: row.outcome as DeliveryOutcome }
}

/** Stores a delivery that changes no order (ignored, invalid). Returns false for a seen delivery id. */
export async function recordDelivery(
  db: Kysely<Database>,
  delivery: { deliveryId: string; eventType: string; rawBody: string; outcome: DeliveryOutcome; receivedAt: Date },
): Promise<boolean> {
  const result = await db
    .insertInto('webhookDeliveries')
    .values(delivery)
    .onConflict((oc) => oc.column('deliveryId').doNothing())
    .executeTakeFirst()
  return Number(result.numInsertedOrUpdatedRows ?? 0) > 0
}

export async function updateDeliveryOutcome(
  db: Kysely<Database>,
  deliveryId: string,
  outcome: DeliveryOutcome,
  appliedAt: Date | null,
): Promise<void> {
  await db.updateTable('webhookDeliveries').set({ outcome, appliedAt }).where('deliveryId', '=', deliveryId).execute()
}

export async function findDelivery(db: Kysely<Database>, deliveryId: string): Promise<StoredDelivery | undefined> {
  const row = await db.selectFrom('webhookDeliveries').selectAll().where('deliveryId', '=', deliveryId).executeTakeFirst()
  return row && toDelivery(row)
}

export async function listDeliveries(
  db: Kysely<Database>,
  { outcome, limit = 50 }: { outcome?: string; limit?: number } = {},
): Promise<Omit<StoredDelivery, 'rawBody'>[]> {
  let query = db
    .selectFrom('webhookDeliveries')
    .select(['deliveryId', 'receivedAt', 'eventType', 'tradeId', 'externalReference', 'observedStatus', 'outcome', 'orderId', 'appliedAt'])
    .orderBy('receivedAt', 'desc')
    .orderBy('deliveryId')
    .limit(limit)
  if (outcome) query = query.where('outcome', '=', outcome)
  const rows = await query.execute()
  return rows.map((row) => ({ ...row, outcome: row.outcome as DeliveryOutcome }))
}
