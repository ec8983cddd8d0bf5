// Start-up against a database that may not be there yet (Postgres still starting, a failover under
// way, the network not up): migrate, and while the database is unavailable try again with capped,
// jittered backoff, one JSON log line per attempt. Anything else (a failed migration, a refused
// password, a database that does not exist) is thrown: retrying cannot fix it.
import type { Clock } from '../clock.js'
import type { Logger } from '../logger.js'
import { backoffDelayS, type BackoffSettings } from '../reconcile/backoff-delay.js'
import { describeDatabaseError } from './database-errors.js'
import type { DatabaseHandle } from './open-database.js'
import { type MigrationReport, migrateToLatest } from './migrate.js'

export const START_UP_BACKOFF: BackoffSettings = { baseS: 0.5, capS: 10 }

export async function prepareDatabase({
  database,
  logger,
  clock,
  signal,
  backoff = START_UP_BACKOFF,
  random = Math.random,
}: {
  /** The migrations run where no statement timeout ends them (withoutTimeouts). */
  database: Pick<DatabaseHandle, 'withoutTimeouts'>
  logger: Logger
  clock: Clock
  /** Aborted when the service stops before the database came up. */
  signal: AbortSignal
  backoff?: BackoffSettings
  random?: () => number
}): Promise<MigrationReport> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await database.withoutTimeouts(migrateToLatest)
    } catch (error) {
      const reason = describeDatabaseError(error)
      if (reason.kind !== 'unavailable' || signal.aborted) throw error
      const retryInMs = Math.round(backoffDelayS(attempt, backoff, random) * 1_000)
      logger.warn({ attempt, retryInMs, err: reason }, 'database not available at start-up; retrying')
      await clock.sleep(retryInMs, signal)
    }
  }
}
