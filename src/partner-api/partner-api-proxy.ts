// The HTTP proxy between this service and the platform, from HTTP_PROXY, HTTPS_PROXY and NO_PROXY (read by
// config.ts). With one set, the client's calls go through an EnvHttpProxyAgent, which opens a CONNECT tunnel
// through the proxy (for http:// targets too) and sends the signed request inside it. Without one, nothing here
// runs: the client goes straight to the platform (platform-fetch.ts).
//
// proxyFor makes the same choice as the agent (undici 7's rules: an https:// target takes HTTPS_PROXY, else
// HTTP_PROXY; an http:// target takes HTTP_PROXY only; NO_PROXY entries are host, host:port, .domain or
// *.domain, a domain covering its subdomains, and `*` alone bypasses every host), so the start-up log and
// the errors can name the proxy a call went through.
import type { buildConnector, Dispatcher } from 'undici'
import { undici } from '../lazy-packages.js'
import { connectionsMarkingFailures, markingFailures } from './connect-failure.js'
import { PROXY_CLOSED_CODE } from './partner-api-error.js'
import { platformFetch } from './platform-fetch.js'

export interface ProxySettings {
  /** http(s)://[user:password@]host:port; credentials included, so never logged as it is */
  readonly httpProxy: string | undefined
  readonly httpsProxy: string | undefined
  /** as set: a comma- or space-separated list */
  readonly noProxy: string | undefined
}

const DEFAULT_PORTS: Record<string, number> = { 'http:': 80, 'https:': 443 }

/** The proxy URL (credentials included) that a request to `target` goes through, or undefined: direct. */
export function proxyFor(target: URL, settings: ProxySettings | undefined): string | undefined {
  if (!settings) return undefined
  const proxy = target.protocol === 'https:' ? (settings.httpsProxy ?? settings.httpProxy) : settings.httpProxy
  if (proxy === undefined) return undefined
  return inNoProxy(target, settings.noProxy ?? '') ? undefined : proxy
}

function inNoProxy(target: URL, noProxy: string): boolean {
  if (noProxy === '*') return true
  // host, not hostname: an IPv6 address keeps its brackets, as NO_PROXY writes it
  const hostname = target.host.replace(/:\d*$/, '').toLowerCase()
  const port = Number.parseInt(target.port, 10) || DEFAULT_PORTS[target.protocol] || 0
  for (const entry of noProxy.split(/[,\s]/)) {
    if (!entry) continue
    const withPort = /^(.+):(\d+)$/.exec(entry)
    const entryHost = (withPort ? withPort[1]! : entry).replace(/^\*?\./, '').toLowerCase()
    const entryPort = withPort ? Number.parseInt(withPort[2]!, 10) : 0
    if (entryPort && entryPort !== port) continue
    if (hostname === entryHost || hostname.endsWith(`.${entryHost}`)) return true
  }
  return false
}

/**
 * The connections to the proxy, which carry the CONNECTs. A proxy that closes the connection without
 * answering (an https:// proxy spoken to as http://, a port where no proxy listens but something else does)
 * fails the CONNECT with a socket error, which undici takes as one to recover from by connecting again at
 * once: measured, 5,107 CONNECTs in a call's 2 s timeout. Under another code the call fails at the first.
 * A failure to connect to the proxy at all is marked as the proxy's, apart from one with the platform in the tunnel.
 */
function proxyConnections(origin: URL, options: { connect: buildConnector.connector }): Dispatcher {
  const pool = new (undici().Pool)(origin, { ...options, connect: markingFailures(options.connect, 'proxy') })
  const connect = pool.connect.bind(pool) as (options: Dispatcher.ConnectOptions) => Promise<Dispatcher.ConnectData>
  const connectOnce = (connectOptions: Dispatcher.ConnectOptions) =>
    connect(connectOptions).catch((error: unknown) => {
      if ((error as { code?: string }).code !== 'UND_ERR_SOCKET') throw error
      throw Object.assign(new Error('the proxy closed the connection without answering CONNECT', { cause: error }), {
        code: PROXY_CLOSED_CODE,
      })
    })
  return Object.assign(pool, { connect: connectOnce }) as unknown as Dispatcher
}

/** scheme://host:port of a proxy URL, without its user and password: how logs and errors name it. */
export function describeProxy(proxyUrl: string): string {
  return new URL(proxyUrl).origin
}

/**
 * A fetch through the proxy that `settings` give for the target, the client's own (platform-fetch.ts) over the
 * agent. The settings are passed whole, so the agent never reads the environment itself.
 */
export function fetchThroughProxy(settings: ProxySettings): typeof fetch {
  const dispatcher = new (undici().EnvHttpProxyAgent)({
    // '' is "none": undefined would send the agent to process.env
    httpProxy: settings.httpProxy ?? '',
    httpsProxy: settings.httpsProxy ?? '',
    noProxy: settings.noProxy ?? '',
    clientFactory: proxyConnections,
    // the connections to the platform, the tunnelled ones among them
    factory: connectionsMarkingFailures,
  })
  return platformFetch(dispatcher)
}
