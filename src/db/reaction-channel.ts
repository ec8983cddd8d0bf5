// The NOTIFY channel that wakes the dispatchers of one service: `reaction_jobs` in the public schema, and one
// of the schema's own elsewhere, so that services sharing a database in schemas of their own (and test files
// running side by side) do not wake each other's dispatchers and do not count each other's listeners as
// replicas. Each session computes it from its own schema; a channel name holds at most 63 bytes, so another
// schema's is named by a hash of it.
import { type Kysely, sql } from 'kysely'
import type { Database } from './database.js'

/** The channel, as an SQL expression of the session's schema: for the statements that notify. */
export const reactionChannelSql = sql<string>`(case current_schema() when 'public' then 'reaction_jobs' else 'reaction_jobs_' || left(md5(current_schema()), 16) end)`

/** The channel of the schema `db` works in: for the listener. */
export async function reactionChannel(db: Kysely<Database>): Promise<string> {
  const { rows } = await sql<{ channel: string }>`select ${reactionChannelSql} as channel`.execute(db)
  return rows[0]!.channel
}
