// DNS rebinding: a web page open in the operator's browser makes its own host name resolve to 127.0.0.1, and its
// script then reads a loopback listener as if it were the page's own site. The browser still sends the page's
// name in `Host`, so a listener meant for this machine alone answers only a loopback Host (the sandbox's control
// endpoints), and the operator listener a loopback Host, an IP address, or a name the operator listed. Pure.
import { isIP } from 'node:net'

const LOOPBACK_HOST = /^(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d{1,5})?$/i
const LOOPBACK_ADDRESS = /^(localhost|127(\.\d{1,3}){3}|::1)$/i

/** Whether a Host header names this machine by a loopback name or address: localhost, 127.x.x.x or [::1], any port. */
export function isLoopbackHost(host: string | undefined): boolean {
  return host !== undefined && LOOPBACK_HOST.test(host)
}

/** Whether a listening address (ADMIN_HOST) is a loopback one: 127.x.x.x, ::1 or localhost. */
export function isLoopbackAddress(address: string): boolean {
  return LOOPBACK_ADDRESS.test(address)
}

/**
 * Whether the operator listener answers a request with this Host header: a loopback name or address, any IP address
 * (a page rebound by DNS carries its own name, never an address), or a name in `allowed` (ADMIN_ALLOWED_HOSTS,
 * lower-cased; `*` for any), with any port or none. A name ending in a dot is the same name.
 */
export function isAllowedAdminHost(host: string | undefined, allowed: readonly string[]): boolean {
  if (host === undefined) return false
  if (allowed.includes('*')) return true
  const name = /^\[([0-9a-f:.]+)\](:\d{1,5})?$/i.exec(host)?.[1] ?? /^([^:]+)(:\d{1,5})?$/.exec(host)?.[1]
  if (name === undefined) return false
  if (isIP(name) !== 0) return true
  const bare = name.toLowerCase().replace(/\.$/, '')
  return isLoopbackHost(bare) || allowed.includes(bare)
}
