// The poll lease (POLL_LEASE_S): how long a claimed order belongs to the claiming replica. On its own, as the
// configuration checks the lease against the longest poll without loading the poller.
import { STATEMENT_ANSWER_GRACE_MS } from '../db/statement-timeout.js'
import { longestGetWithRetryAfterMs } from '../partner-api/partner-api-transport.js'

/**
 * POLL_LEASE_S's default. A cycle normally takes seconds; the lease only has to outlast a slow one (a batch of GETs
 * with their timeouts and retries). A cycle starts a poll only while its lease has at least longestPollMs left
 * (reconcile-cycle.ts); when it runs out anyway (a process paused) the order is due again, the cycle starts no further
 * poll, and the late write-back of a poll that was in flight is refused by the lease token.
 */
export const DEFAULT_POLL_LEASE_S = 300

/**
 * The longest one claimed order's poll can last: its GET with every attempt run to PARTNER_API_TIMEOUT_MS and the
 * longest Retry-After waited out between them, then its write-back, bounded by DATABASE_STATEMENT_TIMEOUT_MS. A lease
 * shorter than this can run out under a poll in flight: another replica claims the order and GETs it again, and the
 * first poll's answer is thrown away (lease_lost).
 */
export function longestPollMs(partnerTimeoutMs: number, statementTimeoutMs: number): number {
  return longestGetWithRetryAfterMs(partnerTimeoutMs) + statementTimeoutMs + STATEMENT_ANSWER_GRACE_MS
}

/**
 * The least time a lease leaves a cycle to start its polls in, past the longest poll: no poll starts with less than the
 * longest poll left of the lease (reconcile-cycle.ts), so a lease no longer than the longest poll left none, or the
 * moment before its claim returned: every order claimed, given back untried, claimed again, and none polled.
 */
export const POLL_START_WINDOW_S = 30

/** The shortest POLL_LEASE_S allowed: the longest poll, in whole seconds, and the window to start polls in. */
export function shortestPollLeaseS(partnerTimeoutMs: number, statementTimeoutMs: number): number {
  return Math.ceil(longestPollMs(partnerTimeoutMs, statementTimeoutMs) / 1000) + POLL_START_WINDOW_S
}
