import { type Kysely, sql } from 'kysely'

// reaction_jobs_state_idx (0005) no longer holds done jobs. Every handled event leaves a done job, so they
// are nearly the whole table, and no query looked for them through this index: a list of done jobs walks the
// primary key backwards, where nearly every row is one. Their entries were 33 MB for 1,080,000 jobs (32 bytes a
// job), written on the reactions' hottest write, the stream's write-back: 180 done rows a statement took 1.85
// ms with them and 1.77 ms without (pgbench, medians of 6 alternating runs of 1,000 statements). The console
// and the CLI list failed, pending, running and skipped jobs through this index as before.
// The handler index stays whole: a list by handler takes every state, and for a handler with few jobs the
// primary key would be a walk through everyone else's.
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`drop index reaction_jobs_state_idx`.execute(db)
  await sql`create index reaction_jobs_state_idx on reaction_jobs (state, id) where state <> 'done'`.execute(db)
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`drop index reaction_jobs_state_idx`.execute(db)
  await sql`create index reaction_jobs_state_idx on reaction_jobs (state, id)`.execute(db)
}
