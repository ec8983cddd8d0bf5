// A Retry-After header (RFC 9110 section 10.2.3), as a peer sends it to ask for a wait: the platform to the
// partner API client, a receiver to the forwarder. Pure.
import { parseHttpDate } from './http-date.js'

/**
 * Retry-After as delay-seconds or an HTTP-date, in ms from `nowMs`; undefined when absent or unreadable. Only
 * whole seconds or an HTTP-date count: Date.parse would read -5, 1.5 and 'soon 12' as days in 2001.
 *
 * An HTTP-date is the sender's clock's: with the answer's own Date header (`answeredAt`, its clock when it answered)
 * the wait is the one between the two, whatever the clocks' offset. Read against this machine's clock, a platform
 * 50 min ahead asking for 30 s was waited out for 50 min, and one behind had its wait count as none.
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number, answeredAt?: string | null): number | undefined {
  if (value === null || value === undefined) return undefined
  const trimmed = value.trim()
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000
  const date = parseHttpDate(trimmed)
  if (date === undefined) return undefined
  const sendersNow = answeredAt ? parseHttpDate(answeredAt.trim()) : undefined
  return Math.max(0, date - (sendersNow ?? nowMs))
}
