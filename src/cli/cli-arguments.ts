// Argument parsers shared by commands: a bad value is a usage error (exit 2) naming what was wrong.
import { InvalidArgumentError } from 'commander'

export function positiveInteger(value: string): number {
  const parsed = Number(value)
  if (!Number.isInteger(parsed) || parsed <= 0) throw new InvalidArgumentError('must be a positive integer')
  return parsed
}
