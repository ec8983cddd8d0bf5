// What a background loop (the poller, the reaction dispatcher) does once one of its statements met the service's schema
// not whole (schema_missing: a table or a column missing, database-errors.ts): it starts nothing more until the schema
// is whole again, looking at the catalog (readSchemaState) before each round instead of running its work. A statement
// that fails only after the work ran (a reaction's outcome written to a table restored from an older dump) had made
// the work run again at every round: a stream's batch was forwarded again at each retry of its write-back, and the
// job loop ran every due job, recording none. The service still never changes the schema itself.
import type { Kysely } from 'kysely'
import type { Database } from './database.js'
import { isSchemaMissing } from './database-errors.js'
import { readSchemaState, schemaIsWhole } from './migrate.js'

export interface SchemaWatch {
  /** Whether `error` is schema_missing: then whole() holds the loops until the schema is whole again. */
  met(error: unknown): boolean
  /**
   * True when no statement met the schema missing, or it is whole again now (read from the catalog); false while it is
   * not, or while the catalog cannot be read.
   */
  whole(): Promise<boolean>
}

export function createSchemaWatch(db: Kysely<Database>): SchemaWatch {
  let held = false
  // one look at a time, whichever loop asks
  let looking: Promise<boolean> | undefined
  const look = async () => {
    try {
      if (schemaIsWhole(await readSchemaState(db))) held = false
    } catch {
      // the database away: looked at again at the loop's next round
    }
    return !held
  }
  return {
    met(error) {
      if (!isSchemaMissing(error)) return false
      held = true
      return true
    },
    async whole() {
      if (!held) return true
      return (looking ??= look().finally(() => {
        looking = undefined
      }))
    },
  }
}
