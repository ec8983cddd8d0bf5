// Retention: what the service deletes by age, and how, so storage stays bounded over years.
//
// - raw body: emptied (null) RETENTION_DAYS after receipt; the delivery row stays, with its body hash,
//   so a retry of it is still a duplicate and `deliveries show` says the body was pruned.
// - delivery row: deleted DELIVERY_RETENTION_DAYS after receipt. From then on its id is forgotten: see
//   the README's "Retention" for why a replay that late is harmless.
// - done reaction job: deleted DELIVERY_RETENTION_DAYS after it finished (a first attempt's record, kept per
//   stream batch, with its batch).
// - reconcile run: deleted DELIVERY_RETENTION_DAYS after its cycle started (a row per replica and cycle that
//   claimed an order: about one every POLL_INTERVAL_S on a partner with open orders, a million a year each).
// - never by age: order_status_history (the outbox and the audit trail), parked (unmatched) delivery rows
//   (their bodies are emptied as above: a parked delivery is applied from its columns), and reaction jobs that are pending, running, failed or skipped.
//
// A pass runs the four tasks one after the other in batches of `batchSize` rows with a pause between
// batches, so it never holds many row locks or a long transaction and ingest keeps its latency. On
// Postgres one replica at a time prunes: a pass takes an advisory lock with a try-lock, in a transaction of
// its own on a connection outside the pool that stays open for the pass (the database handle's holdLock), and
// gives it back at the end; a replica that finds it taken skips its pass. The batches run on the pool. (The
// lock used to be a session's, taken and given back as two statements on a pinned pool connection: behind a
// pooler in transaction mode the two could land on two server sessions, and the lock stayed with the first.)
// PGlite is one process with one connection: the lock is always granted. It also has no autovacuum, so a pass
// there ends with a VACUUM (the database handle's vacuum): without it, what a pass deletes keeps its place on
// disk and DATA_DIR grows with every delivery ever received.
import { anySignal } from 'any-signal'
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { DatabaseHandle } from '../db/open-database.js'
import type { WalkedBatch } from '../db/walked-batch.js'
import { databaseClockOffsetMs } from '../db/ping-database.js'
import type { Logger } from '../logger.js'
import { countDoneJobsBefore, deleteDoneJobsBefore, deleteFirstAttemptsDoneBefore } from '../reactions/reaction-job.repository.js'
import {
  countDeliveriesBefore,
  countDeliveryBodiesBefore,
  deleteDeliveriesBefore,
  pruneDeliveryBodiesBefore,
} from '../webhooks/delivery.repository.js'
import { countRunsBefore, deleteRunsBefore } from '../reconcile/reconcile-run.repository.js'
import { findProgress, recordProgress } from './retention-progress.repository.js'

const DAY_MS = 86_400_000
/** How far this machine's clock may run ahead of the database's before a pass says so. */
const CLOCK_AHEAD_WARN_MS = 60_000

/** The advisory lock key of the pruning pass ("prun" in ASCII): one pass at a time across replicas. */
export const PRUNE_LOCK_KEY = 0x7072756e

export type PrunedKind = 'body' | 'delivery' | 'reaction_job' | 'reconcile_run'
export const PRUNED_KINDS: readonly PrunedKind[] = ['body', 'delivery', 'reaction_job', 'reconcile_run']

export interface RetentionSettings {
  /** RETENTION_DAYS: raw bodies older than this are emptied. */
  bodyDays: number
  /** DELIVERY_RETENTION_DAYS: delivery rows, done reaction jobs and reconcile runs older than this are deleted. */
  deliveryDays: number
  /** Rows per statement. */
  batchSize: number
  /** Sleep between two batches: room for ingest and for autovacuum. */
  pauseMs: number
}

export const DEFAULT_BATCH_SIZE = 1_000
export const DEFAULT_PAUSE_MS = 50

export interface PruneCounts {
  body: number
  delivery: number
  reaction_job: number
  reconcile_run: number
}

export interface PruneResult {
  /** false: another replica held the lock, nothing was done (or counted). */
  ran: boolean
  dryRun: boolean
  /** Rows pruned, or in a dry run the rows a pass would prune now. */
  counts: PruneCounts
  /** Bodies received before this are pruned; rows and done jobs before deliveriesBefore are deleted. */
  bodiesBefore: Date
  deliveriesBefore: Date
  /** The pass stopped early on shutdown (what it did is kept; the next pass goes on from there). */
  interrupted: boolean
  /**
   * The pass stopped early because the lock's connection was lost (interrupted too): another replica may have
   * taken the lock, and two passes must not run beside each other.
   */
  lockLost?: true
  /**
   * How far this machine's clock was ahead of the database's, in whole seconds, where that was past the warning's 60 s:
   * the pass counted ages by the database's clock (passNow). `prune` prints it; a pass of the service logs it.
   */
  clockAheadS?: number
}

export interface PruneDeps {
  db: Kysely<Database>
  /** The database handle's lock: one pass at a time across replicas (open-database.ts). */
  holdLock: DatabaseHandle['holdLock']
  clock: Clock
  logger?: Logger | undefined
  /** PGlite: makes the space of what the pass pruned reusable (open-database.ts); Postgres: absent, autovacuum does it. */
  vacuum?: DatabaseHandle['vacuum'] | undefined
  /** Called after every batch with the rows it pruned: the metrics counter. */
  onPruned?: ((kind: PrunedKind, rows: number) => void) | undefined
}

export function retentionCutoffs(settings: Pick<RetentionSettings, 'bodyDays' | 'deliveryDays'>, now: number) {
  return {
    bodiesBefore: new Date(now - settings.bodyDays * DAY_MS),
    deliveriesBefore: new Date(now - settings.deliveryDays * DAY_MS),
  }
}

/**
 * The time a pass counts ages from: this machine's clock, or the database's where that is behind it. Deleting
 * cannot be undone, so a replica whose clock ran ahead (a VM after a pause, a host without NTP) must not delete
 * what is not yet old by the database's reckoning; a clock behind only prunes a little later.
 */
async function passNow(deps: Pick<PruneDeps, 'db' | 'clock' | 'logger'>): Promise<{ now: number; clockAheadS?: number }> {
  const databaseAheadMs = await databaseClockOffsetMs(deps.db, deps.clock)
  const now = deps.clock.now() + Math.min(0, databaseAheadMs)
  if (-databaseAheadMs <= CLOCK_AHEAD_WARN_MS) return { now }
  const clockAheadS = Math.round(-databaseAheadMs / 1000)
  deps.logger?.warn({ aheadS: clockAheadS }, CLOCK_AHEAD_MESSAGE)
  return { now, clockAheadS }
}

export const CLOCK_AHEAD_MESSAGE =
  "retention: this machine's clock is ahead of the database's; the pass counts ages by the database's clock (check this machine's clock: NTP)"

/**
 * One pruning pass. In a dry run it only counts what a pass would prune now (no lock, no change).
 * `signal` stops it between batches.
 */
export async function runPrunePass(
  deps: PruneDeps,
  settings: RetentionSettings,
  { dryRun = false, signal }: { dryRun?: boolean; signal?: AbortSignal } = {},
): Promise<PruneResult> {
  if (!Number.isInteger(settings.batchSize) || settings.batchSize < 1) {
    throw new RangeError(`retention batch size must be a positive integer, not ${settings.batchSize}`)
  }
  const { now, clockAheadS } = await passNow(deps)
  const cutoffs = { ...retentionCutoffs(settings, now), ...(clockAheadS === undefined ? {} : { clockAheadS }) }
  const notRun = { ran: false, dryRun, counts: { body: 0, delivery: 0, reaction_job: 0, reconcile_run: 0 }, ...cutoffs, interrupted: false }
  if (dryRun) {
    // a dry run changes nothing, but says whether another replica holds the lock now (a pass stuck behind
    // a lock or a long transaction holds it for as long): it tries the lock and gives it back at once
    const probe = await deps.holdLock(PRUNE_LOCK_KEY)
    if (!probe) return notRun
    await probe()
    const bodyMark = await findProgress(deps.db, 'delivery_bodies')
    const [delivery, body, reactionJob, reconcileRun] = await Promise.all([
      countDeliveriesBefore(deps.db, cutoffs.deliveriesBefore),
      countDeliveryBodiesBefore(deps.db, cutoffs.bodiesBefore, latest(bodyMark, cutoffs.deliveriesBefore)),
      countDoneJobsBefore(deps.db, cutoffs.deliveriesBefore),
      countRunsBefore(deps.db, cutoffs.deliveriesBefore),
    ])
    const counts = { body, delivery, reaction_job: reactionJob, reconcile_run: reconcileRun }
    return { ran: true, dryRun, counts, ...cutoffs, interrupted: false }
  }
  // one replica at a time: the lock is held in a transaction of its own for the pass, and the batches run on
  // the pool, each its own short transaction
  // a lock lost with its connection (a backend a DBA's script terminated, a network cut) stops the pass after the
  // batch in flight, as a shutdown does: it went on, and a second replica's pass ran beside it
  const lockLost = new AbortController()
  const release = await deps.holdLock(PRUNE_LOCK_KEY, () => {
    deps.logger?.warn('retention: the lock was lost with its connection; the pass stops after the batch in flight')
    lockLost.abort()
  })
  if (!release) {
    deps.logger?.debug('retention: another replica is pruning; this pass is skipped')
    return notRun
  }
  const stop = anySignal([signal, lockLost.signal])
  try {
    const result = await prune(deps, deps.db, settings, cutoffs, new Date(now), stop)
    if (lockLost.signal.aborted) return { ...result, interrupted: true, lockLost: true }
    if (!result.interrupted) await deps.vacuum?.()
    return result
  } finally {
    stop.clear()
    await release()
  }
}

async function prune(
  deps: PruneDeps,
  db: Kysely<Database>,
  settings: RetentionSettings,
  cutoffs: ReturnType<typeof retentionCutoffs> & Pick<PruneResult, 'clockAheadS'>,
  now: Date,
  signal: AbortSignal | undefined,
): Promise<PruneResult> {
  const { clock } = deps
  const counts: PruneCounts = { body: 0, delivery: 0, reaction_job: 0, reconcile_run: 0 }
  const limit = settings.batchSize
  const stopped = () => signal?.aborted === true
  const pause = async () => {
    if (settings.pauseMs > 0 && !stopped()) await clock.sleep(settings.pauseMs, signal).catch(() => {})
  }
  const count = (kind: PrunedKind, rows: number) => {
    counts[kind] += rows
    if (rows > 0) {
      deps.onPruned?.(kind, rows)
      deps.logger?.debug({ kind, rows, pruned: counts }, 'retention: batch pruned')
    }
  }
  // runs one task's batches until a batch says it is the last, pausing between them; false: the pass was stopped
  const walk = async (kind: PrunedKind, batch: () => Promise<{ rows: number; last: boolean }>): Promise<boolean> => {
    for (;;) {
      if (stopped()) return false
      const { rows, last } = await batch()
      count(kind, rows)
      if (last) return true
      await pause()
    }
  }

  // delivery rows first: their bodies need no emptying
  let from: Date | undefined
  const deliveries = async () => {
    const batch = await deleteDeliveriesBefore(db, { before: cutoffs.deliveriesBefore, from, limit })
    from = batch.through
    return { rows: batch.rows, last: batch.rows < limit }
  }
  if (!(await walk('delivery', deliveries))) return done(true)

  const mark = await findProgress(db, 'delivery_bodies')
  from = latest(mark, cutoffs.deliveriesBefore)
  let through: Date = from
  try {
    for (;;) {
      if (stopped()) return done(true)
      const batch = await pruneDeliveryBodiesBefore(db, { before: cutoffs.bodiesBefore, from, limit })
      count('body', batch.rows)
      // a row that changed between the batch's selection and its update (a delivery re-applied meanwhile)
      // kept its body: the mark stays where the batch began, and the next batch (or pass) reads it again.
      // Before, a batch short for this reason was taken for the end of the range, and the mark jumped to
      // the cutoff over every body after it, which then stayed until its row was deleted.
      const skipped = batch.rows < batch.selected
      if (batch.selected < limit) {
        // the range is read to its end
        if (!skipped) through = cutoffs.bodiesBefore
        break
      }
      // every body it may prune received before the batch's newest row is pruned now
      if (!skipped) through = from = batch.through ?? from
      await pause()
    }
  } finally {
    if (through) await recordProgress(db, 'delivery_bodies', through, new Date(clock.now()))
  }

  // the three walks along a primary key: each batch starts after the last row the one before it looked at
  const before = cutoffs.deliveriesBefore
  const ends = (batch: WalkedBatch<unknown>) => walkEnds(batch, { limit, before, now })
  let jobsAfter: string | undefined
  const doneJobs = async () => {
    const batch = await deleteDoneJobsBefore(db, { before, afterId: jobsAfter, limit })
    jobsAfter = batch.lastId
    return { rows: batch.deleted, last: ends(batch) }
  }
  // the first attempts that succeeded, recorded per stream batch: counted as the jobs they stand for
  let batchesAfter: string | undefined
  const firstAttemptsDone = async () => {
    const batch = await deleteFirstAttemptsDoneBefore(db, { before, afterId: batchesAfter, limit })
    batchesAfter = batch.lastId
    return { rows: batch.events, last: ends(batch) }
  }
  let runsAfter: number | undefined
  const runs = async () => {
    const batch = await deleteRunsBefore(db, { before, afterId: runsAfter, limit })
    runsAfter = batch.lastId
    return { rows: batch.deleted, last: ends(batch) }
  }
  if (!(await walk('reaction_job', doneJobs))) return done(true)
  if (!(await walk('reaction_job', firstAttemptsDone))) return done(true)
  if (!(await walk('reconcile_run', runs))) return done(true)
  return done(false)

  function done(interrupted: boolean): PruneResult {
    if (counts.body + counts.delivery + counts.reaction_job + counts.reconcile_run > 0 || interrupted) {
      deps.logger?.info({ pruned: counts, interrupted }, 'retention: pass finished')
    }
    return { ran: true, dryRun: false, counts, ...cutoffs, interrupted }
  }
}

/**
 * Whether a walk along a table's primary key is over after `batch`: at the table's end, or at a row stamped
 * between the cutoff and now. Rows are written in id order as time goes, so the rows after a young one are young
 * too, and a pass with nothing to delete reads one page. A row stamped after now was written by a replica whose
 * clock ran ahead (a VM after a pause): it tells nothing of the rows after it, and the walk goes on past it. Ended
 * at the first young row, 1,000 such rows at the head of a table (a clock a year ahead for a while) stopped every
 * pass there, and the older rows behind them were never deleted.
 */
function walkEnds(batch: WalkedBatch<unknown>, { limit, before, now }: { limit: number; before: Date; now: Date }): boolean {
  if (batch.scanned < limit || batch.lastAt === undefined) return true
  const at = batch.lastAt.getTime()
  return at >= before.getTime() && at <= now.getTime()
}

function latest(a: Date | undefined, b: Date): Date {
  return a && a.getTime() > b.getTime() ? a : b
}

export interface Pruner {
  /** Starts the loop: a first pass after `firstDelayMs`, then one every `intervalMs`. */
  start(): void
  /** Stops between two batches and waits for the pass in flight. */
  stop(): Promise<void>
  /** Runs one pass now (unless one is running, which it waits for instead). */
  runOnce(): Promise<PruneResult>
  /** The last finished pass, for the metrics. */
  readonly lastPass: PruneResult | undefined
}

export interface PrunerDeps extends PruneDeps {
  settings: RetentionSettings & { intervalMs: number; firstDelayMs: number }
  /** Called after every pass that held the lock and was not cut short: the metrics' last-pass time. */
  onPass?: ((result: PruneResult, finishedAt: Date) => void) | undefined
}

/** The pruner's settings from the RETENTION_* and PRUNE_* variables. */
export function prunerSettings(retention: {
  bodyDays: number
  deliveryDays: number
  intervalS: number
  batchSize: number
}): PrunerDeps['settings'] {
  const intervalMs = retention.intervalS * 1000
  return {
    bodyDays: retention.bodyDays,
    deliveryDays: retention.deliveryDays,
    batchSize: retention.batchSize,
    pauseMs: DEFAULT_PAUSE_MS,
    intervalMs,
    // soon after start-up (a replica restarted more often than the interval still prunes), not at once
    firstDelayMs: Math.min(intervalMs, 60_000),
  }
}

export function createPruner(deps: PrunerDeps): Pruner {
  const { clock, logger, settings } = deps
  const controller = new AbortController()
  let loop: Promise<void> | undefined
  let running: Promise<PruneResult> | undefined
  let lastPass: PruneResult | undefined

  const runOnce = () => {
    running ??= runPrunePass(deps, settings, { signal: controller.signal })
      .then((result) => {
        if (result.ran) {
          lastPass = result
          // a pass cut short (a shutdown, a lost lock) is no finished pass: counted as one, a DBA's job that ended the
          // lock's session every few minutes kept the bodies from ever being pruned and PartnerEscrowPruningStalled quiet
          if (!result.interrupted) deps.onPass?.(result, new Date(clock.now()))
        }
        return result
      })
      .finally(() => {
        running = undefined
      })
    return running
  }

  const runLoop = async () => {
    let wait = settings.firstDelayMs
    while (!controller.signal.aborted) {
      try {
        await clock.sleep(wait, controller.signal)
      } catch {
        return
      }
      wait = settings.intervalMs
      try {
        await runOnce()
      } catch (error) {
        // the database is away or a statement failed: the next pass tries again
        if (!controller.signal.aborted) logger?.warn({ err: error }, 'retention: pass failed')
      }
    }
  }

  return {
    start() {
      loop ??= runLoop()
    },
    async stop() {
      controller.abort()
      await loop
      await running?.catch(() => {})
    },
    runOnce,
    get lastPass() {
      return lastPass
    },
  }
}
