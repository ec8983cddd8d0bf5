// The clock guard: a replica whose clock is far from the database's takes no lease and claims nothing.
//
// Leases and due times are written by the writer's clock (a parameter, never SQL now(): the injected clock decides
// what is due) and read by every other replica's. A replica 600 s ahead wrote a stream lease that held every
// replica's forwards back 10.5 min after it was killed, and retries due 600 s late; one a day ahead claimed every
// order until tomorrow. So the poller's claim, the reaction job loop's claim and the stream workers' leases ask
// this first, and while the offset between the loops' clock and the database's clock_timestamp() is past the bound
// they claim nothing (a stream's lease held here is given back), say so once in an error line, count each refusal,
// and go on by themselves once the offset is back within it. Webhook ingest does not ask: it writes no lease.
//
// Work already under way when the clock went off (a handler running) cannot be refused: its outcome is written by
// the database's time instead (timeToWrite), so a retry is due after its backoff, not a day late by a clock a day
// ahead, nor at once by one a day behind.
//
// The offset is measured against the clock the loops use (the service's injected Clock), so what is judged is the
// time the leases would be written with. It is measured again every CLOCK_RECHECK_MS by the machine's monotonic
// timer, and at once when the clock stepped since (NTP correcting a VM after a pause), never more than one at a time.
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Logger } from '../logger.js'
import type { Database } from './database.js'
import { databaseClockOffsetMs } from './ping-database.js'

/**
 * How far this replica's clock may be from the database's, either way, before it stops taking leases. A stream's
 * lease is 30 s (STREAM_LEASE_MAX_MS) and a job's or a poll's 300 s, and a holder gives its lease up 5 s before
 * its end: within the bound a dead replica's stream is held back 60 s at most and a poll or job 330 s, and a clock
 * 5-30 s off (PartnerEscrowDatabaseClockOffset warns from 5 s) can at worst run one lease's work twice. Tighter
 * would stop every replica at an NTP slew or a slow round trip (the measurement is off by up to half of it).
 */
export const CLOCK_OFFSET_BOUND_MS = 30_000

/** How often the offset is measured again while claims ask (by the machine's monotonic timer). */
export const CLOCK_RECHECK_MS = 10_000

/** A step of the clock against the monotonic timer since the last measurement past this measures again at once. */
const CLOCK_STEP_MS = 1_000

/** The loops that ask, as the refusal metric's label. */
export type GuardedLoop = 'poller' | 'reaction_jobs' | 'reaction_streams'

export const GUARDED_LOOPS: readonly GuardedLoop[] = ['poller', 'reaction_jobs', 'reaction_streams']

export interface ClockGuard {
  /**
   * Whether `loop` may claim or take a lease now: the last offset measured is within the bound. A refusal is counted
   * (onRefused). A measurement that failed (the database away) keeps the last verdict: the claim fails there anyway.
   */
  allows(loop: GuardedLoop): Promise<boolean>
  /** The last offset measured, ms the database's clock is ahead of this one's (negative: behind); undefined before one. */
  readonly offsetMs: number | undefined
  /**
   * The time (ms since the epoch) to write the outcome of work already under way by (a reaction's retry due time, a
   * lease given back or renewed): this clock's now while it is within the bound of the database's, else the database's
   * time as measured (this clock's now plus the offset). Within the bound it is not corrected: claims compare due
   * times with their own clocks, and a test's clock keeps deciding what is due. Measures first when allows() would;
   * refuses nothing.
   */
  timeToWrite(): Promise<number>
}

export function clockOffMessage(offsetMs: number, boundMs = CLOCK_OFFSET_BOUND_MS): string {
  const seconds = Math.round(Math.abs(offsetMs) / 1000)
  const side = offsetMs < 0 ? 'ahead of' : 'behind'
  return (
    `this machine's clock is ${seconds} s ${side} the database's, past the ${boundMs / 1000} s bound: the poller claims no order and the ` +
    `reaction dispatcher takes no job or stream lease until it is back within it (webhooks are still received); fix this machine's ` +
    'clock (timedatectl, chrony, ntpd), or the database server\'s when every replica says so'
  )
}

export function createClockGuard({
  db,
  clock,
  logger,
  boundMs = CLOCK_OFFSET_BOUND_MS,
  recheckMs = CLOCK_RECHECK_MS,
  onRefused,
}: {
  db: Kysely<Database>
  clock: Pick<Clock, 'now'>
  logger: Logger
  boundMs?: number
  recheckMs?: number
  onRefused?: ((loop: GuardedLoop) => void) | undefined
}): ClockGuard {
  let offsetMs: number | undefined
  let off = false
  // when the last measurement was made: the monotonic timer's and the clock's time
  let measuredAt: { monotonic: number; clock: number } | undefined
  let measuring: Promise<void> | undefined

  const due = () => {
    if (!measuredAt) return true
    const elapsed = performance.now() - measuredAt.monotonic
    return elapsed >= recheckMs || Math.abs(clock.now() - measuredAt.clock - elapsed) > CLOCK_STEP_MS
  }

  const measure = async () => {
    try {
      const measured = await databaseClockOffsetMs(db, clock)
      offsetMs = measured
      measuredAt = { monotonic: performance.now(), clock: clock.now() }
      const nowOff = Math.abs(measured) > boundMs
      if (nowOff && !off) {
        logger.error({ offsetS: Math.round(measured / 1000), boundS: boundMs / 1000 }, clockOffMessage(measured, boundMs))
      } else if (!nowOff && off) {
        logger.info(
          { offsetS: Math.round(measured / 1000), boundS: boundMs / 1000 },
          "this machine's clock is back within the bound of the database's: the poller and the reaction dispatcher take leases again",
        )
      }
      off = nowOff
    } catch {
      // the database away: the claim that follows fails on it and says so; the next ask measures again
      measuredAt = undefined
    }
  }

  const measureIfDue = async () => {
    if (!due()) return
    measuring ??= measure().finally(() => {
      measuring = undefined
    })
    await measuring
  }

  return {
    get offsetMs() {
      return offsetMs
    },
    async timeToWrite() {
      await measureIfDue()
      return off && offsetMs !== undefined ? clock.now() + offsetMs : clock.now()
    },
    async allows(loop) {
      await measureIfDue()
      if (!off) return true
      try {
        onRefused?.(loop)
      } catch (error) {
        logger.warn({ err: error }, 'onRefused hook threw')
      }
      return false
    },
  }
}
