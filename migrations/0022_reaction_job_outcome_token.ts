import type { Kysely } from 'kysely'

// reaction_jobs.outcome_token: the lease token of the claim whose outcome (done, pending again after a backoff,
// failed, skipped, or given back) the row holds, written by the same fenced statement that writes the outcome and left
// alone by the next claim. An outcome's write whose commit landed but whose answer was lost (the connection cut after
// the COMMIT) was tried again, found the row no longer `running` under its token, wrote nothing, and was reported as
// a lease lost (reaction_attempts_total{result="lease_lost"}, "the job ran elsewhere"), though this very claim had
// written it. Now a try that finds the fence closed asks whether the row's outcome_token is its own token
// (src/reactions/reaction-job.repository.ts, ownOutcomes). Nullable, no default: a catalog change only, no rewrite of
// the table; not indexed (read by the primary key, and only after a fence's miss).
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('reaction_jobs').addColumn('outcome_token', 'text').execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('reaction_jobs').dropColumn('outcome_token').execute()
}
