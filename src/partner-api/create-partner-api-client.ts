// Builds the client from the config: the key pair and base URL that PARTNER_ENV selected, or, in local
// mode, the sandbox that `npm start` runs in-process.
import type { Clock } from '../clock.js'
import type { Config } from '../config.js'
import type { Logger } from '../logger.js'
import { PartnerApiClient, type PartnerApiClientOptions } from './partner-api.client.js'

/** The platform's {base_url}: the configured one, or the in-process sandbox in local mode. */
export function partnerApiBaseUrl(config: Config): string {
  return config.partner.baseUrl ?? `http://127.0.0.1:${config.sandbox.port}`
}

export function createPartnerApiClient(
  config: Config,
  deps: { logger: Logger; clock: Clock } & Partial<Pick<PartnerApiClientOptions, 'fetch' | 'random' | 'retry' | 'baseUrl' | 'onClockOffset'>>,
): PartnerApiClient {
  return new PartnerApiClient({
    ...deps,
    baseUrl: deps.baseUrl ?? partnerApiBaseUrl(config),
    keyId: config.partner.keyId,
    secret: config.partner.secret,
    env: config.partner.env,
    kind: config.partner.kind,
    timeoutMs: config.partner.timeoutMs,
    maxAnswerBytes: config.partner.maxAnswerBytes,
  })
}
