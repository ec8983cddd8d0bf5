// Orders reconciled per second by the real poller against the in-process sandbox, at POLL_CONCURRENCY
// 1, 8 and 32.
import { sql } from 'kysely'
import { systemClock } from '../src/clock.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { createLogger } from '../src/logger.js'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { createPoller } from '../src/reconcile/poller.js'
import { createSandbox } from '../src/sandbox/create-sandbox.js'
import { NO_REACTION_HANDLERS } from '../src/orders/apply-observation.js'

export interface PollBenchResult {
  concurrency: number
  orders: number
  seconds: number
  perSecond: number
}

const secrets = { keyId: 'pk_bench', apiSecret: 'bench-api-secret-0123456789abcdef', webhookSecret: 'bench-webhook-secret-0123456789abcd' }

export async function runPollBench(url: string, { quick }: { quick: boolean }): Promise<PollBenchResult[]> {
  const logger = createLogger({ level: 'error', secrets: [secrets.apiSecret] })
  const database = openDatabase({ databaseUrl: url, poolSize: 10 })
  const sandbox = createSandbox({ ...secrets, partnerKind: 'merchant', logger })
  try {
    await migrateToLatest(database.db)
    const client = new PartnerApiClient({
      baseUrl: await sandbox.listen(0),
      keyId: secrets.keyId,
      secret: secrets.apiSecret,
      env: 'sandbox',
      kind: 'merchant',
      timeoutMs: 5_000,
      clock: systemClock,
      logger,
    })
    const orders = quick ? 200 : 1_000
    for (let start = 0; start < orders; start += 50) {
      const created = await Promise.all(
        Array.from({ length: Math.min(50, orders - start) }, (_, i) =>
          client.createTrade({ title: 'Poll bench', amount: '1.00', currency: 'EUR', external_reference: `p-${start + i}` }),
        ),
      )
      await database.db
        .insertInto('orders')
        .values(created.map((trade) => ({ externalReference: trade.external_reference, tradeId: trade.trade_id, tradeStatus: 'created', statusRank: 10 })))
        .execute()
    }
    const results: PollBenchResult[] = []
    for (const concurrency of [1, 8, 32]) {
      await sql`update orders set next_poll_at = now() - interval '1 second', poll_lease_token = null`.execute(database.db)
      const poller = createPoller({
        db: database.db,
        fetcher: client,
        clock: systemClock,
        logger,
        settings: { intervalS: 1, concurrency, batchSize: orders, observation: { staleAfterS: 21_600, handlersFor: NO_REACTION_HANDLERS }, leaseS: 300 },
        replica: `bench-${concurrency}`,
      })
      const started = process.hrtime.bigint()
      const summary = await poller.runOnce()
      const seconds = Number(process.hrtime.bigint() - started) / 1e9
      results.push({ concurrency, orders: summary.polled, seconds, perSecond: summary.polled / seconds })
    }
    return results
  } finally {
    await sandbox.close()
    await database.close()
  }
}
