// Builds the client from the config: the key pair and base URL that PARTNER_ENV selected, or, in local
// mode, the sandbox that `npm start` runs in-process; in remote mode through the proxy of HTTPS_PROXY /
// HTTP_PROXY when one is set and NO_PROXY does not name the base URL's host.
import type { Clock } from '../clock.js'
import type { Config } from '../config.js'
import type { Logger } from '../logger.js'
import { PartnerApiClient, type PartnerApiClientOptions } from './partner-api.client.js'
import { describeProxy, fetchThroughProxy, type ProxySettings, proxyFor } from './partner-api-proxy.js'

/** The platform's {base_url}: the configured one, or the in-process sandbox in local mode. */
export function partnerApiBaseUrl(config: Config): string {
  return config.partner.baseUrl ?? `http://127.0.0.1:${config.sandbox.port}`
}

// One agent per configuration, so the service's poller and the commands it runs share the proxy's
// connections rather than opening a tunnel each.
const proxiedFetches = new WeakMap<ProxySettings, typeof fetch>()

function sharedFetchThroughProxy(settings: ProxySettings): typeof fetch {
  let proxied = proxiedFetches.get(settings)
  if (!proxied) {
    proxied = fetchThroughProxy(settings)
    proxiedFetches.set(settings, proxied)
  }
  return proxied
}

export function createPartnerApiClient(
  config: Config,
  deps: { logger: Logger; clock: Clock } & Partial<Pick<PartnerApiClientOptions, 'fetch' | 'random' | 'retry' | 'baseUrl' | 'onClockOffset' | 'onRetry'>>,
): PartnerApiClient {
  const baseUrl = deps.baseUrl ?? partnerApiBaseUrl(config)
  // local mode's platform is the sandbox this service runs on this machine: a proxy, a company's among them
  // (set in a developer's shell, its NO_PROXY not naming 127.0.0.1), could add nothing to that but a failure
  const settings = config.partner.mode === 'local' ? undefined : config.partner.proxy
  // a fetch passed in (tests) is used as given; a base URL that is not a URL is refused by the transport
  const proxy = settings && !deps.fetch && URL.canParse(baseUrl) ? proxyFor(new URL(baseUrl), settings) : undefined
  return new PartnerApiClient({
    ...deps,
    ...(proxy ? { fetch: sharedFetchThroughProxy(settings!) } : {}),
    ...(settings && !deps.fetch ? { proxyRoute: { proxy: proxy && describeProxy(proxy), noProxy: settings.noProxy } } : {}),
    baseUrl,
    keyId: config.partner.keyId,
    secret: config.partner.secret,
    env: config.partner.env,
    kind: config.partner.kind,
    timeoutMs: config.partner.timeoutMs,
    maxAnswerBytes: config.partner.maxAnswerBytes,
  })
}
