// An HTTP-date (RFC 9110 section 5.6.7), as the Date and Retry-After headers carry it. Pure.
//
// Date.parse alone reads far more than an HTTP-date: "1", "-5", "1.5" and "soon 12" are days in 2001 to it,
// so a garbled header was read as a time 25 years ago (a "retry at once", a clock 785,000,000 s behind).

// the three forms a recipient must read: IMF-fixdate, the obsolete RFC 850 form, asctime
const HTTP_DATE = [
  /^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/,
  /^[A-Z][a-z]{5,8}, \d{2}-[A-Z][a-z]{2}-\d{2} \d{2}:\d{2}:\d{2} GMT$/,
  /^[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}$/,
]

/** Milliseconds since the epoch of an HTTP-date in any of its three forms; undefined for anything else. */
export function parseHttpDate(value: string): number | undefined {
  const trimmed = value.trim()
  if (!HTTP_DATE.some((form) => form.test(trimmed))) return undefined
  // asctime has no zone: it is GMT
  const ms = Date.parse(trimmed.endsWith('GMT') ? trimmed : `${trimmed} GMT`)
  return Number.isNaN(ms) ? undefined : ms
}
