// A handler's system coming back (the forwarder's receiver, the RabbitMQ broker, a fork's API) pulls forward the
// retries its outage left. While it was away, every event that failed became a job backing off (plan-retry.ts: 5 s
// doubling up to an hour apart); without this the backlog waited out those waits while new events went through:
// after a 10-minute outage, hundreds of jobs for up to an hour. Now the first call of the handler that succeeds
// after an outage makes the jobs of the events that failed in it due at once (pullForwardJobs), and the dispatcher
// runs them.
//
// An outage, as one replica sees it: at least OUTAGE_MS in which every call of the handler it made failed, the
// failures said the system was away (isAwayFailure), and they were the events of more than one order. Anything
// else is left to the backoff, which spreads a job's attempts (REACTION_MAX_ATTEMPTS) over hours:
// - an event the receiver refuses (a 500 for that event alone, a 4xx) fails again however often it is pulled
//   forward: pulled forward at every later success, it spent its ten attempts within a minute;
// - a receiver that asks for a wait (a 429 or 503 with Retry-After) gets it: pulled forward at every call it let
//   through, a rate-limited backlog was sent again in bursts, each of them another 429 and another attempt;
// - the events of one order alone failing can be that order's trouble, not the system's.
// And one replica pulls a handler's retries forward at most once per PULL_FORWARD_INTERVAL_MS: a system that
// comes and goes spends at most one attempt of each job per interval besides the backoff's own.
//
// What is pulled forward is the jobs of the events this replica saw fail in the outage, each one's last failure
// saying the system was away (up to MAX_EVENTS_REMEMBERED of them; past that the rest wait out their backoff): never
// a job that failed for another reason, nor one whose retry was then refused or asked to wait (it keeps that
// backoff or wait), nor one failed for good (an operator's to retry: `reactions retry`). Kept in memory, per handler: a call
// costs a map lookup, and a statement runs only when an outage ends. Replicas that pull at once each move the
// jobs the other has not locked, and the claim still runs one order's jobs in sequence whatever their run_at.
// A call stopped at its lease's end or at shutdown is no failure here: it got no answer from the system.
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import type { ReactionEvent } from './reaction-event.js'
import { pullForwardJobs } from './reaction-job.repository.js'

/** How long every call of a handler must have failed before its next success pulls its retries forward. */
export const OUTAGE_MS = 5_000
/** The least time between two pull-forwards of one handler's retries by one replica. */
export const PULL_FORWARD_INTERVAL_MS = 60_000
/** The most events of one outage whose jobs are pulled forward; the rest wait out their backoff. */
export const MAX_EVENTS_REMEMBERED = 20_000

// the forward receiver's own gateway answering for a backend that is down
const GATEWAY_STATUSES = new Set([502, 503, 504])

/**
 * Whether a handler's failure says its system is away rather than refusing this event or asking for a wait: an
 * error whose code ends in `_unreachable` or `_timeout` (the built-in handlers' forward_unreachable,
 * forward_timeout, amqp_unreachable, amqp_timeout; a fork's handler may use the same endings), or the forwarder's
 * 502, 503 or 504, none of them with a Retry-After.
 */
export function isAwayFailure(failure: unknown): boolean {
  const { code, status, retryAfterMs } = (failure ?? {}) as { code?: unknown; status?: unknown; retryAfterMs?: unknown }
  if (typeof code !== 'string' || retryAfterMs !== undefined) return false
  if (code.endsWith('_unreachable') || code.endsWith('_timeout')) return true
  return code === 'forward_failed' && typeof status === 'number' && GATEWAY_STATUSES.has(status)
}

export interface RecoveryWatchDeps {
  db: Kysely<Database>
  clock: Clock
  logger: Logger
  /** The jobs were made due: the dispatcher looks for them now (the other replicas are woken by a NOTIFY). */
  pulledForward: (handler: string, jobs: number) => void
}

export interface RecoveryWatch {
  /** A call of `handler` for `event` threw `failure` (not stopped by its signal). */
  failed(handler: string, event: ReactionEvent, failure: unknown): void
  /** A call of `handler` succeeded: after an outage, the jobs of the events that failed in it are made due now. */
  succeeded(handler: string): void
}

interface Outage {
  since: number
  events: Set<string>
  firstOrderId: number
  manyOrders: boolean
}

export function createRecoveryWatch({ db, clock, logger, pulledForward }: RecoveryWatchDeps): RecoveryWatch {
  // per handler: its outage so far (failures that said its system is away, with no success since)
  const outages = new Map<string, Outage>()
  const lastPulledAt = new Map<string, number>()

  const pullForward = async (handler: string, outage: Outage) => {
    const now = clock.now()
    try {
      const jobs = await pullForwardJobs(db, { handler, eventIds: [...outage.events], now: new Date(now) })
      if (jobs === 0) return
      logger.info({ handler, jobs, failedForS: Math.round((now - outage.since) / 1000) }, 'reaction handler succeeds again after failing: its waiting retries are due now')
      pulledForward(handler, jobs)
    } catch (error) {
      logger.warn({ err: error, handler }, 'could not make the waiting retries of a recovered reaction handler due; they wait out their backoff')
    }
  }

  return {
    failed(handler, event, failure) {
      const outage = outages.get(handler)
      if (!isAwayFailure(failure)) {
        // its latest failure was its own or asked for a wait: its job keeps that failure's backoff or wait (a backlog
        // answered 429 as the receiver came back was pulled forward at the next 2xx, 5 s after it asked for 120)
        outage?.events.delete(event.eventId)
        return
      }
      if (!outage) {
        outages.set(handler, { since: clock.now(), events: new Set([event.eventId]), firstOrderId: event.orderId, manyOrders: false })
        return
      }
      if (outage.events.size < MAX_EVENTS_REMEMBERED) outage.events.add(event.eventId)
      if (event.orderId !== outage.firstOrderId) outage.manyOrders = true
    },
    succeeded(handler) {
      const outage = outages.get(handler)
      if (outage === undefined) return
      outages.delete(handler)
      const now = clock.now()
      if (now - outage.since < OUTAGE_MS || !outage.manyOrders || outage.events.size === 0) return
      if (now - (lastPulledAt.get(handler) ?? -Infinity) < PULL_FORWARD_INTERVAL_MS) return
      lastPulledAt.set(handler, now)
      void pullForward(handler, outage)
    },
  }
}
