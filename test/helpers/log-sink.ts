// Every test logger writes here, so a suite-wide check (setup.ts) can prove that no log line holds a
// secret or a signature that a test used.
import { Writable } from 'node:stream'
import { createLogger, type Logger } from '../../src/logger.js'

export const logLines: string[] = []
const forbidden = new Set<string>()

/** Marks a value (a secret, a signature) that must never appear in any log line of this test file. */
export function rememberSecret(...values: string[]): void {
  for (const value of values) if (value.length >= 8) forbidden.add(value)
}

export function forbiddenValues(): string[] {
  return [...forbidden]
}

/**
 * Forgets the lines and the secrets: at the end of each test file (setup.ts), since the in-process files share their
 * worker's modules (vitest.config.ts, `isolate: false`), this one among them.
 */
export function forgetLogLines(): void {
  logLines.length = 0
  forbidden.clear()
}

const sink = new Writable({
  write(chunk, _encoding, done) {
    logLines.push(String(chunk))
    done()
  },
})

/** A JSON logger at debug level into the shared sink; pass the secrets the code under test knows. */
export function testLogger(secrets: readonly string[] = []): Logger {
  rememberSecret(...secrets)
  return createLogger({ level: 'debug', secrets, destination: sink })
}

/** The parsed log entries written so far, for tests that assert on a log line. */
export function logEntries(): Record<string, unknown>[] {
  return logLines.flatMap((line) => line.split('\n').filter(Boolean)).map((line) => JSON.parse(line))
}

let tags = 0

/**
 * A test logger whose every line (its children's too) carries a tag of its own, and the entries and raw lines it
 * wrote: for a test that counts the lines of the thing under test over a window of time. The files of a worker share
 * its process, and with it this sink: a line another file's work logs meanwhile (a limited line's summary comes up to
 * a second later) lands in any window, but is not among these.
 */
export function taggedLogger(secrets: readonly string[] = []): { logger: Logger; entries: () => Record<string, unknown>[]; lines: () => string[] } {
  const logTag = `log-${process.pid}-${++tags}`
  const marker = `"logTag":"${logTag}"`
  return {
    logger: testLogger(secrets).child({ logTag }),
    entries: () => logEntries().filter((entry) => entry.logTag === logTag),
    lines: () => logLines.flatMap((line) => line.split('\n').filter(Boolean)).filter((line) => line.includes(marker)),
  }
}
