// A Retry-After header (RFC 9110 section 10.2.3), as a peer sends it to ask for a wait: the platform to the
// partner API client, a receiver to the forwarder. Pure.
import { parseHttpDate } from './http-date.js'

/**
 * Retry-After as delay-seconds or an HTTP-date, in ms from `nowMs`; undefined when absent or unreadable. Only
 * whole seconds or an HTTP-date count: Date.parse would read -5, 1.5 and 'soon 12' as days in 2001.
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  if (value === null || value === undefined) return undefined
  const trimmed = value.trim()
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000
  const date = parseHttpDate(trimmed)
  if (date === undefined) return undefined
  return Math.max(0, date - nowMs)
}
