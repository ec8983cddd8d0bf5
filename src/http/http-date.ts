// An HTTP-date (RFC 9110 section 5.6.7), as the Date and Retry-After headers carry it. Pure.
//
// Date.parse alone reads far more than an HTTP-date: "1", "-5", "1.5" and "soon 12" are days in 2001 to it,
// so a garbled header was read as a time 25 years ago (a "retry at once", a clock 785,000,000 s behind). Nor does
// it check the calendar: 31 February is 3 March to it, 24:00:00 the next day, and a leap second (23:59:60) the
// start of its minute. So the fields are read here, each held to its range, and the date built from them.

// the three forms a recipient must read: IMF-fixdate, the obsolete RFC 850 form (a two-digit year), asctime
const HTTP_DATE = [
  /^[A-Z][a-z]{2}, (?<day>\d{2}) (?<month>[A-Z][a-z]{2}) (?<year>\d{4}) (?<hour>\d{2}):(?<minute>\d{2}):(?<second>\d{2}) GMT$/,
  /^[A-Z][a-z]{5,8}, (?<day>\d{2})-(?<month>[A-Z][a-z]{2})-(?<shortYear>\d{2}) (?<hour>\d{2}):(?<minute>\d{2}):(?<second>\d{2}) GMT$/,
  /^[A-Z][a-z]{2} (?<month>[A-Z][a-z]{2}) (?<day>[ \d]\d) (?<hour>\d{2}):(?<minute>\d{2}):(?<second>\d{2}) (?<year>\d{4})$/,
]

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec']
const DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]

/** Days in `month` (0 for January) of `year`, on the Gregorian calendar Date uses for every year. */
function daysInMonth(year: number, month: number): number {
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0
  return month === 1 && leap ? 29 : DAYS_IN_MONTH[month]!
}

/**
 * Milliseconds since the epoch of an HTTP-date in any of its three forms; undefined for anything else, a date the
 * calendar does not have among them (31 Feb, 29 Feb of a common year, 24:00:00, 23:60:00).
 */
export function parseHttpDate(value: string): number | undefined {
  const fields = HTTP_DATE.map((pattern) => pattern.exec(value.trim())).find((match) => match !== null)?.groups
  if (!fields) return undefined
  const month = MONTHS.indexOf(fields.month!)
  // a four-digit year is the year written (0000 is not 2000); a two-digit one is read as Date.parse reads it,
  // 00 to 49 as 2000 to 2049 and 50 to 99 as the 1900s
  const short = fields.shortYear === undefined ? undefined : Number(fields.shortYear)
  const year = short === undefined ? Number(fields.year) : short < 50 ? 2000 + short : 1900 + short
  const [day, hour, minute, second] = [fields.day, fields.hour, fields.minute, fields.second].map(Number) as [number, number, number, number]
  // 60 is a leap second (RFC 9110: second 00-60): read as the second after :59
  if (month < 0 || day < 1 || day > daysInMonth(year, month) || hour > 23 || minute > 59 || second > 60) return undefined
  const date = new Date(0)
  // setUTCFullYear, not Date.UTC: Date.UTC reads a year from 0 to 99 as the 1900s
  date.setUTCFullYear(year, month, day)
  date.setUTCHours(hour, minute, second, 0)
  return date.getTime()
}
