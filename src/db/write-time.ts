// The time a write is dated by, as SQL: never after the database's own time. Due times and dates written by one
// machine's clock are read by every other's, and a machine an hour ahead of the database made an operator's "now" an
// hour late (a retry that waited an hour, a poll due an hour after it was asked for). A machine behind still dates
// early, which at worst makes something due sooner. The ingest statement does the same for what it records
// (apply-observation.ts: least(stated_at, statement_timestamp())).
import { type RawBuilder, sql } from 'kysely'

/**
 * `now`, the writer's clock's time, or the database's statement_timestamp() when that is earlier. Without `now` (a
 * command: the clock of the machine it runs on decides nothing), the database's alone. A service passes its clock's:
 * its own claims compare due times with it, and a test's clock keeps deciding what is due.
 */
export function writeTime(now?: Date): RawBuilder<Date> {
  return now === undefined ? sql<Date>`statement_timestamp()` : sql<Date>`least(${now}::timestamptz, statement_timestamp())`
}

/** writeTime(now) and `seconds` on: a due time that many seconds after the write. */
export function writeTimePlus(seconds: number, now?: Date): RawBuilder<Date> {
  return sql<Date>`(${writeTime(now)} + make_interval(secs => ${seconds}::double precision))`
}
