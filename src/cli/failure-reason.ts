// How a command names why a connection failed: in the words of the innermost cause, with any password in a
// URL masked. fetch's own message is only `fetch failed`, pg's wrapping ones say little more, and a cause
// shown as a string began with its class (`Error: connect ECONNREFUSED ...`).

/** The innermost message of the error and its causes (Node's `connect ECONNREFUSED 127.0.0.1:5432`, pg's). */
export function innermostReason(error: unknown): string {
  let reason = error instanceof Error ? error.message : String(error)
  let current = error
  for (let depth = 0; depth < 8 && current instanceof Error; depth++) {
    // an AggregateError (one connect per address of the host) has no message of its own: each address's are shown
    const inner =
      current instanceof AggregateError && current.message === ''
        ? current.errors.map((each: unknown) => (each instanceof Error ? each.message : String(each))).join(', ')
        : current.message
    if (inner !== '') reason = inner
    current = current.cause
  }
  return reason
}
