// The forwarder under a real dispatcher, on a fake clock, with its job read from the database: run_at is exact, and
// a retry happens only when the test moves the clock to it. Called inside a describe: each test gets a fresh clock,
// and its dispatcher is stopped and its jobs cleared after it.
import { afterEach, beforeEach } from 'vitest'
import { createDispatcher, type Dispatcher } from '../../src/reactions/dispatcher.js'
import { createForwarder } from '../../src/reactions/forwarder.js'
import { createReactionRegistry } from '../../src/reactions/reaction-registry.js'
import { backoffDelayS } from '../../src/reconcile/backoff-delay.js'
import type { Logger } from '../../src/logger.js'
import { FakeClock } from './fake-clock.js'
import { moveNewOrder } from './orders.js'
import { clearReactions, TEST_DISPATCHER_SETTINGS, untilEventsReadable } from './reaction-jobs.js'
import { eventually } from './reconcile-poller.js'
import type { TestDatabase } from './test-database.js'

export function forwarderUnderDispatcher(
  database: TestDatabase,
  { secret, logger, referencePrefix }: { secret: string; logger: Logger; referencePrefix: string },
) {
  const settings = TEST_DISPATCHER_SETTINGS
  // the backoff after a first failed attempt: 7.5 s (base 10 s, half jitter)
  const half = () => 0.5
  let clock = new FakeClock(0)
  let dispatcher: Dispatcher | undefined
  let counter = 0

  beforeEach(() => {
    // a whole second, so that an HTTP-date names the same instant
    clock = new FakeClock(Math.floor(Date.now() / 1000) * 1000)
  })
  afterEach(async () => {
    await dispatcher?.stop()
    dispatcher = undefined
    await clearReactions(database.db)
  })

  /** The order's forwarder job, once it has a row. */
  const jobState = (orderId: number) =>
    database.db
      .selectFrom('reactionJobs')
      .select(['state', 'attempts', 'runAt', 'lastError'])
      .where('orderId', '=', orderId)
      .where('handler', '=', 'forwarder')
      .executeTakeFirst()

  return {
    settings,
    firstBackoffMs: backoffDelayS(1, settings.backoff, half) * 1000,
    /** This test's clock. */
    get clock(): FakeClock {
      return clock
    },
    /** A dispatcher running the forwarder to `url`, and an order moved to created: its one event; the order's id. */
    async forwardOneEvent(url: string): Promise<number> {
      const reactions = createReactionRegistry().on('trade.*', 'forwarder', createForwarder({ url, secret, timeoutMs: 5_000, clock }))
      dispatcher = createDispatcher({ db: database.db, handler: reactions.handler, streams: reactions, clock, logger, listen: database.listen, settings, random: half })
      await dispatcher.start()
      const orderId = await moveNewOrder(database.db, {
        externalReference: `${referencePrefix}-${++counter}`,
        statuses: ['created'],
        handlersFor: reactions.handlersFor,
        now: () => new Date(clock.now()),
      })
      await untilEventsReadable(database.db)
      return orderId
    },
    /** The job loop and the forwarder's stream are asleep (a timer each) and no handler runs: only the clock moves them on. */
    idle: () => eventually(() => dispatcher!.running === 0 && clock.pendingSleepers === 2, 'the dispatcher is idle'),
    jobState,
    /** The order's forwarder job once it is in `state` after `attempts` attempts. */
    async jobAfter(orderId: number, attempts: number, state: 'pending' | 'failed') {
      await eventually(async () => {
        const job = await jobState(orderId)
        return job?.attempts === attempts && job.state === state
      }, `the forwarder job is ${state} after ${attempts} attempt(s)`)
      const job = (await jobState(orderId))!
      return { ...job, runAt: new Date(job.runAt).getTime() }
    },
  }
}
