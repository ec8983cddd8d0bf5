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
