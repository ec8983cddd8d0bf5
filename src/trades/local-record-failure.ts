// A local write that failed once the platform call had been sent: the database went away, cut the statement short,
// or timed it out, after the platform had answered or while its answer was awaited. What the platform did (or may
// have done) is the command's news, never dropped for the database's failure: a command that said only "the
// database could not run the command now … try again later" had released an escrow's funds, made a trade nothing
// printed the id of, and made a second proposal when "try again" was followed (an outside review).
import { describeDatabaseError } from '../db/database-errors.js'
import { printable } from '../printable.js'

/** The database's failure in fixed words and its code (its own text may quote the command's values). */
export function databaseFailureWords(error: unknown): string {
  const description = describeDatabaseError(error)
  return printable(description.code ? `${description.message} (${description.code})` : description.message)
}

/**
 * The call failed (no answer that says what it did: a timeout, a lost connection, a 5xx, a second stop signal; or a
 * refusal), and the local write about it failed too. The call's own failure stays the command's (`[outcome_unknown]`
 * and its advice, a refusal's line), and `note` says what could not be recorded and what sets it right.
 */
export class NotRecordedLocallyError extends Error {
  override name = 'NotRecordedLocallyError'
  constructor(
    readonly callError: unknown,
    readonly note: string,
  ) {
    super(callError instanceof Error ? callError.message : String(callError))
  }
}
