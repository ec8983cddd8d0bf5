// /healthz: the process answers. /readyz: the service finished starting (its database came up and was
// migrated), the database answers now and takes writes (not a read-only standby), the service's tables and their
// columns are all there and every migration is applied (looked at each time: a database replaced or being restored under the
// running service has none of them, and the service does not migrate it), the service is not draining (a signal
// arrived: a load balancer must stop sending it work while it finishes what it has), the embedded database's disk
// is not almost full (db/storage-guard.ts), and no delivery was refused for a full disk a moment ago
// (db/disk-full-note.ts).
import { Router } from 'express'
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'
import { DISK_FULL, type DiskFullNote } from '../db/disk-full-note.js'
import { readSchemaState, SERVICE_TABLES, type SchemaState } from '../db/migrate.js'
import { embeddedDatabaseStopReason } from '../db/pglite-thread.js'
import { type DatabaseState, pingDatabase } from '../db/ping-database.js'
import { errorBody } from './app-error.js'
import { answerGetOnly } from './get-only.js'

const READY_CHECK_TIMEOUT_MS = 2_000

export function healthRoutes({
  db,
  isReady,
  isDraining,
  storageLow,
  diskFull,
}: {
  db: Kysely<Database>
  isReady?: (() => boolean) | undefined
  isDraining?: (() => boolean) | undefined
  storageLow?: (() => boolean) | undefined
  diskFull?: DiskFullNote | undefined
}): Router {
  const router = Router()
  // One look at the database (its ping, its tables and migrations) at a time, whoever asks: a request that comes while one runs shares its answer. Each
  // /readyz used to start its own, on the public listener, and one the database did not answer kept its connection
  // past the request's timeout: while the database hung, a burst of them (several load balancers' probes, or
  // anyone) held every connection of the pool, and deliveries waited behind them.
  let looking: Promise<DatabaseState & { schema: SchemaState }> | undefined
  const look = async () => {
    const state = await pingDatabase(db)
    // at every look, not kept once current: a restore (dropdb, createdb, pg_restore) takes the tables away under a
    // running service, which answered 200 here while every delivery failed
    return { ...state, schema: await readSchemaState(db) }
  }
  const lookAtDatabase = () =>
    (looking ??= look().finally(() => {
      looking = undefined
    }))

  router.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' })
  })

  router.get('/readyz', async (_req, res) => {
    if (isDraining?.()) {
      res.status(503).json(errorBody('not_ready', 'Shutting down: finishing the work in hand, taking no more'))
      return
    }
    if (isReady && !isReady()) {
      res.status(503).json(errorBody('not_ready', 'Starting: waiting for the database to answer and be migrated'))
      return
    }
    let state: DatabaseState & { schema: SchemaState }
    try {
      state = await withTimeout(lookAtDatabase(), READY_CHECK_TIMEOUT_MS)
    } catch (error) {
      // the embedded database's thread stopped for good (a crash, a full disk): waiting will not bring it back
      const stopped = embeddedDatabaseStopReason(error)
      const message = stopped ? `The embedded database stopped (its thread ${stopped}); restart the service` : 'The database does not answer'
      res.status(503).json(errorBody('not_ready', message))
      return
    }
    const { missingTables, pendingMigrations, missingColumns } = state.schema
    if (missingTables.length > 0) {
      res.status(503).json(errorBody('not_ready', schemaMissingMessage(missingTables)))
      return
    }
    if (pendingMigrations.length > 0) {
      const [first, ...others] = pendingMigrations
      const which = others.length > 0 ? `${first} and ${others.length} more` : first
      res.status(503).json(errorBody('not_ready', `Migrations are pending (${which}); run \`npm run cli -- migrate\``))
      return
    }
    if (missingColumns.length > 0) {
      res.status(503).json(errorBody('not_ready', schemaBehindMessage(missingColumns)))
      return
    }
    if (state.readOnly) {
      const message = 'The database is read-only (a standby, a failover under way, or default_transaction_read_only): deliveries are refused until it takes writes'
      res.status(503).json(errorBody('not_ready', message))
      return
    }
    if (storageLow?.()) {
      res.status(503).json(errorBody('not_ready', 'The data directory is almost full (DATA_DIR_MIN_FREE): deliveries are refused until space is freed'))
      return
    }
    const refusedMs = diskFull?.standing()
    if (refusedMs !== undefined) {
      const message =
        `The database refused to store a delivery ${(refusedMs / 1000).toFixed(1)} s ago: its disk is full (${DISK_FULL}); ` +
        'deliveries are answered 503 until it has room'
      res.status(503).json(errorBody('not_ready', message))
      return
    }
    res.json({ status: 'ready' })
  })

  answerGetOnly(router, '/healthz')
  answerGetOnly(router, '/readyz')
  return router
}

function schemaMissingMessage(missingTables: readonly string[]): string {
  const what =
    missingTables.length === SERVICE_TABLES.length
      ? "The database has none of the service's tables"
      : `The service's tables ${missingTables.join(', ')} are missing`
  return (
    `${what}: the database was replaced or is being restored. Finish the restore, or run \`npm run cli -- migrate\` ` +
    'on a new, empty database; deliveries are answered 503 until then, and the service does not migrate it itself'
  )
}

// every migration recorded as applied, and a column of one missing all the same: `migrate` has nothing to do
function schemaBehindMessage(missingColumns: readonly string[]): string {
  const [first, ...others] = missingColumns
  const which = others.length > 0 ? `${first} and ${others.length} more` : first
  return (
    `The database's schema is behind this build: column ${which} is missing, though every migration is recorded as applied ` +
    '(restored from an older dump or in part, or changed by hand). Finish the restore, or restore the whole dump again; ' +
    'deliveries are answered 503 until then, and the service does not change the schema itself'
  )
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}
