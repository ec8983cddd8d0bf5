// Argument parsers shared by commands: a bad value is a usage error (exit 2) naming what was wrong.
import { InvalidArgumentError } from 'commander'

export function positiveInteger(value: string): number {
  const parsed = Number(value)
  // past 2^53 a number is no longer exact, and 1e300 is no integer the database takes
  if (!Number.isSafeInteger(parsed) || parsed <= 0) throw new InvalidArgumentError('must be a positive integer')
  return parsed
}

/** The most rows one listing prints: it is held whole in memory, in the running service when forwarded there. */
export const MAX_LIST_LIMIT = 10_000

export function listLimit(value: string): number {
  const parsed = Number(value)
  if (!Number.isInteger(parsed) || parsed <= 0 || parsed > MAX_LIST_LIMIT) {
    throw new InvalidArgumentError(`must be a whole number from 1 to ${MAX_LIST_LIMIT}`)
  }
  return parsed
}
