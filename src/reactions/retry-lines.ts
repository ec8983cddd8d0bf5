// "reaction handler failed; retrying later": the line a handler's failed attempt writes when it is tried again. While
// a handler's system is down every event of it fails, first attempts and retries alike (5,000 forwards to a dead port
// wrote 2,793 such lines, 930 KB, in 16 s), so the line is limited (limit-lines.ts) for each handler and error code on
// its own: the first of each (handler, code) is written at once, then one a second at most, the last of the rest with
// `suppressed`, how many more it stands for. Every attempt is counted all the same (reaction_attempts_total,
// reaction_failures_total{code}), and each job keeps its last error (`reactions list`).
//
// "failed for the last time" is not limited: it comes once per job, never again for it, and each is a job an
// operator must retry or skip, named by its event id.
import { type LimitedLine, limitLinesBy } from '../limit-lines.js'
import type { Logger } from '../logger.js'
import { failureCode } from './failure-code.js'

export interface RetryLine {
  /** The attempt's logger (bound to its handler, event id and attempt). */
  log: Logger
  handler: string
  failure: unknown
  /** The error as kept on the job. */
  error: string
  retryInS: number
}

/** One process's "retrying later" lines, limited per handler and error code; shared by the streams and the job loop. */
export function createRetryLines(options?: { intervalMs?: number }): LimitedLine<RetryLine> {
  const write = limitLinesBy(
    (fields: { log: Logger; handler: string; code: string; error: string; retryInS: number }) => `${fields.handler}\n${fields.code}`,
    ({ log, handler: _handler, ...fields }) => log.warn(fields, 'reaction handler failed; retrying later'),
    options,
  )
  const line = ({ log, handler, failure, error, retryInS }: RetryLine) => write({ log, handler, code: failureCode(failure), error, retryInS })
  return Object.assign(line, { flush: write.flush })
}
