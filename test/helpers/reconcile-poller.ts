// A poller over a test database with small, explicit settings; every test names what it changes.
import type { Kysely } from 'kysely'
import type { Clock } from '../../src/clock.js'
import type { ClockGuard } from '../../src/db/clock-guard.js'
import type { Database } from '../../src/db/database.js'
import type { Logger } from '../../src/logger.js'
import type { TradeFetcher } from '../../src/reconcile/poll-order.js'
import {
  createPoller,
  type Poller,
  type PollerSettings,
  type PollResult,
  type RunSummary,
} from '../../src/reconcile/poller.js'
import type { FakeClock } from './fake-clock.js'
import { testLogger } from './log-sink.js'
import { TEST_OBSERVATION_SETTINGS } from './orders.js'

export const TEST_POLLER_SETTINGS: PollerSettings = {
  intervalS: 30,
  concurrency: 4,
  batchSize: 100,
  observation: TEST_OBSERVATION_SETTINGS,
  leaseS: 300,
  backoff: { baseS: 30, capS: 3_600 },
}

export interface TestPoller extends Poller {
  /** Every result onPollResult reported, in order. */
  readonly reported: PollResult[]
  /** Every cycle onCycle reported as finished, in order. */
  readonly cycles: RunSummary[]
}

export function testPoller({
  db,
  fetcher,
  clock,
  replica = 'replica-test',
  settings = {},
  random = () => 0.5,
  logger = testLogger(),
  clockGuard,
}: {
  db: Kysely<Database>
  fetcher: TradeFetcher
  clock: Clock
  replica?: string
  settings?: Partial<PollerSettings>
  random?: () => number
  logger?: Logger
  clockGuard?: ClockGuard
}): TestPoller {
  const reported: PollResult[] = []
  const cycles: RunSummary[] = []
  const poller = createPoller({
    db,
    fetcher,
    clock,
    logger,
    replica,
    random,
    settings: { ...TEST_POLLER_SETTINGS, ...settings },
    onPollResult: (result) => reported.push(result),
    onCycle: (summary) => cycles.push(summary),
    clockGuard,
  })
  return Object.assign(poller, { reported, cycles })
}

/** A promise with its resolve and reject outside, to hold a fake platform call open. */
export function deferred<T>(): {
  promise: Promise<T>
  resolve: (value: T) => void
  reject: (error: unknown) => void
} {
  let resolve!: (value: T) => void
  let reject!: (error: unknown) => void
  const promise = new Promise<T>((res, rej) => {
    resolve = res
    reject = rej
  })
  return { promise, resolve, reject }
}

/**
 * POLL_INTERVAL_S for a whole service on a FakeClock: a length no other loop sleeps (the dispatcher's safety
 * sweep sleeps 30 s), so `pollerSleeps` counts the poller's sleeps alone. Time moved before the poller is
 * asleep never wakes it: a test waits for its sleep before each `advance`.
 */
export const SERVICE_POLL_INTERVAL_MS = 41_000
export const pollerSleeps = (clock: FakeClock) => clock.sleeps.filter((ms) => ms === SERVICE_POLL_INTERVAL_MS).length

/** Waits (on real time, briefly) until `condition` holds: for tests that wait for background work. */
export async function eventually(
  condition: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 20_000,
) {
  const deadline = Date.now() + timeoutMs
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}
