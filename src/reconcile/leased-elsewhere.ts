// What `reconcile --once` and the console's "Run one cycle now" say of the due orders another poller's lease held
// when their cycle began (countLeasedDue): after a cycle whose process was killed, its claim alone said 0.

/** The due orders of this PARTNER_ENV another poller's claim held, and when the last of those leases ends. */
export interface LeasedElsewhere {
  due: number
  until: Date | null
}

/**
 * The line for them, none when there were none; `runsShownBy` is where the operator finds the runs (the run of a
 * process that stopped is shown unfinished there).
 */
export function leasedElsewhereLine(leased: LeasedElsewhere, runsShownBy: string): string | undefined {
  if (leased.due === 0) return undefined
  return (
    `left ${leased.due} due order(s) leased by another poller's cycle, due again by ${leased.until?.toISOString()} as its lease ends ` +
    `(a cycle under way, or one whose process stopped: ${runsShownBy})`
  )
}
