import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import type { ObservationSettings } from '../orders/apply-observation.js'
import type { PartnerApiClient } from '../partner-api/partner-api.client.js'

/** The platform calls the trades service makes: the client, or a fake of it in a test. */
export type PartnerTradeApi = Pick<
  PartnerApiClient,
  | 'createTrade'
  | 'getTrade'
  | 'fundTrade'
  | 'deliverTrade'
  | 'releaseTrade'
  | 'cancelTrade'
  | 'deliverMilestone'
  | 'releaseMilestone'
  | 'openDispute'
  | 'createProposal'
  | 'respondToProposal'
>

export interface TradeDeps {
  db: Kysely<Database>
  client: PartnerTradeApi
  clock: Clock
  logger: Logger
  /** EXPECTED_WEBHOOK_S: when to poll after an API call; and how its answer is applied (observations.ts). */
  settings: { expectedWebhookS: number; observation: ObservationSettings }
}
