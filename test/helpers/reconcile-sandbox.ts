// The whole loop for end-to-end poller tests: the real receiver (createApp, listening on a port) over a
// test database, the sandbox platform delivering its webhooks to it over HTTP, and a driver that takes
// trades through random lifecycles on the platform as the buyer, the seller and the partner would.
import type { Kysely } from 'kysely'
import { systemClock } from '../../src/clock.js'
import type { Config } from '../../src/config.js'
import type { Database } from '../../src/db/database.js'
import { createApp } from '../../src/http/app.js'
import { listen, type RunningServer } from '../../src/http/server.js'
import type { Logger } from '../../src/logger.js'
import { createPartnerApiClient } from '../../src/partner-api/create-partner-api-client.js'
import type { PartnerApiClient } from '../../src/partner-api/partner-api.client.js'
import { createSandbox, type Sandbox, type SandboxOptions } from '../../src/sandbox/create-sandbox.js'
import { seededRandom } from '../../src/sandbox/seeded-random.js'
import type { Faults } from '../../src/sandbox/webhook-dispatcher.js'
import { openTradeForOrder } from '../../src/trades/open-trade-for-order.js'
import { TradeOperationError } from '../../src/trades/trade-operation-error.js'
import { callTradeApi, runTradeOperation, type TradeOperation } from '../../src/trades/run-trade-operation.js'
import type { TradeDeps } from '../../src/trades/trade-deps.js'
import { testLogger } from './log-sink.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './test-config.js'
import { TEST_OBSERVATION_SETTINGS } from './orders.js'

export interface PlatformLoop {
  config: Config
  logger: Logger
  sandbox: Sandbox
  sandboxUrl: string
  receiver: RunningServer
  /** A client of the sandbox, signing on the real clock (the sandbox checks the timestamp window). */
  client: PartnerApiClient
  trades: TradeDeps
  close(): Promise<void>
}

export async function startPlatformLoop(
  db: Kysely<Database>,
  faults: Partial<Faults>,
  /** What the sandbox's milestone operations answer (its default: the trade record). */
  { milestoneAnswer }: Pick<SandboxOptions, 'milestoneAnswer'> = {},
): Promise<PlatformLoop> {
  const logger = testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])
  const sandbox = createSandbox({
    milestoneAnswer,
    keyId: TEST_API_KEY_ID,
    apiSecret: TEST_API_SECRET,
    webhookSecret: TEST_WEBHOOK_SECRET,
    // the whole retry schedule (6 attempts) in about 30 ms, so a test can wait it out
    retryBaseDelayMs: 1,
    retryMaxDelayMs: 16,
    refundDelayMs: 1,
    faults,
    logger,
  })
  const sandboxUrl = await sandbox.listen(0)
  // the sandbox answers every call (none of its faults is a hang): the timeout only bounds one, and 10 s was passed at
  // a load of 20 with 20 lifecycles at once. 18 s keeps the poll lease's default, which a timeout over 18.75 s lengthens
  const config = testConfig({ PARTNER_API_BASE_URL: sandboxUrl, PARTNER_API_TIMEOUT_MS: '18000' })
  const receiver = await listen(createApp({ config, db, logger, clock: systemClock }), {
    port: 0,
    host: '127.0.0.1',
  })
  sandbox.setWebhookUrl(`${receiver.url}${config.webhook.path}`)
  const client = createPartnerApiClient(config, { logger, clock: systemClock })
  return {
    config,
    logger,
    sandbox,
    sandboxUrl,
    receiver,
    client,
    trades: { db, client, clock: systemClock, logger, settings: { expectedWebhookS: config.poll.expectedWebhookS, observation: TEST_OBSERVATION_SETTINGS, partnerKind: config.partner.kind, createTimeoutMs: config.partner.timeoutMs } },
    close: async () => {
      await receiver.stop(1_000)
      await sandbox.close()
    },
  }
}

type Step = { by: 'partner' | 'platform'; operation: TradeOperation }

const REASON = 'The goods arrived damaged and incomplete'

/** The lifecycles a trade can take; each ends where a real trade could rest. */
const LIFECYCLES: { name: string; milestones?: boolean; steps: TradeOperation['kind'][] }[] = [
  { name: 'stays created', steps: [] },
  { name: 'funded', steps: ['fund'] },
  { name: 'delivered', steps: ['fund', 'deliver'] },
  { name: 'released', steps: ['fund', 'deliver', 'release'] },
  { name: 'cancelled unfunded', steps: ['cancel'] },
  { name: 'cancelled and refunded', steps: ['fund', 'cancel'] },
  { name: 'cancelled after delivery', steps: ['fund', 'deliver', 'cancel'] },
  { name: 'disputed', steps: ['fund', 'dispute'] },
  { name: 'disputed, proposal rejected', steps: ['fund', 'deliver', 'dispute', 'proposal', 'respond'] },
  { name: 'resolved', steps: ['fund', 'dispute', 'proposal', 'respond'] },
  {
    name: 'milestones released',
    milestones: true,
    steps: ['fund', 'deliver_milestone', 'release_milestone', 'deliver_milestone', 'release_milestone'],
  },
]

/**
 * Opens `count` trades for orders `${prefix}-N` through the trades service (the order is linked by the
 * create answer) and takes each through a random lifecycle. Each later step is taken either by the partner
 * (through the trades service: the answer is recorded as an `api` observation) or by someone else on the
 * platform (the buyer pays, the seller delivers: only a webhook or a poll can tell the receiver).
 */
export async function runRandomLifecycles(
  loop: PlatformLoop,
  { count, prefix, seed, parallel = 20 }: { count: number; prefix: string; seed: number; parallel?: number },
): Promise<Map<string, string>> {
  const random = seededRandom(seed)
  const plans = Array.from({ length: count }, (_, i) => {
    const lifecycle = LIFECYCLES[Math.floor(random() * LIFECYCLES.length)]!
    const byPartner = lifecycle.steps.map(() => random() < 0.5)
    return { reference: `${prefix}-${i}`, lifecycle, byPartner, accept: lifecycle.name === 'resolved' }
  })
  const tradeIds = new Map<string, string>()
  for (let start = 0; start < plans.length; start += parallel) {
    await Promise.all(
      plans.slice(start, start + parallel).map(async (plan) => {
        const trade = await openAgainWhileSlow(loop.trades, plan.reference, {
          title: `Trade ${plan.reference}`,
          amount: '100.00',
          currency: 'EUR',
          seller_id: 'seller-1',
          ...(plan.lifecycle.milestones
            ? {
                milestones: [
                  { title: 'First half', amount: '50.00' },
                  { title: 'Second half', amount: '50.00' },
                ],
              }
            : {}),
        })
        tradeIds.set(plan.reference, trade.trade_id)
        const milestoneIds = trade.milestones?.map((milestone) => milestone.milestone_id) ?? []
        let proposalId = ''
        let milestoneStep = 0
        for (const [index, kind] of plan.lifecycle.steps.entries()) {
          const step = stepFor(kind, {
            by: plan.byPartner[index] ? 'partner' : 'platform',
            milestoneId: milestoneIds[Math.floor(milestoneStep / 2)] ?? '',
            proposalId,
            accept: plan.accept,
          })
          if (kind === 'deliver_milestone' || kind === 'release_milestone') milestoneStep++
          const result = await take(loop, plan.reference, trade.trade_id, step)
          if (kind === 'proposal') proposalId = (result as { proposal_id: string }).proposal_id
        }
      }),
    )
  }
  return tradeIds
}

/**
 * `openTradeForOrder`, run again while it refuses with [database_slow], as README tells an operator: its sent stamp came
 * back later than the 2 s it allows (twenty opens at once queue on the one connection of PGlite, and a loaded machine
 * slows each), nothing was sent and the order was set back. Any other failure is the test's.
 */
async function openAgainWhileSlow(...args: Parameters<typeof openTradeForOrder>): ReturnType<typeof openTradeForOrder> {
  for (;;) {
    try {
      return await openTradeForOrder(...args)
    } catch (error) {
      if (!(error instanceof TradeOperationError && error.code === 'database_slow')) throw error
    }
  }
}

function stepFor(
  kind: TradeOperation['kind'],
  {
    by,
    milestoneId,
    proposalId,
    accept,
  }: { by: Step['by']; milestoneId: string; proposalId: string; accept: boolean },
): Step {
  switch (kind) {
    case 'fund':
    case 'deliver':
    case 'release':
    case 'cancel':
      return { by, operation: { kind } }
    case 'deliver_milestone':
    case 'release_milestone':
      return { by, operation: { kind, milestoneId } }
    case 'dispute':
      return { by, operation: { kind, request: { reason: REASON, party: 'buyer' } } }
    case 'proposal':
      return {
        by,
        operation: { kind, request: { outcome: 'split', split_buyer_pct: '40', party: 'seller' } },
      }
    case 'respond':
      return { by, operation: { kind, proposalId, request: { accept, party: 'buyer' } } }
  }
}

async function take(
  loop: PlatformLoop,
  reference: string,
  tradeId: string,
  { by, operation }: Step,
): Promise<unknown> {
  if (by === 'partner') return runTradeOperation(loop.trades, reference, operation)
  return callTradeApi(loop.client, tradeId, operation)
}
