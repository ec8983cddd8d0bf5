// Queries on stored webhook deliveries (the trade-event insert lives in orders/apply-observation.ts,
// which records the delivery and its effect in one statement).
import { type Kysely, type Selectable, sql } from 'kysely'
import type { Database, WebhookDeliveriesTable } from '../db/database.js'

export type DeliveryOutcome =
  | 'applied'
  | 'duplicate_effect'
  | 'stale'
  | 'unknown_status'
  | 'unmatched'
  | 'ignored'
  | 'invalid'
  | 'trade_mismatch'
  | 'lease_lost'

export interface StoredDelivery {
  deliveryId: string
  /** SHA-256 (hex) of the exact body; several bodies under one id are several deliveries (a reused id). */
  bodySha256: string
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

// raw_body holds the exact bytes received as UTF-8 text (the ingest decodes without stripping a
// byte-order mark). Read as text, a driver may strip a leading mark on the way back (PGlite does), so
// the body is read as its bytes and decoded here, mark kept.
const rawBodyBytes = sql<Uint8Array>`convert_to(raw_body, 'UTF8')`.as('rawBodyBytes')
const exactText = new TextDecoder('utf-8', { ignoreBOM: true })

function toDelivery({
  rawBodyBytes: bytes,
  ...row
}: Omit<Selectable<WebhookDeliveriesTable>, 'rawBody'> & { rawBodyBytes: Uint8Array }): StoredDelivery {
  return { ...row, rawBody: exactText.decode(bytes), outcome: row.outcome as DeliveryOutcome }
}

/** A delivery is its id and its body's hash (the table's primary key). */
export interface DeliveryKey {
  deliveryId: string
  bodySha256: string
}

/**
 * Stores a delivery that changes no order (ignored, invalid). inserted: false when this id with this
 * body is stored already (a duplicate). idReused: the id was stored before with another body.
 */
export async function recordDelivery(
  db: Kysely<Database>,
  delivery: DeliveryKey & { eventType: string; rawBody: string; outcome: DeliveryOutcome; receivedAt: Date },
): Promise<{ inserted: boolean; idReused: boolean }> {
  const result = await db
    .insertInto('webhookDeliveries')
    .values(delivery)
    .onConflict((oc) => oc.columns(['deliveryId', 'bodySha256']).doNothing())
    .executeTakeFirst()
  const inserted = Number(result.numInsertedOrUpdatedRows ?? 0) > 0
  if (!inserted) return { inserted, idReused: false }
  const other = await db
    .selectFrom('webhookDeliveries')
    .select('deliveryId')
    .where('deliveryId', '=', delivery.deliveryId)
    .where('bodySha256', '<>', delivery.bodySha256)
    .executeTakeFirst()
  return { inserted, idReused: other !== undefined }
}

export async function updateDeliveryOutcome(
  db: Kysely<Database>,
  { deliveryId, bodySha256 }: DeliveryKey,
  outcome: DeliveryOutcome,
  appliedAt: Date | null,
): Promise<void> {
  await db
    .updateTable('webhookDeliveries')
    .set({ outcome, appliedAt })
    .where('deliveryId', '=', deliveryId)
    .where('bodySha256', '=', bodySha256)
    .execute()
}

/**
 * The delivery stored under this id: the first one stored, or the one whose body has this SHA-256
 * (a prefix of its hex is enough) when the id was reused.
 */
export async function findDelivery(
  db: Kysely<Database>,
  deliveryId: string,
  bodySha256?: string,
): Promise<StoredDelivery | undefined> {
  let query = db
    .selectFrom('webhookDeliveries')
    .select([
      'deliveryId',
      'bodySha256',
      'receivedAt',
      'eventType',
      'tradeId',
      'externalReference',
      'observedStatus',
      'outcome',
      'orderId',
      'appliedAt',
      rawBodyBytes,
    ])
    .where('deliveryId', '=', deliveryId)
    .orderBy('receivedAt')
    .orderBy('bodySha256')
    .limit(1)
  if (bodySha256 !== undefined) query = query.where('bodySha256', 'like', `${bodySha256.toLowerCase().replace(/[^0-9a-f]/g, '')}%`)
  const row = await query.executeTakeFirst()
  return row && toDelivery(row)
}

/** How many bodies are stored under this delivery id (more than one: the id was reused). */
export async function countBodiesOfDelivery(db: Kysely<Database>, deliveryId: string): Promise<number> {
  const row = await db
    .selectFrom('webhookDeliveries')
    .select((eb) => eb.fn.countAll<string>().as('bodies'))
    .where('deliveryId', '=', deliveryId)
    .executeTakeFirstOrThrow()
  return Number(row.bodies)
}

export async function listDeliveries(
  db: Kysely<Database>,
  { outcome, limit = 50 }: { outcome?: string; limit?: number } = {},
): Promise<Omit<StoredDelivery, 'rawBody'>[]> {
  let query = db
    .selectFrom('webhookDeliveries')
    .select(['deliveryId', 'bodySha256', 'receivedAt', 'eventType', 'tradeId', 'externalReference', 'observedStatus', 'outcome', 'orderId', 'appliedAt'])
    .orderBy('receivedAt', 'desc')
    .orderBy('deliveryId')
    .orderBy('bodySha256')
    .limit(limit)
  if (outcome) query = query.where('outcome', '=', outcome)
  const rows = await query.execute()
  return rows.map((row) => ({ ...row, outcome: row.outcome as DeliveryOutcome }))
}

export interface ParkedDeliveryStats {
  /** Deliveries parked as unmatched: their external reference has no order yet. */
  parked: number
  /** Seconds since the oldest parked delivery was received; 0 when none is parked. */
  oldestParkedAgeS: number
}

/** One query over the partial index webhook_deliveries_unmatched_idx: what the parked-delivery metrics report. */
export async function countParkedDeliveries(db: Kysely<Database>, now: Date): Promise<ParkedDeliveryStats> {
  const row = await db
    .selectFrom('webhookDeliveries')
    .select((eb) => [eb.fn.countAll<string>().as('parked'), eb.fn.min('receivedAt').as('oldest')])
    .where('outcome', '=', 'unmatched')
    .executeTakeFirstOrThrow()
  const oldest = row.oldest === null ? null : new Date(row.oldest)
  return {
    parked: Number(row.parked),
    oldestParkedAgeS: oldest ? Math.max(0, (now.getTime() - oldest.getTime()) / 1000) : 0,
  }
}
