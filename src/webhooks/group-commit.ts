// Group commit of trade-event deliveries.
//
// Written one by one, every delivery costs a statement, a round trip, a wake-up of a Postgres backend
// and a WAL flush, and under a burst those per-statement costs are the limit. Here a delivery waits
// only while `maxInFlight` statements are already running; the next statement takes every delivery
// that queued meanwhile (up to `maxBatch`) and writes them together: one statement, one commit. Each
// delivery is answered only after the statement holding it committed. One delivery at a time is
// written at once, alone: grouping adds no wait when there is nothing to group.
//
// A batch never holds two deliveries for one order, nor one delivery id twice, nor an order or a
// delivery id that a statement in flight holds: one statement cannot update a row twice, this way
// the statements of one process never queue on each other's row locks, and a delivery id reused with
// another body is written after the first, so its statement sees it and reports the reuse. What is held back goes in the
// next batch, in arrival order, so one order's deliveries are written in the order they arrived (or is rejected
// with the statement it waited for, when the database was not there for that one: below).
//
// What a batch's statement does is the `write` function it is given (parked-deliveries.ts's
// ingestDeliveries in the service): this class only groups, orders and retries.
//
// If a batch fails for a reason other than the database being away (a deadlock with another replica, a
// unique key another statement took meanwhile, or a delivery whose data the database refuses: one refused
// value fails the whole statement), its deliveries are written again one by one, a lone one once more (and up to
// 5 times while each write meets another statement on a key), so
// one bad delivery cannot fail its neighbours; the bad one alone is rejected with the database's error,
// which receive-webhook.ts classifies.
//
// If a statement fails because the database is away, its deliveries are rejected with that error (503: the
// sender retries), and so, at once, are the deliveries held back behind it: those for one of its orders or with
// one of its delivery ids, and the later deliveries of their orders. Each would otherwise wait for a statement of
// its own and that statement's timeout: on a database gone silent (a path that drops packets, so a connection
// hangs for the pool's 5-s connect timeout instead of being refused), 10 deliveries for one order sent 50 ms apart
// were answered 503 at 15, 20, 25 … 60 s, and 200 over 20 orders at a median of 30 s, the slowest at 40 s, where
// the README promises a 503 within DATABASE_STATEMENT_TIMEOUT_MS and a second. Arrival order holds: the earlier
// delivery of such an order is sent again, and a later one written now would overtake it. Deliveries for other
// orders keep their turn.
import { describeDatabaseError, errorCode, IngestOverloadedError, isDatabaseUnavailable, isSchemaMissing } from '../db/database-errors.js'
import type { DeliveryObservation } from '../orders/apply-observation.js'
import type { WriteResult } from './parked-deliveries.js'

export interface GroupCommitOptions {
  /** Most deliveries in one statement; 1 writes each delivery alone. */
  maxBatch: number
  /** Statements running at once (database connections the ingest may hold). */
  maxInFlight: number
  /** Deliveries allowed to wait; beyond this a delivery is refused at once (the sender retries). */
  maxQueued: number
  /** Called with the size of every statement written, for metrics. */
  onBatch?: (size: number) => void
}

export type { WriteResult }

/** Records one delivery and applies its observation (what receive-webhook.ts is given). */
export interface DeliveryWriter {
  write(item: DeliveryObservation): Promise<WriteResult>
}

// a statement's JSON parameter stays a few MB even when large bodies arrive together
const MAX_BATCH_BODY_LENGTH = 4 * 1024 * 1024

interface Pending {
  item: DeliveryObservation
  resolve: (result: WriteResult) => void
  reject: (error: unknown) => void
}

/** How many times a lone delivery is written while each write meets another statement on a key (racedAnother). */
const MAX_LONE_ATTEMPTS = 5

/** A unique key another statement took (23505), or a deadlock or serialization failure: gone on a later snapshot. */
function racedAnother(error: unknown): boolean {
  return errorCode(error) === '23505' || describeDatabaseError(error).kind === 'conflict'
}

export class GroupCommit implements DeliveryWriter {
  private queue: Pending[] = []
  private inFlight = 0
  private scheduled = false
  // orders and delivery ids held by a statement in flight
  private readonly busyOrders = new Set<string>()
  private readonly busyDeliveries = new Set<string>()

  constructor(
    /** Writes one batch in one statement; answers a result per item, in order. */
    private readonly writeItems: (items: readonly DeliveryObservation[]) => Promise<WriteResult[]>,
    private readonly options: GroupCommitOptions,
  ) {}

  /** Records the delivery and applies its observation; settles once its statement committed. */
  write(item: DeliveryObservation): Promise<WriteResult> {
    if (this.queue.length >= this.options.maxQueued) {
      return Promise.reject(new IngestOverloadedError(`${this.queue.length} deliveries are already waiting to be stored`))
    }
    return new Promise<WriteResult>((resolve, reject) => {
      this.queue.push({ item, resolve, reject })
      this.schedule()
    })
  }

  // setImmediate: every request whose body finished in this turn of the event loop joins the batch
  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.options.maxInFlight || this.queue.length === 0) return
    this.scheduled = true
    setImmediate(() => {
      this.scheduled = false
      this.flush()
    })
  }

  private flush(): void {
    while (this.inFlight < this.options.maxInFlight && this.queue.length > 0) {
      const batch = this.takeBatch()
      if (batch.length === 0) return // everything waiting is held by statements in flight
      this.inFlight++
      void this.run(batch).finally(() => {
        this.inFlight--
        for (const { item } of batch) {
          this.busyOrders.delete(item.observation.target.externalReference)
          this.busyDeliveries.delete(item.delivery.deliveryId)
        }
        this.schedule()
      })
    }
  }

  private takeBatch(): Pending[] {
    const batch: Pending[] = []
    const rest: Pending[] = []
    // an order with a delivery held back keeps its later deliveries back too (arrival order)
    const heldOrders = new Set<string>()
    let bodyLength = 0
    for (const pending of this.queue) {
      const order = pending.item.observation.target.externalReference
      const deliveryId = pending.item.delivery.deliveryId
      const free = !this.busyOrders.has(order) && !heldOrders.has(order) && !this.busyDeliveries.has(deliveryId)
      const room = batch.length < this.options.maxBatch && (batch.length === 0 || bodyLength < MAX_BATCH_BODY_LENGTH)
      if (room && free) {
        this.busyOrders.add(order)
        this.busyDeliveries.add(deliveryId)
        bodyLength += pending.item.delivery.rawBody.length
        batch.push(pending)
      } else {
        heldOrders.add(order)
        rest.push(pending)
      }
    }
    this.queue = rest
    return batch
  }

  private async run(batch: Pending[]): Promise<void> {
    try {
      await this.writeBatch(batch)
    } catch (error) {
      // tables missing (a restore under way) fail each one alone as well: not written again one by one
      if (isDatabaseUnavailable(error) || isSchemaMissing(error)) {
        for (const pending of batch) pending.reject(error)
        this.rejectHeldBack(batch, error)
        return
      }
      // a batch of one too: on a fresh snapshot it sees what another statement committed while it ran (a trade
      // that statement linked to another order is a trade_mismatch; its link broke orders_trade_id_key, 23505,
      // which read as the delivery's own refused data and was stored as invalid, its trade and status dropped)
      for (const pending of batch) {
        for (let attempt = 1; ; attempt++) {
          try {
            await this.writeBatch([pending])
            break
          } catch (alone) {
            // a third statement, not committed when this one read, took the key too: the next snapshot has it
            // (one lone write met it 5 times in 1,560 deliveries raced six to a trade, and stored them invalid)
            if (attempt < MAX_LONE_ATTEMPTS && racedAnother(alone)) continue
            pending.reject(alone)
            if (isDatabaseUnavailable(alone) || isSchemaMissing(alone)) this.rejectHeldBack([pending], alone)
            break
          }
        }
      }
    }
  }

  /**
   * Rejects with `error` the waiting deliveries held back behind `failed` (a statement the database was not there
   * for): each for one of its orders or with one of its delivery ids, and after one, every later delivery of its
   * order. Called before the statement's orders and ids are released, so none of them has been taken meanwhile.
   */
  private rejectHeldBack(failed: readonly Pending[], error: unknown): void {
    const orders = new Set(failed.map(({ item }) => item.observation.target.externalReference))
    const deliveryIds = new Set(failed.map(({ item }) => item.delivery.deliveryId))
    const rejected: Pending[] = []
    const rest: Pending[] = []
    // in arrival order, so an order joins `orders` before its later deliveries are looked at
    for (const pending of this.queue) {
      const order = pending.item.observation.target.externalReference
      if (orders.has(order) || deliveryIds.has(pending.item.delivery.deliveryId)) {
        orders.add(order)
        rejected.push(pending)
      } else {
        rest.push(pending)
      }
    }
    this.queue = rest
    for (const pending of rejected) pending.reject(error)
  }

  private async writeBatch(batch: Pending[]): Promise<void> {
    this.options.onBatch?.(batch.length)
    const results = await this.writeItems(batch.map((pending) => pending.item))
    batch.forEach((pending, index) => pending.resolve(results[index]!))
  }
}
