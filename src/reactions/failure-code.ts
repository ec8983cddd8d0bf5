// The code of a handler's failure: the label of reaction_failures_total, and what its "retrying later" log lines are
// limited by (retry-lines.ts). A built-in handler's code (amqp_unroutable, forward_timeout ...) or a fork's own of
// the same snake_case form. Anything else (Node's ECONNRESET, a SQLSTATE, an error without a code) is `other`, so
// the label keeps a small, closed set of values: its message is in the log line and the job's last_error.
const FAILURE_CODE = /^[a-z][a-z0-9_]{0,47}$/

export function failureCode(error: unknown): string {
  const code = (error as { code?: unknown } | null | undefined)?.code
  return typeof code === 'string' && FAILURE_CODE.test(code) ? code : 'other'
}
