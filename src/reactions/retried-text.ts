// What an operator is told of a reaction job just retried (the CLI's `reactions retry` and the console's Retry):
// pure, so the CLI reads it without loading the job repository before a command needs it.

/** An earlier job of the same order and handler, not done or skipped, that a retried job still waits behind. */
export interface JobWaitedFor {
  id: string
  sequence: number
  state: string
}

export function retriedText(id: string, waitsBehind: JobWaitedFor | undefined): string {
  if (!waitsBehind) return `job ${id} runs again now`
  return (
    `job ${id} is pending again, and runs once job ${waitsBehind.id} (an earlier event of its order for the same ` +
    `handler, ${waitsBehind.state}) is done or skipped: one order's events reach a handler in order`
  )
}
