// The partner API client a sandbox test drives the sandbox with: a marketplace partner's, 5 s per call, its secret
// among those no log line may show.
import { type Clock, systemClock } from '../../src/clock.js'
import { PartnerApiClient } from '../../src/partner-api/partner-api.client.js'
import { testLogger } from './log-sink.js'

export function sandboxClient(baseUrl: string, { keyId, secret, clock = systemClock }: { keyId: string; secret: string; clock?: Clock }): PartnerApiClient {
  return new PartnerApiClient({ baseUrl, keyId, secret, env: 'sandbox', kind: 'marketplace', timeoutMs: 5_000, clock, logger: testLogger([secret]) })
}
