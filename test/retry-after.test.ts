// Retry-After read strictly: whole seconds or an HTTP-date, nothing else (the partner API client and the
// forwarder both read it here).
import { describe, expect, it } from 'vitest'
import { parseRetryAfter } from '../src/http/retry-after.js'

describe('parseRetryAfter', () => {
  const now = Date.parse('2026-01-01T00:00:00Z')
  it.each([
    ['2', 2_000],
    [' 0 ', 0],
    ['Thu, 01 Jan 2026 00:00:05 GMT', 5_000],
    // a date already past: retry now, never a negative wait
    ['Wed, 31 Dec 2025 23:59:00 GMT', 0],
    ['soon', undefined],
    [null, undefined],
    // the obsolete forms an HTTP-date may still take
    ['Thursday, 01-Jan-26 00:00:05 GMT', 5_000],
    ['Thu Jan  1 00:00:05 2026', 5_000],
    // not seconds and not an HTTP-date, though Date.parse reads each as a day in 2001: unreadable
    ['-5', undefined],
    ['1.5', undefined],
    ['soon 12', undefined],
    ['2026-01-01T00:00:05Z', undefined],
    // a day the calendar does not have is unreadable too, not the day Date.parse rolls it into (3 March, 1 March)
    ['Tue, 31 Feb 2026 00:00:00 GMT', undefined],
    ['Sun, 29 Feb 2025 00:00:00 GMT', undefined],
    ['Thu, 01 Jan 2026 24:00:00 GMT', undefined],
  ])('reads %j as %j ms', (value, expected) => {
    expect(parseRetryAfter(value, now)).toBe(expected)
  })

  // found from outside: a platform 50 min ahead asking for 30 s by date was waited out for 50 min
  it("reads a date against the answer's own Date when it has one: the sender's clock, not this machine's", () => {
    const in30s = 'Thu, 01 Jan 2026 00:50:30 GMT'
    expect(parseRetryAfter(in30s, now, 'Thu, 01 Jan 2026 00:50:00 GMT')).toBe(30_000)
    // the sender behind: still its 30 s, not none
    expect(parseRetryAfter('Wed, 31 Dec 2025 23:10:30 GMT', now, 'Wed, 31 Dec 2025 23:10:00 GMT')).toBe(30_000)
    // a Date that cannot be read, or none: this machine's clock
    expect(parseRetryAfter(in30s, now, 'soon')).toBe(50 * 60_000 + 30_000)
    expect(parseRetryAfter(in30s, now, null)).toBe(50 * 60_000 + 30_000)
    // seconds are the same on every clock
    expect(parseRetryAfter('30', now, 'Wed, 31 Dec 2025 23:10:00 GMT')).toBe(30_000)
  })
})
