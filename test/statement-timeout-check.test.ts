// The start-up look at the database's statement_timeout: a warning exactly when the database would let a
// statement run on after the client stopped waiting for it (none set, or one longer than the client's wait).
import { describe, expect, it } from 'vitest'
import { checkStatementTimeout } from '../src/db/statement-timeout.js'
import { taggedLogger } from './helpers/log-sink.js'

// the check's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
const warningsFor = async (statementTimeoutInEffect?: () => Promise<{ ms: number; wanted: number }>) => {
  const { logger, entries } = taggedLogger()
  await checkStatementTimeout({ statementTimeoutInEffect }, logger)
  return entries()
    .map((entry) => ({ level: entry.level, statementTimeoutMs: entry.statementTimeoutMs, wantedMs: entry.wantedMs }))
}

describe('checkStatementTimeout', () => {
  it('warns when the database cancels nothing, or later than the client waits', async () => {
    expect(await warningsFor(async () => ({ ms: 0, wanted: 14_000 }))).toEqual([{ level: 40, statementTimeoutMs: 0, wantedMs: 14_000 }])
    expect(await warningsFor(async () => ({ ms: 15_000, wanted: 14_000 }))).toEqual([{ level: 40, statementTimeoutMs: 15_000, wantedMs: 14_000 }])
  })

  it('is quiet when the database cancels before the client stops waiting', async () => {
    expect(await warningsFor(async () => ({ ms: 14_000, wanted: 14_000 }))).toEqual([])
    expect(await warningsFor(async () => ({ ms: 14_999, wanted: 14_000 }))).toEqual([])
    expect(await warningsFor(async () => ({ ms: 5_000, wanted: 14_000 }))).toEqual([])
  })

  it('says nothing without a database to ask (PGlite) or when the look fails', async () => {
    expect(await warningsFor(undefined)).toEqual([])
    expect(await warningsFor(async () => Promise.reject(new Error('Connection terminated')))).toEqual([])
  })
})
