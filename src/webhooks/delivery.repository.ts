// Every query on stored webhook deliveries but one: the trade-event insert lives in
// orders/apply-observation.ts, which records the delivery and its effect in one statement.
import { type Kysely, type Selectable, type SelectQueryBuilder, sql, type Transaction } from 'kysely'
import type { Database, WebhookDeliveriesTable } from '../db/database.js'
import { deliveriesAppliedToOrderQuery } from '../orders/order.repository.js'
import type { DeliveryOutcome } from './delivery-outcome.js'

export { DELIVERY_OUTCOMES, type DeliveryOutcome, WEBHOOK_OUTCOMES } from './delivery-outcome.js'

export interface StoredDelivery {
  deliveryId: string
  /** SHA-256 (hex) of the exact body; several bodies under one id are several deliveries (a reused id). */
  bodySha256: string
  receivedAt: Date
  eventType: string
  tradeId: string | null
  /** A trade event's `reference` field, as the ingest parsed it. */
  tradeReference: string | null
  externalReference: string | null
  observedStatus: string | null
  outcome: DeliveryOutcome
  orderId: number | null
  appliedAt: Date | null
  /** null: pruned RETENTION_DAYS after receipt (src/retention); the row and its hash stay. */
  rawBody: string | null
}

// raw_body holds the exact bytes received as UTF-8 text (the ingest decodes without stripping a
// byte-order mark). Read as text, a driver may strip a leading mark on the way back (PGlite does), so
// the body is read as its bytes and decoded here, mark kept.
const rawBodyBytes = sql<Uint8Array | null>`convert_to(raw_body, 'UTF8')`.as('rawBodyBytes')
const exactText = new TextDecoder('utf-8', { ignoreBOM: true })

function toDelivery({
  rawBodyBytes: bytes,
  ...row
}: Omit<Selectable<WebhookDeliveriesTable>, 'rawBody' | 'orderVersion'> & { rawBodyBytes: Uint8Array | null }): StoredDelivery {
  return { ...row, rawBody: bytes === null ? null : exactText.decode(bytes), outcome: row.outcome as DeliveryOutcome }
}

// every column but the raw body (and the order's version, read only by the ingest's replay check)
const SUMMARY_COLUMNS = [
  'deliveryId',
  'bodySha256',
  'receivedAt',
  'eventType',
  'tradeId',
  'tradeReference',
  'externalReference',
  'observedStatus',
  'outcome',
  'orderId',
  'appliedAt',
] as const

/** A delivery is its id and its body's hash (the table's primary key). */
export interface DeliveryKey {
  deliveryId: string
  bodySha256: string
}

/** The advisory locks of recordDelivery ("delv" in ASCII), one per delivery id in its second key. */
const DELIVERY_ID_LOCK_CLASS = 0x64656c76

/**
 * Stores a delivery that changes no order (ignored, invalid). inserted: false when this id with this
 * body is stored already (a duplicate), or, with `foldReplays` (the default), when another id's delivery with this
 * body changed nothing (replayed: the id is not signed, so one captured body was stored again under each fresh id).
 * idReused: the id was stored before with another body.
 */
export async function recordDelivery(
  db: Kysely<Database>,
  delivery: DeliveryKey & { eventType: string; rawBody: string; outcome: DeliveryOutcome; receivedAt: Date },
  { foldReplays = true }: { foldReplays?: boolean } = {},
): Promise<{ inserted: boolean; idReused: boolean; replayed: boolean }> {
  return db.transaction().execute(async (trx) => {
    // One id's bodies are stored one at a time, on every replica: without the lock, two bodies arriving
    // together both inserted before either looked, each saw the other, and one reuse was reported twice.
    // With it, the first body stored sees no other and each later one sees those before it.
    await sql`select pg_advisory_xact_lock(${sql.lit(DELIVERY_ID_LOCK_CLASS)}, hashtext(${delivery.deliveryId}))`.execute(trx)
    // the body stored already under another id, with no effect (migrations/0017): replayed, not stored again
    if (foldReplays && (await storedWithoutEffect(trx, delivery))) return { inserted: false, idReused: false, replayed: true }
    const result = await trx
      .insertInto('webhookDeliveries')
      .values(delivery)
      .onConflict((oc) => oc.columns(['deliveryId', 'bodySha256']).doNothing())
      .executeTakeFirst()
    const inserted = Number(result.numInsertedOrUpdatedRows ?? 0) > 0
    if (!inserted) return { inserted, idReused: false, replayed: false }
    const other = await trx
      .selectFrom('webhookDeliveries')
      .select('deliveryId')
      .where('deliveryId', '=', delivery.deliveryId)
      .where('bodySha256', '<>', delivery.bodySha256)
      .executeTakeFirst()
    return { inserted, idReused: other !== undefined, replayed: false }
  })
}

/** Whether a delivery that changed nothing has this body under another id (one probe of webhook_deliveries_unapplied_body_idx). */
async function storedWithoutEffect(db: Transaction<Database>, { deliveryId, bodySha256 }: DeliveryKey): Promise<boolean> {
  const row = await db
    .selectFrom('webhookDeliveries')
    .select('deliveryId')
    .where('bodySha256', '=', bodySha256)
    .where('outcome', '<>', 'applied')
    .where('deliveryId', '<>', deliveryId)
    .limit(1)
    .executeTakeFirst()
  return row !== undefined
}

/**
 * The order a delivery's effect was recorded against, and that order's version now (migrations/0019): read in the
 * transaction that applied the effect, which holds the order's row, so the version after that move.
 */
function recordedAgainst(orderId: number) {
  return { orderId, orderVersion: sql<number>`(select o.version from orders o where o.id = ${orderId})` }
}

/** A delivery's effect, once known (applied later, re-applied, or by an event handler). */
export async function updateDeliveryOutcome(
  db: Kysely<Database> | Transaction<Database>,
  { deliveryId, bodySha256 }: DeliveryKey,
  { outcome, appliedAt, orderId }: { outcome: DeliveryOutcome; appliedAt: Date | null; orderId?: number | null },
): Promise<void> {
  await db
    .updateTable('webhookDeliveries')
    .set({ outcome, appliedAt, ...(orderId != null ? recordedAgainst(orderId) : {}) })
    .where('deliveryId', '=', deliveryId)
    .where('bodySha256', '=', bodySha256)
    .execute()
}

/**
 * A re-apply's outcome on its delivery's row, but what the row already records stays: a delivery that applied
 * keeps `applied` and its time when re-applying it changes nothing (it was rewritten `stale`, and the record that
 * it moved its order was gone from the row), and a dismissed one stays dismissed when no order has its reference
 * (a re-apply parked it again: back in the parked count and its alert). Decided on the row as locked, in the
 * update itself. Returns the outcome the row has after it.
 */
export async function recordReapplyOutcome(
  trx: Transaction<Database>,
  { deliveryId, bodySha256 }: DeliveryKey,
  { outcome, appliedAt, orderId }: { outcome: DeliveryOutcome; appliedAt: Date | null; orderId: number | null },
): Promise<DeliveryOutcome> {
  let update = trx
    .updateTable('webhookDeliveries')
    .set({ outcome, appliedAt, ...(orderId != null ? recordedAgainst(orderId) : {}) })
    .where('deliveryId', '=', deliveryId)
    .where('bodySha256', '=', bodySha256)
  if (outcome !== 'applied') update = update.where('outcome', '<>', 'applied')
  if (outcome === 'unmatched') update = update.where('outcome', '<>', 'dismissed')
  const updated = await update.returning('outcome').executeTakeFirst()
  if (updated) return updated.outcome as DeliveryOutcome
  const kept = await trx
    .selectFrom('webhookDeliveries')
    .select('outcome')
    .where('deliveryId', '=', deliveryId)
    .where('bodySha256', '=', bodySha256)
    .executeTakeFirstOrThrow()
  return kept.outcome as DeliveryOutcome
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
    .select([...SUMMARY_COLUMNS, rawBodyBytes])
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
    .select(SUMMARY_COLUMNS)
    .orderBy('receivedAt', 'desc')
    .orderBy('deliveryId')
    .orderBy('bodySha256')
    .limit(limit)
  if (outcome) query = query.where('outcome', '=', outcome)
  const rows = await query.execute()
  return rows.map((row) => ({ ...row, outcome: row.outcome as DeliveryOutcome }))
}

/** A trade event parked as unmatched, as the parked-delivery passes apply it. */
export type ParkedDelivery = Pick<StoredDelivery, 'deliveryId' | 'bodySha256' | 'tradeId' | 'tradeReference' | 'observedStatus'>

/**
 * Locks the deliveries parked for this reference, oldest first. SKIP LOCKED: a concurrent pass takes
 * the others, and each parked row is applied by exactly one pass.
 */
export async function lockParkedDeliveries(trx: Transaction<Database>, externalReference: string): Promise<ParkedDelivery[]> {
  return trx
    .selectFrom('webhookDeliveries')
    .select(['deliveryId', 'bodySha256', 'tradeId', 'tradeReference', 'observedStatus'])
    .where('externalReference', '=', externalReference)
    .where('outcome', '=', 'unmatched')
    .orderBy('receivedAt')
    .orderBy('deliveryId')
    .forUpdate()
    .skipLocked()
    .execute()
}

/** Parked deliveries whose effect another delivery of the same body just had: `duplicate_effect`, for `orderId`. */
export async function recordDuplicateEffects(trx: Transaction<Database>, deliveries: readonly DeliveryKey[], orderId: number): Promise<void> {
  // in slices: one statement's parameters are bounded (65,535 in Postgres's protocol)
  for (let start = 0; start < deliveries.length; start += 5_000) {
    const slice = deliveries.slice(start, start + 5_000)
    await trx
      .updateTable('webhookDeliveries')
      .set({ outcome: 'duplicate_effect', appliedAt: null, ...recordedAgainst(orderId) })
      .where((eb) => eb(eb.refTuple('deliveryId', 'bodySha256'), 'in', slice.map(({ deliveryId, bodySha256 }) => eb.tuple(deliveryId, bodySha256))))
      .execute()
  }
}

/**
 * Sets aside the deliveries parked for `externalReference` (`deliveries dismiss`): outcome `dismissed`, so an order
 * made later for the reference does not take them, they leave the parked count (and its alert), and retention
 * deletes them by age like any other row. Refused (`order_exists`) when an order has the reference: its deliveries
 * are applied, not dismissed. With `dryRun`, only counts them. The rows are locked first, as an order's creation
 * locks them (SKIP LOCKED there): an order created meanwhile either came first (refused here) or skips them.
 */
export async function dismissParkedDeliveries(
  db: Kysely<Database>,
  externalReference: string,
  { dryRun }: { dryRun: boolean },
): Promise<{ dismissed: number } | { orderExists: true }> {
  return db.transaction().execute(async (trx) => {
    // the same lock an order's creation takes on its reference's parked rows (lockParkedDeliveries)
    const parked = await lockParkedDeliveries(trx, externalReference)
    const order = await trx.selectFrom('orders').select('id').where('externalReference', '=', externalReference).executeTakeFirst()
    if (order) return { orderExists: true as const }
    if (dryRun || parked.length === 0) return { dismissed: parked.length }
    const result = await trx
      .updateTable('webhookDeliveries')
      .set({ outcome: 'dismissed' })
      .where('externalReference', '=', externalReference)
      .where('outcome', '=', 'unmatched')
      .executeTakeFirst()
    return { dismissed: Number(result.numUpdatedRows) }
  })
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

// The operator console's queries. Each filter has an index (migrations/0003_console_indexes.ts) and
// pages are keyset-paginated on (received_at, delivery_id, body_sha256), newest first, so page 1,000
// costs what page 1 does. A search by trade id or external reference reads two sources, merged in that
// order (filteredSources, inReceiptOrder): the deliveries not applied through their partial indexes (migrations/0014),
// and the applied ones through their order's history.

export interface DeliveryFilter {
  tradeId?: string | undefined
  externalReference?: string | undefined
  deliveryId?: string | undefined
  outcome?: DeliveryOutcome | undefined
  eventType?: string | undefined
  /** Received at or after. */
  from?: Date | undefined
  /** Received before. */
  to?: Date | undefined
  /** After this row in receipt order (received_at, then the primary key): where a bulk re-apply's next run starts. */
  startAfter?: DeliveryCursor | undefined
}

/**
 * Where the next page starts: the last row of this one. receivedAt is the stored time as text, to the
 * microsecond: a JavaScript Date keeps milliseconds and would skip or repeat rows within one.
 */
export interface DeliveryCursor {
  receivedAt: string
  deliveryId: string
  bodySha256: string
}

const exactReceivedAt = sql<string>`to_char(received_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`

export type DeliverySummary = Omit<StoredDelivery, 'rawBody'>

/**
 * Where the deliveries matching a filter are read: one query of the table, or two when the filter names a trade id
 * or an external reference. The partial indexes of migrations/0014 keep only the deliveries not applied; an applied
 * delivery made its order's transition, whose history row names it, so it is found through the order the trade or
 * reference names. Every applied delivery was applied to that order: the ingest matches a delivery to the order of
 * its reference and refuses (trade_mismatch) one whose trade is not the order's or is another order's. Every filter
 * applies to each source, so the sources only say where to look, never what matches.
 */
function filteredSources(db: Kysely<Database>, filter: DeliveryFilter) {
  let every = db.selectFrom('webhookDeliveries')
  if (filter.tradeId) every = every.where('tradeId', '=', filter.tradeId)
  if (filter.externalReference) every = every.where('externalReference', '=', filter.externalReference)
  if (filter.deliveryId) every = every.where('deliveryId', '=', filter.deliveryId)
  if (filter.outcome) every = every.where('outcome', '=', filter.outcome)
  if (filter.eventType) every = every.where('eventType', '=', filter.eventType)
  if (filter.from) every = every.where('receivedAt', '>=', filter.from)
  if (filter.to) every = every.where('receivedAt', '<', filter.to)
  if (filter.startAfter) {
    // the first condition bounds the index range; the row comparison settles ties within one instant
    const { receivedAt, deliveryId, bodySha256 } = filter.startAfter
    const time = sql<Date>`${receivedAt}::timestamptz`
    every = every
      .where('receivedAt', '>=', time)
      .where(sql<boolean>`(received_at, delivery_id, body_sha256) > (${time}, ${deliveryId}, ${bodySha256})`)
  }
  if (!filter.tradeId && !filter.externalReference) return [every]
  const namedInHistory = deliveriesAppliedToOrderQuery(db, filter)
  return [
    every.where('outcome', '<>', 'applied'),
    every.where('outcome', '=', 'applied').where('deliveryId', '=', sql<string>`any(array(${namedInHistory}))`),
  ]
}

type DeliverySource = ReturnType<typeof filteredSources>[number]

/**
 * The first `limit` rows of the sources in receipt order (received_at, then the primary key), each source read
 * in that order off its index and cut at `limit` before the two are merged: a page costs the same whatever the
 * sources hold beyond it.
 */
function inReceiptOrder<O>(
  db: Kysely<Database>,
  sources: SelectQueryBuilder<Database, 'webhookDeliveries', O>[],
  direction: 'asc' | 'desc',
  limit: number,
) {
  const ordered = <Q extends SelectQueryBuilder<Database, 'webhookDeliveries', O>>(query: Q) =>
    query.orderBy('receivedAt', direction).orderBy('deliveryId', direction).orderBy('bodySha256', direction).limit(limit)
  const [first, second] = sources.map((source) => ordered(source))
  if (!second) return first!
  const merged = db
    .selectFrom(first!.as('notApplied'))
    .selectAll()
    .unionAll(db.selectFrom(second.as('applied')).selectAll())
    .as('webhookDeliveries')
  return db
    .selectFrom(merged)
    .selectAll()
    .orderBy(sql`received_at`, direction)
    .orderBy(sql`delivery_id`, direction)
    .orderBy(sql`body_sha256`, direction)
    .limit(limit)
}

/** The search query itself (exported so a test can EXPLAIN it). */
export function searchDeliveriesQuery(
  db: Kysely<Database>,
  filter: DeliveryFilter,
  { after, limit }: { after?: DeliveryCursor | undefined; limit: number },
) {
  const pageOf = (source: DeliverySource) => {
    const query = source.select([...SUMMARY_COLUMNS, exactReceivedAt.as('cursorTime')])
    if (!after) return query
    // the first condition bounds the index range; the row comparison settles ties within one instant
    const time = sql<Date>`${after.receivedAt}::timestamptz`
    return query
      .where('receivedAt', '<=', time)
      .where(sql<boolean>`(received_at, delivery_id, body_sha256) < (${time}, ${after.deliveryId}, ${after.bodySha256})`)
  }
  return inReceiptOrder(db, filteredSources(db, filter).map(pageOf), 'desc', limit)
}

/** One page of deliveries matching the filter, newest first; `next` is set when more follow. */
export async function searchDeliveries(
  db: Kysely<Database>,
  filter: DeliveryFilter,
  { after, limit }: { after?: DeliveryCursor | undefined; limit: number },
): Promise<{ deliveries: DeliverySummary[]; next: DeliveryCursor | undefined }> {
  const rows = await searchDeliveriesQuery(db, filter, { after, limit: limit + 1 }).execute()
  const page = rows.slice(0, limit)
  const deliveries = page.map(({ cursorTime: _cursorTime, ...row }) => ({
    ...row,
    receivedAt: new Date(row.receivedAt),
    appliedAt: row.appliedAt === null ? null : new Date(row.appliedAt),
    outcome: row.outcome as DeliveryOutcome,
  }))
  const last = page.at(-1)
  return {
    deliveries,
    next:
      rows.length > limit && last
        ? { receivedAt: last.cursorTime, deliveryId: last.deliveryId, bodySha256: last.bodySha256 }
        : undefined,
  }
}

export interface OutcomeCount {
  outcome: DeliveryOutcome
  deliveries: number
  /** Of those, how many name an external reference that has an order now (re-applying can move it). */
  withOrder: number
}

/** What a bulk re-apply of this filter would touch: counts by current outcome (its dry run). */
export async function countDeliveriesByOutcome(db: Kysely<Database>, filter: DeliveryFilter): Promise<OutcomeCount[]> {
  const [first, second] = filteredSources(db, filter).map((source) => source.select(['outcome', 'externalReference']))
  const matching = second ? first!.unionAll(second) : first!
  const rows = await db
    .selectFrom(matching.as('webhookDeliveries'))
    .leftJoin('orders', 'orders.externalReference', 'webhookDeliveries.externalReference')
    .select((eb) => [
      'webhookDeliveries.outcome',
      eb.fn.countAll<string>().as('deliveries'),
      eb.fn.count<string>('orders.id').as('withOrder'),
    ])
    .groupBy('webhookDeliveries.outcome')
    .orderBy('webhookDeliveries.outcome')
    .execute()
  return rows.map((row) => ({
    outcome: row.outcome as DeliveryOutcome,
    deliveries: Number(row.deliveries),
    withOrder: Number(row.withOrder),
  }))
}

/**
 * The deliveries a bulk re-apply runs, oldest first (statuses are applied in the order received), and where the next
 * run starts when `limit` of them were found (more may follow: `filter.startAfter` of that run).
 */
export async function listDeliveriesToReapply(
  db: Kysely<Database>,
  filter: DeliveryFilter,
  limit: number,
): Promise<{ deliveries: StoredDelivery[]; next: DeliveryCursor | undefined }> {
  const sources = filteredSources(db, filter).map((source) =>
    source.select([...SUMMARY_COLUMNS, rawBodyBytes, exactReceivedAt.as('cursorTime')]),
  )
  const rows = await inReceiptOrder(db, sources, 'asc', limit).execute()
  const last = rows.at(-1)
  return {
    deliveries: rows.map(({ cursorTime: _cursorTime, ...row }) => toDelivery(row)),
    next: rows.length === limit && last ? { receivedAt: last.cursorTime, deliveryId: last.deliveryId, bodySha256: last.bodySha256 } : undefined,
  }
}

export interface DeliveriesPerMinute {
  minute: Date
  outcome: DeliveryOutcome
  deliveries: number
}

/** Deliveries received since `since`, counted per minute and outcome (a range scan of received_at). */
export async function countDeliveriesPerMinute(db: Kysely<Database>, since: Date): Promise<DeliveriesPerMinute[]> {
  const minute = sql<Date>`date_trunc('minute', received_at)`
  const rows = await db
    .selectFrom('webhookDeliveries')
    .select((eb) => [minute.as('minute'), 'outcome', eb.fn.countAll<string>().as('deliveries')])
    .where('receivedAt', '>=', since)
    .groupBy([minute, 'outcome'])
    .orderBy(minute)
    .execute()
  return rows.map((row) => ({
    minute: new Date(row.minute),
    outcome: row.outcome as DeliveryOutcome,
    deliveries: Number(row.deliveries),
  }))
}

// Retention (src/retention/prune.ts runs these in small batches). Both passes walk
// webhook_deliveries_received_idx oldest first from `from` (the caller moves it to the newest row of the
// batch before, so rows kept behind it are not read again) and pick rows by ctid: one index range scan
// and one TID scan per batch. Parked (unmatched) deliveries are never deleted by age: their order may still
// come. Their bodies are emptied like any other's: a parked delivery is applied from its stored columns, never
// from its body (parked-deliveries.ts), so keeping the body kept a copy no pass needed, for as long as the
// order never came (a trade another system opened on the platform: for good).

export interface PruneBatchOptions {
  /** Rows received before this are pruned. */
  before: Date
  /** Start of the walk: rows received earlier are not looked at (an earlier batch dealt with them). */
  from: Date | undefined
  limit: number
}

export interface PruneBatchResult {
  rows: number
  /** The newest received_at in the batch: where the next batch starts. Undefined when none. */
  through: Date | undefined
}

type Pruned = 'rows' | 'bodies'

function walkedRange(db: Kysely<Database>, { before, from }: PruneBatchOptions, what: Pruned) {
  let query = db.selectFrom('webhookDeliveries').where('receivedAt', '<', before)
  // a parked row stays; its body goes with the others'
  if (what === 'rows') query = query.where('outcome', '<>', 'unmatched')
  if (from) query = query.where('receivedAt', '>=', from)
  return query
}

function batchResult(rows: { receivedAt: Date | string }[]): PruneBatchResult {
  let through: number | undefined
  for (const row of rows) {
    const at = new Date(row.receivedAt).getTime()
    through = through === undefined ? at : Math.max(through, at)
  }
  return { rows: rows.length, through: through === undefined ? undefined : new Date(through) }
}

/**
 * The next batch's rows (their ctid), oldest first: exported so a test can EXPLAIN it (an index range
 * scan of received_at, never the whole table).
 */
export function prunableDeliveriesQuery(db: Kysely<Database>, options: PruneBatchOptions, what: Pruned) {
  let query = walkedRange(db, options, what)
  if (what === 'bodies') query = query.where('rawBody', 'is not', null)
  return query.select(sql<string>`ctid`.as('ctid')).orderBy('receivedAt').limit(options.limit)
}

/** Deletes up to `limit` delivery rows received before `before`, oldest first; parked ones stay. */
export async function deleteDeliveriesBefore(db: Kysely<Database>, options: PruneBatchOptions): Promise<PruneBatchResult> {
  const batch = prunableDeliveriesQuery(db, options, 'rows')
  const rows = await db
    .deleteFrom('webhookDeliveries')
    .where(sql<boolean>`ctid = any(array(${batch}))`)
    // checked again on the row as it is now: a parked delivery matched meanwhile is still not one to keep
    .where('outcome', '<>', 'unmatched')
    .returning('receivedAt')
    .execute()
  return batchResult(rows)
}

export interface BodyPruneBatchResult extends PruneBatchResult {
  /**
   * How many rows the batch selected. More than `rows` when a row changed between the selection and the
   * update (another session updated it meanwhile: the update skips a row whose version is not the one
   * selected), so its body is still there; fewer than `limit` only when the range was read to its end.
   */
  selected: number
}

/**
 * Empties the raw body (null) of up to `limit` deliveries received before `before`, oldest first; the
 * row, its body hash (the deduplication key), its outcome and the columns a parked one is applied from stay.
 */
export async function pruneDeliveryBodiesBefore(db: Kysely<Database>, options: PruneBatchOptions): Promise<BodyPruneBatchResult> {
  // one statement, so the count selected and the rows emptied come from the same selection
  const row = await db
    .with('batch', () => prunableDeliveriesQuery(db, options, 'bodies'))
    .with('pruned', (qb) =>
      qb
        .updateTable('webhookDeliveries')
        .set({ rawBody: null })
        .where(sql<boolean>`ctid = any(array(select ctid from batch))`)
        .returning('receivedAt'),
    )
    .selectFrom('pruned')
    .select((eb) => [
      eb.fn.countAll<string>().as('rows'),
      eb.fn.max('receivedAt').as('through'),
      sql<string>`(select count(*) from batch)`.as('selected'),
    ])
    .executeTakeFirstOrThrow()
  return {
    rows: Number(row.rows),
    through: row.through === null ? undefined : new Date(row.through),
    selected: Number(row.selected),
  }
}

/** What deleteDeliveriesBefore would delete in all (a dry run). */
export async function countDeliveriesBefore(db: Kysely<Database>, before: Date): Promise<number> {
  const row = await walkedRange(db, { before, from: undefined, limit: 0 }, 'rows')
    .select((eb) => eb.fn.countAll<string>().as('rows'))
    .executeTakeFirstOrThrow()
  return Number(row.rows)
}

/** What pruneDeliveryBodiesBefore would empty from `from` on (a dry run). */
export async function countDeliveryBodiesBefore(db: Kysely<Database>, before: Date, from: Date | undefined): Promise<number> {
  const row = await walkedRange(db, { before, from, limit: 0 }, 'bodies')
    .where('rawBody', 'is not', null)
    .select((eb) => eb.fn.countAll<string>().as('rows'))
    .executeTakeFirstOrThrow()
  return Number(row.rows)
}

/** When the oldest delivery row still stored was received (parked ones included); null when none is. */
export async function oldestDeliveryReceivedAt(db: Kysely<Database>): Promise<Date | null> {
  const row = await db
    .selectFrom('webhookDeliveries')
    .select((eb) => eb.fn.min('receivedAt').as('oldest'))
    .executeTakeFirstOrThrow()
  return row.oldest === null ? null : new Date(row.oldest)
}
