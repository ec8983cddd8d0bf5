// The platform's trade statuses as we assume them: THE table to edit when the real platform differs.
//
// The spec names only `funded` and `released` and says every status change fires `trade.{status}`;
// the rest is our assumption (README, "The status model"). Each known status has a rank and a
// terminal flag. Glossary:
// - observation: a status seen for a trade, by webhook, poll or API answer;
// - stale: an observation ranked below the order's status, a status the order has had before (but for a
//   poll's return from an unknown status: decideTransition), or any change to a terminal order;
// - unknown status: one this table does not know (see decideTransition for what it may do);
// - duplicate effect: an observation equal to the order's status (a retry or replay): a no-op.

export interface StatusInfo {
  readonly rank: number
  readonly terminal: boolean
  /**
   * The platform takes the next step on its own (a funded trade cancelled is refunded): an order that reaches this
   * status is polled EXPECTED_WEBHOOK_S after, not STALE_AFTER_S, in case that step's webhook is lost (pollAfterS).
   */
  readonly followedOnItsOwn?: true
}

const STATUS_TABLE = {
  created: { rank: 10, terminal: false },
  funded: { rank: 20, terminal: false },
  delivered: { rank: 30, terminal: false },
  disputed: { rank: 40, terminal: false },
  // not terminal: a cancelled trade that had been funded is refunded next
  cancelled: { rank: 50, terminal: false, followedOnItsOwn: true },
  refunded: { rank: 60, terminal: true },
  released: { rank: 60, terminal: true },
  resolved: { rank: 60, terminal: true },
} as const satisfies Record<string, StatusInfo>

/**
 * A status the table knows: what a reaction handler's pattern may name (`trade.funded`; a misspelt one does not
 * compile). A row added to the table above adds its status here.
 */
export type TradeStatus = keyof typeof STATUS_TABLE

export const TRADE_STATUSES: Readonly<Record<string, StatusInfo>> = Object.freeze(STATUS_TABLE)

/** Whether the table knows `status`. */
export function isKnownStatus(status: string): status is TradeStatus {
  return Object.hasOwn(TRADE_STATUSES, status)
}

/** The rank of a known status; undefined for a status this table does not know. */
export function statusRank(status: string): number | undefined {
  return Object.hasOwn(TRADE_STATUSES, status) ? TRADE_STATUSES[status]!.rank : undefined
}

/**
 * How long after an order moves to `status` it is polled, if nothing moves it first: STALE_AFTER_S, or
 * EXPECTED_WEBHOOK_S where the platform takes the next step on its own (followedOnItsOwn), whichever is shorter.
 * A cancelled order whose `refunded` webhook was lost showed `cancelled` for STALE_AFTER_S (6 hours) while the
 * platform had refunded the trade. Once polled and found unchanged, it is polled STALE_AFTER_S on as any other.
 */
export function pollAfterS(
  status: string,
  { staleAfterS, expectedWebhookS = staleAfterS }: { staleAfterS: number; expectedWebhookS?: number | undefined },
): number {
  const followed = Object.hasOwn(TRADE_STATUSES, status) && TRADE_STATUSES[status]!.followedOnItsOwn === true
  return followed ? Math.min(expectedWebhookS, staleAfterS) : staleAfterS
}

export function isTerminalStatus(status: string): boolean {
  return Object.hasOwn(TRADE_STATUSES, status) && TRADE_STATUSES[status]!.terminal
}

/**
 * applied: the order moves. duplicate_effect: it has this status already. stale: a lower rank, a change
 * to a terminal order, or a status the order has had before. unknown_status: a webhook names a status
 * this table does not know: recorded, and the order is polled at once, but not moved.
 */
export type TransitionOutcome = 'applied' | 'duplicate_effect' | 'stale' | 'unknown_status'

/** Where an observation comes from; only the platform's answers to our signed calls may set an unknown status. */
export type TransitionSource = 'webhook' | 'poll' | 'api'

export interface OrderStatusState {
  status: string | null
  rank: number
  terminal: boolean
  /** Every status the order has had, the current one included. */
  visited: readonly string[]
}

/**
 * What observing `observed` (from `source`) does to an order in `current`. The SQL of
 * apply-observation.ts makes the same decision inside the database (so concurrent deliveries decide
 * on the locked row); this is its readable statement, and the tests hold the two to the same table.
 *
 * The rules, which together mean an order's history revisits a status it has left only on the platform's word:
 * - a known status moves the order only up in rank, and a terminal order never moves;
 * - no status is entered twice (a known one cannot be, by rank; an unknown one is checked by name), with one
 *   exception, below;
 * - an unknown status is the platform's word only when it answers our own signed request (a poll or an
 *   API answer): a webhook's body carries no time and its delivery id is unsigned, so a captured body
 *   can be replayed under a fresh id at any moment. A webhook's unknown status triggers a poll instead;
 * - an unknown status keeps the order's rank, so any known status ranked above the last known one
 *   still follows it (an order is never stuck on an unknown status);
 * - the exception: a poll's answer of a known status ranked at or above the order's (the last known one's), while
 *   the order is at an unknown status, moves it there even if it had that status before. A trade put on hold and taken off it goes
 *   funded, on_hold, funded: without this the order stayed on_hold until the trade moved further, and a partner who
 *   waits for funded to ship waited for a delivery that waited for it. Only a poll: its answer is the platform's
 *   word now (one poll of an order at a time, under its lease), where an API call's answer may have been overtaken
 *   by a poll's, and a webhook can be a replay. A webhook of that status asks for the poll (apply-observation.ts).
 */
export function decideTransition(current: OrderStatusState, observed: string, source: TransitionSource): TransitionOutcome {
  if (current.status === observed) return 'duplicate_effect'
  if (current.terminal) return 'stale'
  const rank = statusRank(observed)
  if (returnsFromUnknown(current, rank, source)) return 'applied'
  if (current.visited.includes(observed)) return 'stale'
  if (rank === undefined) return source === 'webhook' ? 'unknown_status' : 'applied'
  if (current.status === null) return 'applied'
  return rank > current.rank ? 'applied' : 'stale'
}

/** The exception above: a poll's known status, at or above the order's rank, while the order is at an unknown one. */
function returnsFromUnknown(current: OrderStatusState, rank: number | undefined, source: TransitionSource): boolean {
  return source === 'poll' && rank !== undefined && current.status !== null && statusRank(current.status) === undefined && rank >= current.rank
}

/**
 * Whether a transition to `event.to` is at or past `status` in rank: for a reaction handler that needs
 * "at least funded" although missed webhooks can make an order jump (created → released emits one event,
 * `trade.released`, and no `trade.funded`). Rank is the flow's order, not proof of every step: cancelled
 * and refunded rank above funded yet may follow a trade that was never funded, so a handler that moves
 * goods checks `event.to` too. An unknown status has reached only itself.
 */
export function hasReached(event: { readonly to: string }, status: string): boolean {
  const reached = statusRank(event.to)
  const wanted = statusRank(status)
  if (reached === undefined || wanted === undefined) return event.to === status
  return reached >= wanted
}
