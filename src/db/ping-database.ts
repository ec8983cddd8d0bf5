import { type Kysely, sql } from 'kysely'
import type { Database } from './database.js'

/** What a trivial query learns of the database. */
export interface DatabaseState {
  /**
   * Its transactions are read-only: a hot standby (a failover under way, or a URL that reaches a replica), or
   * default_transaction_read_only set (some hosted Postgres services set it when their disk fills). Every
   * write fails with 25006 until that ends; the service answers webhooks 503 meanwhile.
   */
  readOnly: boolean
}

/** Resolves when the database answers a trivial query; rejects with the driver's error when it does not. */
export async function pingDatabase(db: Kysely<Database>): Promise<DatabaseState> {
  const { rows } = await sql<{ readOnly: string }>`select current_setting('transaction_read_only') as read_only`.execute(db)
  return { readOnly: rows[0]?.readOnly === 'on' }
}
