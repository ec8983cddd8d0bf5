// The platform's trade statuses as we assume them: THE table to edit when the real platform differs.
//
// The spec names only `funded` and `released` and says every status change fires `trade.{status}`;
// the rest is our assumption (README, "The status model"). Each known status has a rank and a
// terminal flag. Glossary:
// - observation: a status seen for a trade, by webhook, poll or API answer;
// - stale: an observation ranked below the order's status, or any change to a terminal order;
// - duplicate effect: an observation equal to the order's status (a retry or replay): a no-op.

export interface StatusInfo {
  readonly rank: number
  readonly terminal: boolean
}

export const TRADE_STATUSES: Readonly<Record<string, StatusInfo>> = Object.freeze({
  created: { rank: 10, terminal: false },
  funded: { rank: 20, terminal: false },
  delivered: { rank: 30, terminal: false },
  disputed: { rank: 40, terminal: false },
  // not terminal: a cancelled trade that had been funded is refunded next
  cancelled: { rank: 50, terminal: false },
  refunded: { rank: 60, terminal: true },
  released: { rank: 60, terminal: true },
  resolved: { rank: 60, terminal: true },
})

/** The rank of a known status; undefined for a status this table does not know. */
export function statusRank(status: string): number | undefined {
  return Object.hasOwn(TRADE_STATUSES, status) ? TRADE_STATUSES[status]!.rank : undefined
}

export function isTerminalStatus(status: string): boolean {
  return Object.hasOwn(TRADE_STATUSES, status) && TRADE_STATUSES[status]!.terminal
}

export type TransitionOutcome = 'applied' | 'duplicate_effect' | 'stale'

export interface OrderStatusState {
  status: string | null
  rank: number
  terminal: boolean
}

/**
 * What observing `observed` does to an order in `current`. The SQL of apply-observation.ts makes the
 * same decision inside the database (so concurrent deliveries decide on the locked row); this is its
 * readable statement, and the tests hold the two to the same table.
 * An unknown status takes the order's current rank: it moves a non-terminal order, never its rank.
 */
export function decideTransition(current: OrderStatusState, observed: string): TransitionOutcome {
  if (current.status === observed) return 'duplicate_effect'
  if (current.terminal) return 'stale'
  if (current.status === null) return 'applied'
  const rank = statusRank(observed)
  if (rank === undefined) return 'applied'
  return rank > current.rank ? 'applied' : 'stale'
}
