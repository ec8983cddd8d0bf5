// A COMMIT sent and not yet answered. Until its answer comes, nobody in this process knows whether the transaction
// was made: on Postgres the server carries it through without the client (a process that ends then does not roll it
// back), and on PGlite the end of the process may come before or after it is written. A command stopped by a signal
// then cannot say that nothing was done (cli-context.ts, withDatabase): it says the change may or may not have been
// made, and where to look. Counted for the whole process: a command's connections are its own.

let inFlight = 0

/** Notes a COMMIT sent; the returned function notes its answer (or its failure). */
export function commitSent(): () => void {
  inFlight += 1
  let answered = false
  return () => {
    if (answered) return
    answered = true
    inFlight -= 1
  }
}

/** Whether a COMMIT of this process is sent and not yet answered. */
export function commitInFlight(): boolean {
  return inFlight > 0
}

/** Whether a statement's text is a COMMIT (Kysely's `commit`, or one written by hand; END is the same statement). */
export function isCommit(text: unknown): boolean {
  return typeof text === 'string' && /^\s*(commit|end)(\s+(work|transaction))?\s*;?\s*$/i.test(text)
}
