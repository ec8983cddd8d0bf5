// Who may use the operator console, and proof that a form was posted from the console's own page.
//
// One secret, ADMIN_TOKEN, accepted three ways: `Authorization: Bearer <token>` (scripts), HTTP basic
// auth with the token as password and any user name (the name is who the action log records), or the
// login page, which keeps a random session id in an HttpOnly, SameSite=Strict cookie. Sessions live in
// this process's memory: a restart logs everyone out, which is the safe direction. A live session is
// looked at first and settles it: the Authorization header beside it is a proxy's (single sign-on in
// front), not a token tried, so it is neither checked nor counted.
//
// CSRF: every POST carries a token in a hidden field. A session's is random; a bearer or basic caller's
// is an HMAC of who they are under a per-process key (a browser sends basic credentials on its own, so
// basic auth needs the token as much as a cookie does).
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import type { Request } from 'express'
import { authorizationOf } from '../http/authorization.js'

export const SESSION_COOKIE = 'console_session'
const SESSION_TTL_MS = 12 * 60 * 60 * 1000
/** Sessions kept at most; the oldest is dropped past it (each needs the token, so this is only a bound). */
const MAX_SESSIONS = 1_000

export interface Operator {
  /** Who the action log names: the login page's name, the basic-auth user name, or "bearer token". */
  name: string
  via: 'session' | 'basic' | 'bearer'
  /** The CSRF token this operator's forms carry. */
  csrfToken: string
  sessionId?: string
}

interface Session {
  name: string
  csrfToken: string
  expiresAt: number
}

export interface ConsoleAuth {
  /**
   * The operator of the request's live session cookie, whatever Authorization header came with it: a proxy in front
   * (nginx auth_basic, oauth2-proxy's --set-authorization-header, a ForwardAuth) adds its own, which is not a token
   * tried. Undefined when no cookie names a live session.
   */
  fromSession(req: Request): Operator | undefined
  /** The operator the Authorization header proves (Bearer or Basic with the token), or undefined: a token tried. */
  fromAuthorization(req: Request): Operator | undefined
  /** Checks a token typed on the login page; on success, a new session id for the cookie. */
  login(token: string, name: string): string | undefined
  logout(sessionId: string): void
  /** Constant-time check of a posted CSRF token against the operator's. */
  csrfTokenMatches(operator: Operator, posted: unknown): boolean
}

function digest(value: string): Buffer {
  return createHash('sha256').update(value, 'utf8').digest()
}

/** Equal-length digests, compared in constant time: the token's length leaks nothing either. */
function sameSecret(candidate: string, expected: Buffer): boolean {
  return timingSafeEqual(digest(candidate), expected)
}

/**
 * Every value the request's cookies give `name`. A browser sends two cookies of one name when they were set for
 * different paths (a proxy's prefix that changed, one planted by a sibling host), the longer path's first: reading
 * only the first, a stale one there sent every login back to the login page.
 */
export function readCookies(req: Request, name: string): string[] {
  const header = req.headers.cookie
  if (!header) return []
  return header.split(';').flatMap((part) => {
    const separator = part.indexOf('=')
    return separator > 0 && part.slice(0, separator).trim() === name ? [part.slice(separator + 1).trim()] : []
  })
}

/** A name for the action log: printable, short. */
function operatorName(name: string, fallback: string): string {
  // eslint-disable-next-line no-control-regex
  const cleaned = name.replace(/[\u0000-\u001f\u007f]/g, '').trim().slice(0, 64)
  return cleaned === '' ? fallback : cleaned
}

export function createConsoleAuth({ token, now = () => Date.now() }: { token: string; now?: () => number }): ConsoleAuth {
  const expected = digest(token)
  const csrfKey = randomBytes(32)
  const sessions = new Map<string, Session>()
  const derivedCsrf = (identity: string) => createHmac('sha256', csrfKey).update(identity).digest('hex')

  const fromSession = (req: Request): Operator | undefined => {
    for (const sessionId of readCookies(req, SESSION_COOKIE)) {
      if (!/^[0-9a-f]{64}$/.test(sessionId)) continue
      const session = sessions.get(sessionId)
      if (!session) continue
      if (session.expiresAt <= now()) {
        sessions.delete(sessionId)
        continue
      }
      return { name: session.name, via: 'session', csrfToken: session.csrfToken, sessionId }
    }
    return undefined
  }

  return {
    fromSession,
    fromAuthorization(req) {
      const header = req.headers.authorization
      if (header) {
        // the whole rest is the credential: split on every space, a token holding one never matched, and any
        // words after a right token were ignored
        const { scheme, credential: value } = authorizationOf(header) ?? { scheme: '', credential: '' }
        if (scheme === 'bearer' && sameSecret(value, expected)) {
          return { name: 'bearer token', via: 'bearer', csrfToken: derivedCsrf('bearer') }
        }
        if (scheme === 'basic') {
          const decoded = Buffer.from(value, 'base64').toString('utf8')
          const separator = decoded.indexOf(':')
          if (separator >= 0 && sameSecret(decoded.slice(separator + 1), expected)) {
            const name = operatorName(decoded.slice(0, separator), 'basic auth')
            return { name, via: 'basic', csrfToken: derivedCsrf(`basic:${name}`) }
          }
        }
      }
      return undefined
    },
    login(candidate, name) {
      if (!sameSecret(candidate, expected)) return undefined
      const sessionId = randomBytes(32).toString('hex')
      sessions.set(sessionId, {
        name: operatorName(name, 'console login'),
        csrfToken: randomBytes(32).toString('hex'),
        expiresAt: now() + SESSION_TTL_MS,
      })
      while (sessions.size > MAX_SESSIONS) sessions.delete(sessions.keys().next().value!)
      return sessionId
    },
    logout(sessionId) {
      sessions.delete(sessionId)
    },
    csrfTokenMatches(operator, posted) {
      if (typeof posted !== 'string') return false
      // compared as bytes, whose count is what timingSafeEqual needs equal: 64 characters of `é` are 128 bytes,
      // and passed a string-length check into a RangeError, a 500
      const bytes = Buffer.from(posted, 'utf8')
      const expected = Buffer.from(operator.csrfToken, 'utf8')
      return bytes.length === expected.length && timingSafeEqual(bytes, expected)
    },
  }
}

/**
 * Whether the browser reached the console over HTTPS: the service serves plain HTTP, so only through a proxy that
 * ends TLS and says so (`X-Forwarded-Proto: https`, or RFC 7239's `Forwarded: proto=https`, the first hop's). The
 * session cookie is then `Secure`, so the browser never sends it over plain HTTP to that host name. Trusting the
 * header from any peer is safe here: it only ever restricts the cookie, and a local http:// request carries none.
 */
export function reachedOverHttps(req: Request): boolean {
  const forwardedProto = req.headers['x-forwarded-proto']
  const first = (typeof forwardedProto === 'string' ? forwardedProto : forwardedProto?.[0])?.split(',')[0]?.trim().toLowerCase()
  if (first !== undefined) return first === 'https'
  const forwarded = req.headers.forwarded?.split(',')[0]
  return forwarded !== undefined && /(?:^|;)\s*proto\s*=\s*"?https"?\s*(?:;|$)/i.test(forwarded)
}

/**
 * A browser tells where a POST came from: Sec-Fetch-Site (same-origin, or none when typed), which it sets itself
 * and no page can, settles it. Only a browser that sends none is judged by its Origin, whose host must be this
 * console's; clients that send neither (curl) still need the token.
 *
 * Behind a reverse proxy that ends TLS (https://ops.example.com/ in front of http://127.0.0.1:3001) the browser's
 * Origin is the proxy's, scheme and often host: compared whole with our own, every form posted through it, the
 * login's included, was refused 403.
 */
export function requestFromOwnOrigin(req: Request): boolean {
  const site = req.headers['sec-fetch-site']
  if (site !== undefined) return site === 'same-origin' || site === 'none'
  const origin = req.headers.origin
  if (origin === undefined) return true
  return URL.canParse(origin) && new URL(origin).host === (req.headers.host ?? '')
}
