// A database for a run of the compiled CLI as its own process, seeded first: embedded PGlite in a migrated DATA_DIR,
// or a Postgres test database through DATABASE_URL. Embedded PGlite is one process's at a time, so the reader opens
// it only for its query, while no child runs.
import type { Kysely } from 'kysely'
import type { Database } from '../../src/db/database.js'
import { openDatabase } from '../../src/db/open-database.js'
import { embeddedRanBefore, receiverEnv } from './cli-process.js'
import { migratedDataDir } from './data-dir-template.js'
import { createTestDatabase, postgresUrl } from './test-database.js'

/**
 * Whether this run leaves out a process suite's cases on `kind`: on Postgres without TEST_DATABASE_URL, on embedded
 * PGlite where an earlier run ran them (cli-process.ts, embeddedRanBefore).
 */
export function casesLeftOut(kind: 'pglite' | 'postgres'): boolean {
  return kind === 'postgres' ? !postgresUrl : embeddedRanBefore
}

export type Reader = <T>(query: (db: Kysely<Database>) => Promise<T>) => Promise<T>

/** The environment of a CLI run on the seeded database (the receiver's, plus `env`), and a reader of that database. */
export async function seededCliDatabase(
  kind: 'pglite' | 'postgres',
  { prefix, env: extra, seed, cleanups }: {
    prefix: string
    env: Record<string, string>
    seed: (db: Kysely<Database>) => Promise<unknown>
    /** Where the Postgres database's close goes, for the file's afterAll. */
    cleanups: (() => Promise<void>)[]
  },
): Promise<{ env: Record<string, string>; read: Reader }> {
  const dataDir = migratedDataDir(prefix)
  const env = { ...receiverEnv(dataDir), ...extra }
  if (kind === 'pglite') {
    const read: Reader = async (query) => {
      const database = openDatabase({ dataDir })
      try {
        return await query(database.db)
      } finally {
        await database.close()
      }
    }
    await read(seed)
    return { env, read }
  }
  const database = await createTestDatabase({ kind: 'postgres' })
  cleanups.push(() => database.close())
  await seed(database.db)
  return { env: { ...env, DATABASE_URL: database.url! }, read: (query) => query(database.db) }
}
