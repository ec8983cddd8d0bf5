// Table types as Kysely sees them (camelCase; CamelCasePlugin maps to snake_case SQL in one place).
// Only repositories import these: row types never leave a *.repository.ts file.
import type { ColumnType, Generated, GeneratedAlways } from 'kysely'

type Timestamp = ColumnType<Date, Date | string, Date | string>
/** A timestamp the database fills in by default (now()) unless one is given. */
type GeneratedTimestamp = ColumnType<Date, Date | string | undefined, Date | string>

export interface OrdersTable {
  id: GeneratedAlways<number>
  externalReference: string
  tradeId: string | null
  tradeReference: string | null
  tradeStatus: string | null
  statusRank: Generated<number>
  /** Every status the order has had, in order (one is entered twice only on a poll back from an unknown status: trade-status.ts). */
  visitedStatuses: Generated<string[]>
  isTerminal: Generated<boolean>
  statusSource: string | null
  statusChangedAt: Timestamp | null
  /** none | pending | unknown | created: see src/orders/order.repository.ts */
  tradeCreateState: Generated<string>
  /** How long the command that marked the create pending waits for its answer, in ms; null outside pending (migrations/0015). */
  tradeCreateWaitMs: number | null
  /** sandbox | live: the PARTNER_ENV the order was linked to its trade under; null before the link, or linked before migrations/0018. */
  partnerEnv: string | null
  nextPollAt: Timestamp | null
  pollAttempts: Generated<number>
  pollLeaseToken: string | null
  pollLeaseExpiresAt: Timestamp | null
  lastPolledAt: Timestamp | null
  /**
   * When the poll the order waits on came due, while the poller holds it or backs it off (migrations/0020); it counts
   * only while nextPollAt is still pollRetryAt, the time the poller wrote itself. Null once a poll is answered.
   */
  pollDueSince: Timestamp | null
  pollRetryAt: Timestamp | null
  attention: string | null
  version: Generated<number>
  /** The stream position (xid8, as text) of the order's latest event (migrations/0009). */
  lastEventPosition: string | null
  createdAt: GeneratedTimestamp
  updatedAt: GeneratedTimestamp
}

export interface WebhookDeliveriesTable {
  deliveryId: string
  receivedAt: GeneratedTimestamp
  eventType: string
  tradeId: string | null
  /** A trade event's `reference` field, as parsed at ingest (migrations/0006). */
  tradeReference: string | null
  externalReference: string | null
  observedStatus: string | null
  outcome: string
  orderId: number | null
  /** null: pruned after RETENTION_DAYS (src/retention); the row and its hash stay */
  rawBody: string | null
  /** SHA-256 (hex) of the exact body: with deliveryId, the primary key. */
  bodySha256: string
  appliedAt: Timestamp | null
  /**
   * The order's version once this delivery was recorded against it (migrations/0019): what tells a copy stored since
   * the order last changed without comparing two replicas' clocks. Null: no order, or stored before that migration.
   */
  orderVersion: number | null
}

export interface OrderStatusHistoryTable {
  id: GeneratedAlways<string>
  orderId: number
  fromStatus: string | null
  toStatus: string
  source: string
  deliveryId: string | null
  recordedAt: GeneratedTimestamp
  /** The event's stable id (uuid): every reaction handler's idempotency key. */
  eventId: Generated<string>
  /** The order's version after this transition: 1, 2, 3 ... per order. */
  sequence: number | null
  tradeId: string | null
  externalReference: string | null
  /** Where the event stands in the handlers' streams (xid8, as text); null before migrations/0009. */
  streamPosition: string | null
}

/** One handler's place in the history: see src/reactions/reaction-stream.repository.ts. */
export interface ReactionStreamsTable {
  handler: string
  /** The last (position, history id) taken; xid8 as text. */
  position: string
  historyId: string
  leaseToken: string | null
  leaseExpiresAt: Timestamp | null
  /** The types the handler takes, as the replica that started last registered them (migrations/0016); null: not written. */
  types: string | null
  createdAt: GeneratedTimestamp
  updatedAt: GeneratedTimestamp
}

/** A stream batch and the events its handler took on their first attempt (migrations/0011). */
export interface ReactionStreamBatchesTable {
  id: GeneratedAlways<string>
  handler: string
  /** The stream's place after the batch; xid8 as text. */
  toPosition: string
  toHistoryId: string
  /** History ids of the events done on their first attempt. */
  done: string[]
  /** How many (done.length). */
  events: number
  finishedAt: Timestamp
}

/** One (event, handler): see src/reactions/reaction-job.repository.ts. */
export interface ReactionJobsTable {
  id: GeneratedAlways<string>
  eventId: string
  orderId: number
  sequence: number
  handler: string
  /** pending | running | done | failed | skipped */
  state: Generated<string>
  attempts: Generated<number>
  runAt: Timestamp
  leaseToken: string | null
  leaseExpiresAt: Timestamp | null
  lastError: string | null
  createdAt: GeneratedTimestamp
  updatedAt: GeneratedTimestamp
  finishedAt: Timestamp | null
  /**
   * The lease token of the claim whose outcome the row holds (migrations/0022), kept when the next claim takes the
   * row: how a write tried again after its answer was lost knows its own commit. Null: none written since 0022.
   */
  outcomeToken: string | null
}

/** How far each pruning task has come: see src/retention/retention-progress.repository.ts. */
export interface RetentionProgressTable {
  task: string
  doneThrough: Timestamp
  updatedAt: GeneratedTimestamp
}

export interface ReconcileRunsTable {
  id: GeneratedAlways<number>
  replica: string
  startedAt: Timestamp
  finishedAt: Timestamp | null
  polled: Generated<number>
  changed: Generated<number>
  errors: Generated<number>
  stoppedReason: string | null
  /** Seconds the platform's clock was ahead (negative: behind) by the 401 that stopped the run; else null. */
  clockOffsetS: number | null
}

/** Which engine a database runs on: a Postgres server, or PGlite embedded in this process. */
export type DatabaseKind = 'postgres' | 'pglite'

export interface Database {
  orders: OrdersTable
  webhookDeliveries: WebhookDeliveriesTable
  orderStatusHistory: OrderStatusHistoryTable
  reconcileRuns: ReconcileRunsTable
  reactionJobs: ReactionJobsTable
  reactionStreams: ReactionStreamsTable
  reactionStreamBatches: ReactionStreamBatchesTable
  retentionProgress: RetentionProgressTable
}
