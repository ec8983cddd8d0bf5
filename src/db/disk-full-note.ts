// A delivery the database refused to store because its disk is full (SQLSTATE 53100: a table or index that could
// not grow, on Postgres or on the embedded database with DATA_DIR_MIN_FREE=0). Every delivery is then answered 503,
// while /readyz, which only reads, answered 200: a load balancer kept sending work to a replica that could store
// none, and the probe an operator looks at said all was well. /readyz now says so until a delivery is stored again,
// or for HOLD_MS after the last refusal (with no deliveries coming, nothing else would tell it there is room
// again; the next delivery finds out).
import { errorCode } from './database-errors.js'

export const DISK_FULL = '53100'
export const DISK_FULL_HOLD_MS = 10_000

export interface DiskFullNote {
  /** Notes a failed write: it counts when the database refused it for a full disk. */
  failed(error: unknown): void
  /** Notes a stored delivery: the database has room. */
  stored(): void
  /** Milliseconds since the last refusal, while it stands; undefined when none does. */
  standing(): number | undefined
}

export function diskFullNote(now: () => number = Date.now, holdMs = DISK_FULL_HOLD_MS): DiskFullNote {
  let refusedAt: number | undefined
  return {
    failed(error) {
      if (errorCode(error) === DISK_FULL) refusedAt = now()
    },
    stored() {
      refusedAt = undefined
    },
    standing() {
      if (refusedAt === undefined) return undefined
      const since = now() - refusedAt
      return since < holdMs ? since : undefined
    },
  }
}
