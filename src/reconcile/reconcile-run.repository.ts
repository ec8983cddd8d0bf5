// reconcile_runs: one row per poll cycle that did work (claimed an order) or was stopped, written when the
// cycle starts and completed when it ends, so a cycle that never finished (the replica died) shows as such.
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'

export interface RunCounts {
  polled: number
  changed: number
  errors: number
  stoppedReason: string | null
}

export interface ReconcileRun extends RunCounts {
  id: number
  replica: string
  startedAt: Date
  finishedAt: Date | null
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
  return rows.map((row) => ({
    id: row.id,
    replica: row.replica,
    startedAt: new Date(row.startedAt),
    finishedAt: row.finishedAt === null ? null : new Date(row.finishedAt),
    polled: row.polled,
    changed: row.changed,
    errors: row.errors,
    stoppedReason: row.stoppedReason,
  }))
}
