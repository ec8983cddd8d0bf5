/**
 * The sleep between poller cycles is POLL_INTERVAL_S times a factor drawn from [1 - POLL_JITTER, 1 + POLL_JITTER):
 * its mean is the interval, and replicas that started in the same second drift apart within a few cycles. On its
 * own, as the configuration bounds POLL_INTERVAL_S by it without loading the poller.
 */
export const POLL_JITTER = 0.25
