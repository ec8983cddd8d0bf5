// Waiting on reactions in tests that run the service: how many are not done yet.
import type { Kysely } from 'kysely'
import type { Database } from '../../src/db/database.js'
import { reactionStreamBacklog } from '../../src/reactions/reaction-stream.repository.js'

/**
 * Reaction jobs in any state but done (pending, running, failed, skipped), and the events committed that a
 * handler's stream has not taken yet.
 */
export async function unfinishedReactionJobs(db: Kysely<Database>): Promise<number> {
  const row = await db
    .selectFrom('reactionJobs')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .where('state', '<>', 'done')
    .executeTakeFirstOrThrow()
  return Number(row.n) + (await reactionStreamBacklog(db)).events
}
