// retention_progress: how far each pruning task has come, one row per task. The body pass records the
// received_at up to which every body it may prune is pruned, and starts there next time: without it each
// pass would re-read every row between RETENTION_DAYS and DELIVERY_RETENTION_DAYS (weeks of rows).
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'

export type RetentionTask = 'delivery_bodies'

export async function findProgress(db: Kysely<Database>, task: RetentionTask): Promise<Date | undefined> {
  const row = await db.selectFrom('retentionProgress').select('doneThrough').where('task', '=', task).executeTakeFirst()
  return row ? new Date(row.doneThrough) : undefined
}

/** Moves the task's mark forward to `through`; never back (a longer retention set later keeps the mark). */
export async function recordProgress(db: Kysely<Database>, task: RetentionTask, through: Date, now: Date): Promise<void> {
  await db
    .insertInto('retentionProgress')
    .values({ task, doneThrough: through, updatedAt: now })
    .onConflict((oc) =>
      oc.column('task').doUpdateSet((eb) => ({
        doneThrough: eb.fn('greatest', [eb.ref('retentionProgress.doneThrough'), eb.ref('excluded.doneThrough')]),
        updatedAt: eb.ref('excluded.updatedAt'),
      })),
    )
    .execute()
}
