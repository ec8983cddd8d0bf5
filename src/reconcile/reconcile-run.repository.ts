// reconcile_runs: one row per poll cycle that did work (claimed an order) or was stopped, written when the
// cycle starts and completed when it ends, so a cycle that never finished (the replica died) shows as such.
// Its counts are written with its end: a row without one has none to show, and one past the longest a cycle can
// run (longestCycleMs, poller.ts) will not get its end: its process stopped (killed, its host lost) or lost the
// database (a replica that lives on records the end once the database answers again).
// Retention deletes a run DELIVERY_RETENTION_DAYS after it started (src/retention/prune.ts).
import { type Kysely, type Selectable, sql } from 'kysely'
import type { Database, ReconcileRunsTable } from '../db/database.js'
import { type WalkedBatch, walkedBatch, type WalkedBatchRow } from '../db/walked-batch.js'

export interface RunCounts {
  polled: number
  changed: number
  errors: number
  stoppedReason: string | null
  /**
   * Stopped by a 401 whose Date header showed the platform's clock this many seconds ahead of ours (negative:
   * behind), past CLOCK_OFFSET_THRESHOLD_S: the likely reason it was refused. Null otherwise.
   */
  clockOffsetS: number | null
}

export interface ReconcileRun extends RunCounts {
  id: number
  replica: string
  startedAt: Date
  finishedAt: Date | null
}

/**
 * finished: its end is recorded; running: not yet, within the longest a cycle can run; unfinished: no end past that,
 * and none to come but a lost database's, recorded late.
 */
export type RunState = 'finished' | 'running' | 'unfinished'

/** A run as the report and the console show it: its counts null while it has no end (they are written with it). */
export interface ReportedRun extends Omit<ReconcileRun, 'polled' | 'changed' | 'errors'> {
  state: RunState
  polled: number | null
  changed: number | null
  errors: number | null
}

/** The run as shown at `now`, the database's time (listReportedRuns): a run with no end is judged by how long ago it started. */
export function reportedRun(run: ReconcileRun, now: Date, longestCycleMs: number): ReportedRun {
  if (run.finishedAt !== null) return { ...run, state: 'finished' }
  const state = now.getTime() - run.startedAt.getTime() > longestCycleMs ? 'unfinished' : 'running'
  return { ...run, state, polled: null, changed: null, errors: null }
}

export async function startRun(
  db: Kysely<Database>,
  { replica, startedAt }: { replica: string; startedAt: Date },
): Promise<number> {
  const row = await db
    .insertInto('reconcileRuns')
    .values({ replica, startedAt })
    .returning('id')
    .executeTakeFirstOrThrow()
  return row.id
}

export async function finishRun(
  db: Kysely<Database>,
  runId: number,
  { finishedAt, ...counts }: RunCounts & { finishedAt: Date },
): Promise<void> {
  await db
    .updateTable('reconcileRuns')
    .set({ finishedAt, ...counts })
    .where('id', '=', runId)
    .execute()
}

/** The latest runs, newest first. */
export async function listRuns(db: Kysely<Database>, limit: number): Promise<ReconcileRun[]> {
  const rows = await db.selectFrom('reconcileRuns').selectAll().orderBy('id', 'desc').limit(limit).execute()
  return rows.map(toRun)
}

/**
 * The latest runs, newest first, as `reconcile --report` and the console show them: a run with no end is `running` or
 * `unfinished` by how long ago it started by the database's time, read in the same statement. Its start was written by
 * its replica's clock, within 30 s of the database's (db/clock-guard.ts); judged by the reader's own clock, a CLI on a
 * machine 10 minutes ahead called a cycle under way `unfinished` (its process stopped), and one 10 minutes behind
 * called a killed run `running` for 10 minutes more.
 */
export async function listReportedRuns(db: Kysely<Database>, { limit, longestCycleMs }: { limit: number; longestCycleMs: number }): Promise<ReportedRun[]> {
  const rows = await db
    .selectFrom('reconcileRuns')
    .selectAll()
    .select(sql<Date>`statement_timestamp()`.as('readAt'))
    .orderBy('id', 'desc')
    .limit(limit)
    .execute()
  return rows.map((row) => reportedRun(toRun(row), new Date(row.readAt), longestCycleMs))
}

function toRun(row: Selectable<ReconcileRunsTable>): ReconcileRun {
  return {
    id: row.id,
    replica: row.replica,
    startedAt: new Date(row.startedAt),
    finishedAt: row.finishedAt === null ? null : new Date(row.finishedAt),
    polled: row.polled,
    changed: row.changed,
    errors: row.errors,
    stoppedReason: row.stoppedReason,
    clockOffsetS: row.clockOffsetS,
  }
}

/**
 * Looks at the next `limit` runs by id after `afterId` and deletes those started before `before`; returns how
 * many it deleted, the last id it looked at (where the next batch starts) and when that run started. Runs are
 * written in id order as their cycles start, so the walk can end at a run started lately (retention's
 * `walkEnds`, src/retention/prune.ts): a pass with nothing to delete reads one page of the primary key.
 */
export async function deleteRunsBefore(
  db: Kysely<Database>,
  { before, afterId, limit }: { before: Date; afterId: number | undefined; limit: number },
): Promise<WalkedBatch<number> & { deleted: number }> {
  const { rows } = await sql<WalkedBatchRow<number> & { deleted: string }>`
    with scanned as (
      select id, started_at from reconcile_runs where id > ${afterId ?? 0} order by id limit ${limit}
    ), deleted as (
      delete from reconcile_runs r using scanned s
      where r.id = s.id and s.started_at < ${before}
      returning r.id
    )
    select (select count(*) from scanned) as scanned,
      (select id from scanned order by id desc limit 1) as last_id,
      (select started_at from scanned order by id desc limit 1) as last_at,
      (select count(*) from deleted) as deleted`.execute(db)
  return { ...walkedBatch(rows[0]!), deleted: Number(rows[0]!.deleted) }
}

/** What deleteRunsBefore would delete in all (a dry run). */
export async function countRunsBefore(db: Kysely<Database>, before: Date): Promise<number> {
  const row = await db
    .selectFrom('reconcileRuns')
    .select((eb) => eb.fn.countAll<string>().as('runs'))
    .where('startedAt', '<', before)
    .executeTakeFirstOrThrow()
  return Number(row.runs)
}
