// A failure before the connection was up, told apart from one after it. undici writes a request only once its
// connection is set up (TCP connected and, for https, the TLS handshake done), but it hands a request the socket's
// own error either way: a reset during the TLS handshake reads `read ECONNRESET`, exactly as one after the request
// went out does. So the connectors the client's connections use mark their own failures: a marked failure means
// not one byte of the request left this machine.
import type { buildConnector, Dispatcher, Pool } from 'undici'
import { undici } from '../lazy-packages.js'

/** Who the connection that failed was to: the platform (directly or through the tunnel), or the proxy itself. */
export type ConnectTarget = 'platform' | 'proxy'

/** The failure of a connector, its code kept (undici and our errors read it). */
export class ConnectFailure extends Error {
  override name = 'ConnectFailure'
  readonly code: unknown
  constructor(
    readonly target: ConnectTarget,
    cause: Error,
  ) {
    super(`the connection to the ${target} could not be set up: ${cause.message}`, { cause })
    this.code = (cause as { code?: unknown }).code
  }
}

/**
 * `connect` with each of its failures marked, a mark from within (the proxy's, in a tunnel) left as it is: on the
 * error or on one of its causes, as undici wraps a proxy certificate for another host (ERR_TLS_CERT_ALTNAME_INVALID)
 * in a SecureProxyConnectionError, which marked again read as the platform's.
 */
export function markingFailures(connect: buildConnector.connector, target: ConnectTarget): buildConnector.connector {
  return (options, callback) =>
    connect(options, (...result) => {
      const [error] = result
      if (error === null || connectFailure(error) !== undefined) return callback(...result)
      callback(new ConnectFailure(target, error), null)
    })
}

/**
 * The connections to one origin (undici's Agent `factory`), their connector's failures marked as the platform's.
 * Given a connector (a proxy's tunnel), that one is marked; else one is built as undici builds its own.
 */
export function connectionsMarkingFailures(origin: string | URL, options: object): Dispatcher {
  const { connect } = options as Pool.Options
  const { buildConnector, Pool } = undici()
  const connector = typeof connect === 'function' ? connect : buildConnector({ ...connect })
  return new Pool(origin, { ...options, connect: markingFailures(connector, 'platform') })
}

/** The first connector's failure on `error` or one of its causes; undefined when the failure came after a connection was up. */
export function connectFailure(error: unknown): ConnectFailure | undefined {
  for (let at = error, depth = 0; at instanceof Error && depth < 8; at = at.cause, depth++) {
    if (at instanceof ConnectFailure) return at
  }
  return undefined
}

/**
 * A call aborted (its timeout, the caller) before undici started writing its request on a connection that was up: a
 * connect still under way (a SYN never answered, a TLS handshake that stalls) or the request still queued. Not one
 * byte of it left this machine. The abort's own error is its cause.
 */
export class AbortedBeforeSentError extends Error {
  override name = 'AbortedBeforeSentError'
  constructor(cause: unknown) {
    super('aborted before the request was written: no connection was up for it', { cause })
  }
}

/** True when `error` (or one of its causes) is an AbortedBeforeSentError. */
export function abortedBeforeSent(error: unknown): boolean {
  for (let at = error, depth = 0; at instanceof Error && depth < 8; at = at.cause, depth++) {
    if (at instanceof AbortedBeforeSentError) return true
  }
  return false
}
