// An HTTP-date is read in its three forms and only as a date the calendar has: Date.parse took 31 February for
// 3 March, so a Retry-After of a day that does not exist was a real date (a past one: retried at once), where
// `garbage` got the backoff. Fixed vectors, checked against the dates they name.
import { describe, expect, it } from 'vitest'
import { parseHttpDate } from '../src/http/http-date.js'

const at = (iso: string) => Date.parse(iso)

describe('parseHttpDate', () => {
  it.each([
    ['Thu, 01 Jan 2026 00:00:05 GMT', at('2026-01-01T00:00:05Z')],
    ['Thursday, 01-Jan-26 00:00:05 GMT', at('2026-01-01T00:00:05Z')],
    ['Thu Jan  1 00:00:05 2026', at('2026-01-01T00:00:05Z')],
    ['  Sat, 31 Jan 2026 23:59:59 GMT  ', at('2026-01-31T23:59:59Z')],
    // the last day of each month that has one
    ['Tue, 30 Jun 2026 12:00:00 GMT', at('2026-06-30T12:00:00Z')],
    ['Thu, 31 Dec 2026 12:00:00 GMT', at('2026-12-31T12:00:00Z')],
    // 29 February of leap years: every fourth, and a century divisible by 400
    ['Thu, 29 Feb 2024 00:00:00 GMT', at('2024-02-29T00:00:00Z')],
    ['Tue, 29 Feb 2000 00:00:00 GMT', at('2000-02-29T00:00:00Z')],
    ['Thursday, 29-Feb-24 00:00:00 GMT', at('2024-02-29T00:00:00Z')],
    ['Thu Feb 29 00:00:00 2024', at('2024-02-29T00:00:00Z')],
    // a leap second (RFC 9110: second 00-60) is the second after :59, where Date.parse read it as :00 of its minute
    ['Wed, 31 Dec 2025 23:59:60 GMT', at('2026-01-01T00:00:00Z')],
    // two-digit years as before: 00 to 49 in this century, 50 to 99 in the last
    ['Friday, 01-Jan-49 00:00:00 GMT', at('2049-01-01T00:00:00Z')],
    ['Sunday, 01-Jan-50 00:00:00 GMT', at('1950-01-01T00:00:00Z')],
    // a four-digit year is the year written
    ['Sat, 01 Jan 0000 00:00:00 GMT', at('0000-01-01T00:00:00Z')],
    ['Fri, 31 Dec 9999 23:59:59 GMT', at('9999-12-31T23:59:59Z')],
  ])('reads %j', (value, expected) => {
    expect(parseHttpDate(value)).toBe(expected)
  })

  it.each([
    // days the month does not have, in each form
    ['Tue, 31 Feb 2026 00:00:00 GMT'],
    ['Mon, 30 Feb 2026 00:00:00 GMT'],
    ['Sun, 29 Feb 2025 00:00:00 GMT'],
    ['Thu, 29 Feb 1900 00:00:00 GMT'],
    ['Thu, 31 Apr 2026 00:00:00 GMT'],
    ['Tue, 31 Jun 2026 00:00:00 GMT'],
    ['Sat, 00 Jan 2026 00:00:00 GMT'],
    ['Sun, 32 Jan 2026 00:00:00 GMT'],
    ['Tuesday, 31-Feb-26 00:00:00 GMT'],
    ['Tue Feb 31 00:00:00 2026'],
    ['Sun Feb 29 00:00:00 2025'],
    // times the day does not have
    ['Thu, 01 Jan 2026 24:00:00 GMT'],
    ['Thu, 01 Jan 2026 23:60:00 GMT'],
    ['Thu, 01 Jan 2026 23:59:61 GMT'],
    ['Thu, 01 Jan 2026 99:99:99 GMT'],
    // a month the calendar does not have
    ['Thu, 01 Foo 2026 00:00:00 GMT'],
    // not an HTTP-date at all
    ['garbage'],
    ['1'],
    ['2026-01-01T00:00:05Z'],
  ])('reads nothing of %j', (value) => {
    expect(parseHttpDate(value)).toBeUndefined()
  })
})
