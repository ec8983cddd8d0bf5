// Every query on the partner's orders and their status history. Row types never leave this file.
//
// A fork that keeps orders in its own tables replaces the SQL of src/orders (this module,
// poll-schedule.repository.ts and apply-observation.ts's statement) and keeps the exported functions:
// nothing outside src/orders reads or writes the orders table.
import { type Kysely, type Selectable, sql, type Transaction } from 'kysely'
import type { PartnerEnv } from '../config.js'
import type { Database, OrdersTable } from '../db/database.js'
import { writeTime, writeTimePlus } from '../db/write-time.js'
import type { ObservationResult } from './apply-observation.js'
import type { ObservationSource, Order, StatusChange, TradeCreateState } from './order.js'

type Executor = Kysely<Database> | Transaction<Database>

export class OrderExistsError extends Error {
  readonly code = 'order_exists'
  constructor(externalReference: string) {
    super(`An order with external reference ${externalReference} already exists`)
    this.name = 'OrderExistsError'
  }
}

function toOrder(row: Selectable<OrdersTable>): Order {
  return {
    id: row.id,
    externalReference: row.externalReference,
    tradeId: row.tradeId,
    tradeReference: row.tradeReference,
    tradeStatus: row.tradeStatus,
    version: row.version,
    statusSource: row.statusSource as ObservationSource | null,
    statusChangedAt: row.statusChangedAt,
    tradeCreateState: row.tradeCreateState as TradeCreateState,
    tradeCreateWaitMs: row.tradeCreateWaitMs,
    partnerEnv: row.partnerEnv as PartnerEnv | null,
    nextPollAt: row.nextPollAt,
    pollAttempts: row.pollAttempts,
    attention: row.attention,
    createdAt: row.createdAt,
    updatedAt: row.updatedAt,
  }
}

/** Inserts a new order (no trade yet); OrderExistsError when the reference is taken. */
export async function insertOrder(db: Executor, externalReference: string): Promise<void> {
  try {
    await db.insertInto('orders').values({ externalReference }).execute()
  } catch (error) {
    if ((error as { code?: string }).code === '23505') throw new OrderExistsError(externalReference)
    throw error
  }
}

export async function findOrderByExternalReference(db: Executor, externalReference: string): Promise<Order | undefined> {
  const row = await db.selectFrom('orders').selectAll().where('externalReference', '=', externalReference).executeTakeFirst()
  return row && toOrder(row)
}

/**
 * The order, its row locked until the transaction ends (the observation statement waits on the same lock): what a
 * decision on linking its trade reads, so no webhook can link another trade between the decision and the link.
 */
export async function lockOrderById(trx: Transaction<Database>, id: number): Promise<Order | undefined> {
  const row = await trx.selectFrom('orders').selectAll().where('id', '=', id).forUpdate().executeTakeFirst()
  return row && toOrder(row)
}

/** Which of these external references name an existing order (one query for a whole batch). */
/** The advisory locks of an order's creation ("ordr" in ASCII), one per external reference in its second key. */
const ORDER_REFERENCE_LOCK_CLASS = 0x6f726472

/**
 * Holds, to the end of the transaction, the lock of creating the order of `externalReference`: what createOrder
 * takes before it inserts the order, and the ingest's second look at a delivery it parked waits on (shared), so that
 * look sees the order of a creation under way once it commits (parked-deliveries.ts).
 */
export async function lockOrderReference(trx: Transaction<Database>, externalReference: string, { shared = false } = {}): Promise<void> {
  const lock = shared ? sql.raw('pg_advisory_xact_lock_shared') : sql.raw('pg_advisory_xact_lock')
  await sql`select ${lock}(${sql.lit(ORDER_REFERENCE_LOCK_CLASS)}, hashtext(${externalReference}))`.execute(trx)
}

export async function existingOrderReferences(db: Executor, externalReferences: readonly string[]): Promise<Set<string>> {
  if (externalReferences.length === 0) return new Set()
  const rows = await db
    .selectFrom('orders')
    .select('externalReference')
    .where('externalReference', 'in', [...externalReferences])
    .execute()
  return new Set(rows.map((row) => row.externalReference))
}

export async function listOrders(db: Executor, { limit = 50, offset = 0 }: { limit?: number; offset?: number } = {}): Promise<Order[]> {
  const rows = await db.selectFrom('orders').selectAll().orderBy('id', 'desc').limit(limit).offset(offset).execute()
  return rows.map(toOrder)
}

export async function orderHistory(db: Executor, orderId: number): Promise<StatusChange[]> {
  const rows = await db
    .selectFrom('orderStatusHistory')
    .select(['eventId', 'fromStatus', 'toStatus', 'source', 'deliveryId', 'recordedAt'])
    .where('orderId', '=', orderId)
    .orderBy('id')
    .execute()
  return rows.map((row) => ({ ...row, source: row.source as ObservationSource }))
}

export type { ObservationResult }

// trade creation and API scheduling (used by src/trades)

/**
 * The database's clock, to the millisecond: what a create's pending mark is stamped and judged by (startTradeCreate),
 * so two processes whose own clocks disagree judge one create alike.
 */
export const DATABASE_MARK_TIME = sql<Date>`date_trunc('milliseconds', now())`

/** The database's time now (DATABASE_MARK_TIME), in ms since the epoch: what a pending create's age is told by. */
export async function databaseNow(db: Executor): Promise<number> {
  const { rows } = await sql<{ now: Date }>`select ${DATABASE_MARK_TIME} as now`.execute(db)
  return new Date(rows[0]!.now).getTime()
}

/**
 * Marks a create as in flight, only if the order is still in `previousState` and has no trade: two
 * operators opening the same order at once cannot both send a create. Returns the mark, or undefined when it was not
 * marked.
 *
 * The time it writes (updated_at, which nothing else writes on a pending order with no trade: the poller's
 * trade_create_unknown flag leaves it) is when the create began, by the database's clock (DATABASE_MARK_TIME), never
 * the sender's: what tells a create still at the platform from one whose command stopped, judged by the same clock,
 * and the claim that command's later writes name (setTradeCreateState's `claim`). Taking over a `pending` create
 * (`--retry` of one whose command stopped) names `takeOver`: only the create marked by `markedBy` is taken, and only
 * once its whole time (its stored trade_create_wait_ms, else `wholeTimeMs`) is past by the database's clock, so of two
 * such retries only the first marks it, and a create marked since is left to its command.
 * `waitMs` is how long this command waits for the answer (trade_create_wait_ms): what another command judges the
 * create by, whatever its own timeout.
 */
export async function startTradeCreate(
  db: Executor,
  orderId: number,
  previousState: TradeCreateState,
  { takeOver, waitMs }: { takeOver?: { markedBy: Date; wholeTimeMs: number; unsent?: boolean }; waitMs: number },
): Promise<Date | undefined> {
  let query = db
    .updateTable('orders')
    // a create sent again (--retry) is the operator's answer to a trade_create_unknown flag
    .set((eb) => ({
      tradeCreateState: 'pending',
      updatedAt: DATABASE_MARK_TIME,
      // negative: marked, not sent (markTradeCreateSending makes it the whole time once the create is about to leave)
      tradeCreateWaitMs: -waitMs,
      attention: eb.case().when('attention', '=', 'trade_create_unknown').then(null).else(eb.ref('attention')).end(),
    }))
    .where('id', '=', orderId)
    .where('tradeCreateState', '=', previousState)
    .where('tradeId', 'is', null)
  if (takeOver) {
    query = query
      .where('updatedAt', '<=', takeOver.markedBy)
      .where(
        (eb) => sql<Date>`${eb.ref('updatedAt')} + abs(coalesce(${eb.ref('tradeCreateWaitMs')}, ${takeOver.wholeTimeMs}::integer)) * interval '1 millisecond'`,
        '<=',
        DATABASE_MARK_TIME,
      )
    // a create judged never sent is taken over only while it still is: its command's send stamp, had it come first,
    // would make it a create at the platform
    if (takeOver.unsent) query = query.where('tradeCreateWaitMs', '<', 0)
  }
  const marked = await query.returning('updatedAt').executeTakeFirst()
  return marked?.updatedAt
}

/**
 * Stamps a create marked by startTradeCreate as leaving now: the mark's time moved to this statement's (the
 * database's clock), and its whole time made positive (sent). Only under the command's own mark (`claim`): a create
 * another command took over meanwhile is not stamped, and must not be sent. Returns the new mark, the command's claim
 * from then on, or undefined.
 *
 * The whole time is counted from this stamp, not from the first mark: a statement that waited on a lock (up to
 * DATABASE_STATEMENT_TIMEOUT_MS) before or while marking no longer eats the create's time, and the create is sent only
 * when this statement came back within SEND_WITHIN_MS of being issued (open-trade-for-order.ts), so it leaves before
 * its stamp and that much. A mark never stamped is a create never sent: its command stopped before sending it.
 */
export async function markTradeCreateSending(db: Executor, orderId: number, claim: Date, waitMs: number): Promise<Date | undefined> {
  const stamped = await db
    .updateTable('orders')
    .set({ updatedAt: DATABASE_MARK_TIME, tradeCreateWaitMs: waitMs })
    .where('id', '=', orderId)
    .where('tradeId', 'is', null)
    .where('tradeCreateState', '=', 'pending')
    .where('updatedAt', '=', claim)
    .returning('updatedAt')
    .executeTakeFirst()
  return stamped?.updatedAt
}

/**
 * Sets the create state of an order still without a trade (one linked meanwhile, by its webhook, stays created),
 * stamped with the database's clock as startTradeCreate's mark is (an `unknown` create's time is what the poller's
 * trade_create_unknown flag counts from, by the same clock).
 * With `claim`, the mark startTradeCreate returned for this command's create: only while the order is still pending
 * under that mark, so a command whose create another took over since (judged stopped) does not overwrite the other's.
 * Returns whether it was set.
 */
export async function setTradeCreateState(
  db: Executor,
  orderId: number,
  state: TradeCreateState,
  { claim }: { claim?: Date } = {},
): Promise<boolean> {
  let query = db
    .updateTable('orders')
    // (the whole time is the pending mark's alone: cleared, an older version's later mark is judged by the judge's own)
    .set({ tradeCreateState: state, updatedAt: DATABASE_MARK_TIME, ...(state === 'pending' ? {} : { tradeCreateWaitMs: null }) })
    .where('id', '=', orderId)
    .where('tradeId', 'is', null)
  if (claim) query = query.where('tradeCreateState', '=', 'pending').where('updatedAt', '=', claim)
  const result = await query.executeTakeFirst()
  return Number(result.numUpdatedRows) === 1
}

/**
 * Flags an order whose pending create another command took over `trade_mismatch`, as the create this command sent was
 * answered with a trade nothing records: the platform may hold two trades for the order. Its `updated_at` is the other
 * command's pending mark, and is left as it is, so that command's answer is still its own to record (and links its
 * trade, flag kept: the observation and markTradeCreated keep a flagged order off the schedule).
 */
export async function flagTakenOverCreate(db: Executor, orderId: number): Promise<void> {
  await db.updateTable('orders').set({ attention: 'trade_mismatch', nextPollAt: null }).where('id', '=', orderId).where('tradeId', 'is', null).execute()
}

/**
 * After a successful create: linked, and due for a poll `pollAfterS` (EXPECTED_WEBHOOK_S) on if no webhook comes
 * first, from `now` (the command's clock) or the database's time when that is earlier (db/write-time.ts): by the clock
 * of a machine an hour ahead of the database the first poll came an hour late.
 */
export async function markTradeCreated(db: Executor, orderId: number, { pollAfterS, now }: { pollAfterS: number; now: Date }): Promise<void> {
  await db
    .updateTable('orders')
    // an order flagged for an operator stays off the schedule (a create's answer that found another command's create
    // under way flags it trade_mismatch: open-trade-for-order.ts); an unresolved create's flag is resolved by the link
    .set((eb) => ({
      tradeCreateState: 'created',
      tradeCreateWaitMs: null,
      nextPollAt: eb
        .case()
        .when(eb.or([eb('attention', 'is', null), eb('attention', '=', 'trade_create_unknown')]))
        .then(writeTimePlus(pollAfterS, now))
        .else(eb.ref('nextPollAt'))
        .end(),
      updatedAt: writeTime(now),
    }))
    .where('id', '=', orderId)
    .where('tradeId', 'is not', null)
    .where('isTerminal', '=', false)
    .execute()
}


// The operator console's queries (indexes: migrations/0003_console_indexes.ts).

export async function findOrderById(db: Executor, id: number): Promise<Order | undefined> {
  const row = await db.selectFrom('orders').selectAll().where('id', '=', id).executeTakeFirst()
  return row && toOrder(row)
}

export interface OrderFilter {
  externalReference?: string | undefined
  tradeId?: string | undefined
  status?: string | undefined
  /** Only orders flagged for an operator (any flag). */
  needsAttention?: boolean | undefined
}

/** The search query itself (exported so a test can EXPLAIN it): newest order first, keyset on id. */
/**
 * The delivery ids named by the history of the order with this trade id and external reference (either or both):
 * the deliveries applied to it, as a subquery. Every applied delivery wrote its order's transition, so the search of
 * deliveries finds the applied ones through this (migrations/0014; webhooks/delivery.repository.ts).
 */
export function deliveriesAppliedToOrderQuery(db: Executor, { tradeId, externalReference }: { tradeId?: string | undefined; externalReference?: string | undefined }) {
  let order = db.selectFrom('orders').select('id')
  if (tradeId) order = order.where('tradeId', '=', tradeId)
  if (externalReference) order = order.where('externalReference', '=', externalReference)
  return db.selectFrom('orderStatusHistory').select('deliveryId').where('orderId', '=', order).where('deliveryId', 'is not', null)
}

export function searchOrdersQuery(db: Executor, filter: OrderFilter, { beforeId, limit }: { beforeId?: number | undefined; limit: number }) {
  let query = db.selectFrom('orders').selectAll().orderBy('id', 'desc').limit(limit)
  if (filter.externalReference) query = query.where('externalReference', '=', filter.externalReference)
  if (filter.tradeId) query = query.where('tradeId', '=', filter.tradeId)
  if (filter.status) query = query.where('tradeStatus', '=', filter.status)
  if (filter.needsAttention) query = query.where('attention', 'is not', null)
  if (beforeId !== undefined) query = query.where('id', '<', beforeId)
  return query
}

/** One page of orders, newest first; `nextBeforeId` is set when more follow. */
export async function searchOrders(
  db: Executor,
  filter: OrderFilter,
  { beforeId, limit }: { beforeId?: number | undefined; limit: number },
): Promise<{ orders: Order[]; nextBeforeId: number | undefined }> {
  const rows = await searchOrdersQuery(db, filter, { beforeId, limit: limit + 1 }).execute()
  const orders = rows.slice(0, limit).map(toOrder)
  return { orders, nextBeforeId: rows.length > limit ? orders.at(-1)?.id : undefined }
}

/**
 * Orders flagged for an operator, counted by flag (trade_not_found, ...): the console's overview and the
 * orders_needing_attention gauge. One query over the partial index orders_attention_idx.
 */
export async function countOrdersNeedingAttention(db: Executor): Promise<{ attention: string; orders: number }[]> {
  const rows = await db
    .selectFrom('orders')
    .select((eb) => ['attention', eb.fn.countAll<string>().as('orders')])
    .where('attention', 'is not', null)
    .groupBy('attention')
    .orderBy('attention')
    .execute()
  return rows.map((row) => ({ attention: row.attention ?? '', orders: Number(row.orders) }))
}
