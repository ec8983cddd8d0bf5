// When a failed reaction is tried again: the backoff, or the wait its error asked for (a Retry-After), never
// beyond the backoff's cap. Fixed vectors; the forwarder's tests drive it through the dispatcher.
import { describe, expect, it } from 'vitest'
import { PartnerApiError } from '../src/partner-api/partner-api-error.js'
import { ForwardError } from '../src/reactions/forwarder.js'
import { DEFAULT_DISPATCHER_SETTINGS, DEFAULT_MAX_ATTEMPTS } from '../src/reactions/dispatcher-settings.js'
import { planRetry } from '../src/reactions/plan-retry.js'

const backoff = { baseS: 10, capS: 1_000 }
const HALF = () => 0.5
// the backoff after a first failure with half jitter: 7.5 s; after a third, 30 s
const asking = (retryAfterMs: unknown) => Object.assign(new Error('asked to wait'), { retryAfterMs })

describe('planRetry', () => {
  it.each([
    ['no wait asked for', new Error('down'), 1, 7.5],
    ['a wait shorter than the backoff', asking(1_000), 1, 7.5],
    ['a wait longer than the backoff', asking(120_000), 1, 120],
    ['a wait longer than a later backoff', asking(31_000), 3, 31],
    ['a wait as long as the cap', asking(1_000_000), 1, 1_000],
    ['a wait that is not a number', asking('120000'), 1, 7.5],
    ['a negative wait', asking(-120_000), 1, 7.5],
    ['a wait of NaN', asking(Number.NaN), 1, 7.5],
    ['a forwarded answer’s Retry-After', new ForwardError('forward_failed', 'answered 429', 429, { retryAfterMs: 60_000 }), 1, 60],
    ['the platform’s Retry-After, thrown by a handler that calls it', new PartnerApiError(429, 'rate_limited', 'slow down', {}, 90_000), 1, 90],
    ['something thrown that is no object', 'a string', 1, 7.5],
  ])('retries %s after the longer of the two', (_case, failure, attempt, delayS) => {
    expect(planRetry(failure, 'the error', attempt, backoff, HALF)).toEqual({ delayS, error: 'the error' })
  })

  it.each([[1_000_001], [99_999_999_999_000], [Number.POSITIVE_INFINITY]])('cuts a wait of %d ms to the cap, and says so on the error', (retryAfterMs) => {
    expect(planRetry(asking(retryAfterMs), 'the error', 1, backoff, HALF)).toEqual({
      delayS: 1_000,
      error: 'the error (retried after 1000 s instead, the longest wait between attempts)',
    })
  })
})

describe('the default retries', () => {
  // the waits between a job's calls, each at the least and at the most its jitter gives
  const spanS = (random: () => number) =>
    Array.from({ length: DEFAULT_MAX_ATTEMPTS - 1 }, (_, index) => planRetry(new Error('down'), 'down', index + 1, DEFAULT_DISPATCHER_SETTINGS.backoff, random).delayS).reduce(
      (sum, delayS) => sum + delayS,
      0,
    )

  it('outlast a receiver away for a night: at least 20 hours from the first call to the last', () => {
    // 10 attempts spanned 21 to 43 minutes: a receiver down 25 minutes came back to failed jobs (a review)
    expect(spanS(() => 0) / 3_600).toBeGreaterThan(20)
    expect(spanS(() => 0.999999) / 3_600).toBeLessThan(41)
  })
})
