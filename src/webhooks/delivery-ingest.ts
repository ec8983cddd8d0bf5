// The ingest's long-lived parts, made once per process where the service is put together (service.ts;
// createApp makes its own when a test gives none): the group commit that writes trade deliveries, and
// the memory of stored delivery ids that answers their retries without the database, and the turns that store
// the bodies sent under one id one after another.
import type { Kysely } from 'kysely'
import type { Config } from '../config.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import type { Metrics } from '../metrics/metrics.js'
import type { ObservationSettings } from '../orders/apply-observation.js'
import { DeliveryIdTurns } from './delivery-id-turns.js'
import { type DeliveryWriter, GroupCommit } from './group-commit.js'
import { ingestDeliveries } from './parked-deliveries.js'
import { SeenDeliveries } from './seen-deliveries.js'

export interface DeliveryIngest {
  writer: DeliveryWriter
  seen: SeenDeliveries
  turns: DeliveryIdTurns
}

export function createDeliveryIngest(deps: {
  config: Pick<Config, 'webhook'>
  db: Kysely<Database>
  logger: Logger
  settings: ObservationSettings
  metrics?: Metrics | undefined
  /** Told how many deliveries each batch parked (the statistics watch: StatisticsWatch.parkedStored). */
  onParked?: ((count: number) => void) | undefined
}): DeliveryIngest {
  const { batchMax: maxBatch, batchStatements: maxInFlight, seenCacheSize } = deps.config.webhook
  const writer = new GroupCommit(ingestDeliveries(deps), {
    maxBatch,
    maxInFlight,
    maxQueued: Math.max(1_000, maxBatch * maxInFlight * 4),
    onBatch: (size) => deps.metrics?.ingestBatchSize.observe(size),
  })
  return { writer, seen: new SeenDeliveries(seenCacheSize), turns: new DeliveryIdTurns() }
}
