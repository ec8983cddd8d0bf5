// A handler's system coming back (the forwarder's receiver, the RabbitMQ broker, a fork's API) pulls its waiting
// retries forward. While it was away, every failed event became a job backing off (plan-retry.ts: 5 s doubling
// up to an hour apart), and without this the backlog waited out those waits while new events went through: after
// a 10-minute outage, hundreds of jobs for up to an hour. Now the first call of the handler that succeeds after
// an outage makes its jobs waiting for a later run_at due at once (pullForwardJobs), and the dispatcher runs them.
//
// An outage, as one replica sees it: at least OUTAGE_MS in which every call of the handler it made failed (from the
// first failure after a success). A call the dispatcher stopped at its lease's end is no failure here: it got no
// answer from the handler's system (the built-in handlers give up on their own first: FORWARD_TIMEOUT_MS,
// AMQP_TIMEOUT_MS). Kept in memory, per handler: a success costs a map lookup, and a statement only ends an
// outage. A handler that fails now and then among successes (one bad event, one receiver of three down) is not
// pulled forward: its failures are not an outage that ended, and pulling its jobs forward on every success would
// spend their attempts (REACTION_MAX_ATTEMPTS) within minutes instead of spreading them over the backoff's hours.
// One outage ends in one pull-forward per replica that saw it, so at most one every OUTAGE_MS per handler and
// replica; replicas that pull at once each move the jobs the other has not locked (pullForwardJobs), and the
// claim still runs one order's jobs in sequence whatever their run_at.
//
// The RabbitMQ publisher reconnecting is no signal of its own: it opens its connection inside a publish, whose
// confirm (the success) follows within a round trip, and a new connection whose publish is then returned
// unroutable or nacked is no recovery worth spending the backlog's attempts on.
//
// A job whose wait a receiver asked for (Retry-After) is pulled forward too: only its error text records that, and
// the 2xx that ends the outage is that receiver's newer word than the answer that asked for the wait (a maintenance
// page's "Retry-After: 3600" would otherwise hold the backlog for the hour). A receiver still limiting calls
// answers the pulled-forward ones 429 with a new Retry-After, which they then wait out. Failed jobs stay failed:
// they are an operator's to retry (`reactions retry`).
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import { pullForwardJobs } from './reaction-job.repository.js'

/** How long every call of a handler must have failed before its next success pulls its retries forward. */
export const OUTAGE_MS = 5_000

export interface RecoveryWatchDeps {
  db: Kysely<Database>
  clock: Clock
  logger: Logger
  /** The jobs were made due: the dispatcher looks for them now (the other replicas are woken by a NOTIFY). */
  pulledForward: (handler: string, jobs: number) => void
}

export interface RecoveryWatch {
  /** A call of `handler` threw. */
  failed(handler: string): void
  /** A call of `handler` succeeded: after an outage, its retries waiting for a later run_at are made due now. */
  succeeded(handler: string): void
}

export function createRecoveryWatch({ db, clock, logger, pulledForward }: RecoveryWatchDeps): RecoveryWatch {
  // per handler: when its calls began failing, with no success since (as seen by this replica)
  const failingSince = new Map<string, number>()

  const pullForward = async (handler: string, since: number) => {
    const now = clock.now()
    try {
      const jobs = await pullForwardJobs(db, { handler, now: new Date(now) })
      if (jobs === 0) return
      logger.info({ handler, jobs, failedForS: Math.round((now - since) / 1000) }, 'reaction handler succeeds again after failing: its waiting retries are due now')
      pulledForward(handler, jobs)
    } catch (error) {
      logger.warn({ err: error, handler }, 'could not make the waiting retries of a recovered reaction handler due; its next success tries again')
      // (unless a failure began another outage meanwhile)
      if (!failingSince.has(handler)) failingSince.set(handler, since)
    }
  }

  return {
    failed(handler) {
      if (!failingSince.has(handler)) failingSince.set(handler, clock.now())
    },
    succeeded(handler) {
      const since = failingSince.get(handler)
      if (since === undefined) return
      failingSince.delete(handler)
      if (clock.now() - since >= OUTAGE_MS) void pullForward(handler, since)
    },
  }
}
