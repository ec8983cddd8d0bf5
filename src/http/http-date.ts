// An HTTP-date (RFC 9110 section 5.6.7), as the Date and Retry-After headers carry it. Pure.
//
// Date.parse alone reads far more than an HTTP-date: "1", "-5", "1.5" and "soon 12" are days in 2001 to it,
// so a garbled header was read as a time 25 years ago (a "retry at once", a clock 785,000,000 s behind).

// the three forms a recipient must read: IMF-fixdate, the obsolete RFC 850 form, asctime
// (a four-digit year captured as `year`)
const HTTP_DATE = [
  /^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} (?<year>\d{4}) \d{2}:\d{2}:\d{2} GMT$/,
  /^[A-Z][a-z]{5,8}, \d{2}-[A-Z][a-z]{2}-\d{2} \d{2}:\d{2}:\d{2} GMT$/,
  /^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} (?<year>\d{4})$/,
]

/** Milliseconds since the epoch of an HTTP-date in any of its three forms; undefined for anything else. */
export function parseHttpDate(value: string): number | undefined {
  const trimmed = value.trim()
  const form = HTTP_DATE.map((pattern) => pattern.exec(trimmed)).find((match) => match !== null)
  if (!form) return undefined
  // asctime has no zone: it is GMT
  const ms = Date.parse(trimmed.endsWith('GMT') ? trimmed : `${trimmed} GMT`)
  if (Number.isNaN(ms)) return undefined
  // a four-digit year is the year written: Date.parse reads 0000 to 0049 as 2000 to 2049, and 0050 to 0099 as the 1900s
  const year = form.groups?.year
  if (year === undefined || Number(year) >= 100) return ms
  const date = new Date(ms)
  date.setUTCFullYear(Number(year))
  return date.getTime()
}
