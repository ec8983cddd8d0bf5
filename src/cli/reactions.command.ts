// `reactions list|show|retry|skip`: the reaction jobs (one per event and handler) and the operator's
// way out of the dead letter. A failed job holds back its order's later events for its handler: retry it
// once the cause is fixed, or skip it to let them through.
// `reactions rebase`: after a restore onto another database server, the streams' positions moved below its
// transaction counter (rebaseStreamPositions in reaction-stream.repository.ts).
// `reactions release-stream`: a handler's stream lease given back, one a replica killed with its clock far ahead left
// holding every replica's new transitions back, with the jobs its holder handed off (releaseStreamLease).
import { type JobWaitedFor, retriedText } from '../reactions/retried-text.js'
import { Command, InvalidArgumentError, Option } from 'commander'
import { printable } from '../printable.js'
import { isJobId } from '../reactions/job-id.js'
import { listLimit, MAX_LIST_LIMIT } from './cli-arguments.js'
import { CommandFailedError, markTookEffect, printJson, printTable, setExitCode, UsageError, withDatabase, write, writeError } from './cli-context.js'

const STATES = ['pending', 'running', 'failed', 'done', 'skipped'] as const
type State = (typeof STATES)[number]

function jobId(value: string): string {
  // a typo is a usage error rather than a database error
  if (!isJobId(value)) throw new InvalidArgumentError('must be a job id (a positive whole number)')
  return value
}

// an empty name was taken as no filter at all: every handler's jobs, listed as if they were the one asked for
function handlerName(value: string): string {
  if (value.trim() === '') throw new InvalidArgumentError('must name a handler (reactions list shows them)')
  return value
}

export function registerReactionsCommands(reactions: Command): void {
  reactions
    .command('list')
    .description('list reaction jobs, newest first (with --state done or no state, also the events done on their first attempt: no job id)')
    .addOption(new Option('--state <state>', 'only jobs in this state').choices(STATES))
    .option('--handler <name>', 'only jobs of this handler', handlerName)
    .option('--limit <n>', `how many (at most ${MAX_LIST_LIMIT})`, listLimit, 50)
    .option('--json', 'print as JSON')
    .action(async (options: { state?: State; handler?: string; limit: number; json?: boolean }) => {
      const { jobsWaitedFor, listJobs } = await import('../reactions/reaction-job.repository.js')
      await withDatabase(async ({ db }) => {
        const jobs = await listJobs(db, {
          limit: options.limit,
          ...(options.state ? { state: options.state } : {}),
          ...(options.handler ? { handler: options.handler } : {}),
        })
        const pending = jobs.flatMap((job) => (job.state === 'pending' && job.id !== null ? [job.id] : []))
        const waits = await jobsWaitedFor(db, pending)
        const waitsFor = (job: { id: string | null }) => (job.id === null ? null : (waits.get(job.id) ?? null))
        if (options.json) {
          printJson(jobs.map((job) => ({ ...withNextRun(job), waitsFor: waitsFor(job) })))
          return
        }
        printTable(
          jobs.map((job) => ({
            id: job.id,
            order: job.externalReference === null ? null : printable(job.externalReference),
            seq: job.sequence,
            type: printable(job.type),
            handler: job.handler,
            state: job.state,
            attempts: job.attempts,
            // a job held back behind an earlier one runs when that one is done or skipped, not at its due time
            next: waitsFor(job) ? null : nextRun(job),
            error: cutForTable([waitingText(waitsFor(job)), job.lastError === null ? null : oneLine(job.lastError)].filter(Boolean).join('; ')) || null,
          })),
          '(no reaction jobs)',
        )
      })
    })

  reactions
    .command('show')
    .description('show one reaction job with its event and last error')
    .argument('<id>', 'the job id (from reactions list)', jobId)
    .option('--json', 'print as JSON')
    .action(async (id: string, options: { json?: boolean }) => {
      const { findJob, jobsWaitedFor, runsUnderStreamLease } = await import('../reactions/reaction-job.repository.js')
      await withDatabase(async ({ db }) => {
        const job = await findJob(db, id)
        if (!job) throw reactionNotFound(id)
        const waitsFor = (await jobsWaitedFor(db, job.state === 'pending' ? [job.id] : [])).get(job.id) ?? null
        // a killed replica's job waited out its lease with nothing said of release-stream, which ends the wait
        const underStreamLease = job.state === 'running' && (await runsUnderStreamLease(db, job.id))
        if (options.json) {
          printJson({ ...withNextRun(job), waitsFor, ...(job.state === 'running' ? { underStreamLease } : {}) })
          return
        }
        const { event } = job
        write(
          [
            `job        ${job.id}: ${job.handler} for ${printable(event.type)}`,
            `state      ${job.state} after ${job.attempts} attempt(s)`,
            `next run   ${waitsFor ? `once job ${waitsFor.id} (sequence ${waitsFor.sequence}, ${waitsFor.state}) is done or skipped` : (nextRun(job)?.toISOString() ?? '-')}${runningNote(job, underStreamLease)}`,
            `finished   ${job.finishedAt?.toISOString() ?? '-'}`,
            `event      ${event.eventId}`,
            `order      ${printable(event.externalReference)} (id ${event.orderId}), sequence ${event.sequence}`,
            `trade      ${printable(event.tradeId) || '-'}`,
            `move       ${printable(event.from ?? '(none)')} -> ${printable(event.to)} by ${event.source} at ${event.occurredAt.toISOString()}`,
            `last error ${job.lastError === null ? '-' : oneLine(job.lastError)}`,
          ].join('\n') + '\n',
        )
      })
    })

  reactions
    .command('retry')
    .description('run a failed (or waiting) job again now, its attempts counted afresh; --failed: every failed job')
    .argument('[id]', 'the job id (from reactions list)', jobId)
    .option('--failed', 'retry every failed job')
    .option('--json', 'print as JSON')
    .action(async (id: string | undefined, options: { failed?: boolean; json?: boolean }) => {
      if ((id === undefined) === (options.failed === undefined)) {
        throw new UsageError('reactions retry needs a job id or --failed (not both)')
      }
      const { retryFailedJobs, retryJob } = await import('../reactions/reaction-job.repository.js')
      // dated by the database's time, not this machine's (reaction-job.repository.ts). One update outside a
      // transaction: a stop signal lets it finish (withDatabase's changeInFlight)
      const changeInFlight = {
        change: id === undefined ? 'the retry of the failed jobs' : `the retry of job ${id}`,
        see: id === undefined ? '`reactions list` shows the jobs' : `\`reactions show ${id}\` shows its state`,
      }
      await withDatabase(async ({ db }) => {
        if (id === undefined) {
          const ids = await retryFailedJobs(db)
          if (ids.length > 0) await markTookEffect(JOBS_CHANGED)
          if (options.json) printJson({ retried: ids })
          else write(ids.length === 0 ? 'no failed reaction jobs\n' : `retrying ${ids.length} job(s): ${idList(ids)}\n`)
          return
        }
        await report(id, await retryJob(db, id), 'retried', options.json)
      }, { changeInFlight })
    })

  reactions
    .command('skip')
    .description('give up on a failed (or waiting) job: its order’s later events for its handler proceed')
    .argument('<id>', 'the job id (from reactions list)', jobId)
    .option('--json', 'print as JSON')
    .action(async (id: string, options: { json?: boolean }) => {
      const { skipJob } = await import('../reactions/reaction-job.repository.js')
      // one update outside a transaction: a stop signal lets it finish (withDatabase's changeInFlight)
      await withDatabase(
        async ({ db }) => {
          await report(id, await skipJob(db, id), 'skipped', options.json)
        },
        { changeInFlight: { change: `the skip of job ${id}`, see: `\`reactions show ${id}\` shows its state` } },
      )
    })

  reactions
    .command('rebase')
    .description("after a restore onto another database server: move the streams' positions below its transaction counter, in their order")
    .option('--dry-run', 'say what it would move, change nothing')
    .option('--json', 'print as JSON')
    .action(async (options: { dryRun?: boolean; json?: boolean }) => {
      const { rebaseStreamPositions, REBASE_LOCK_TIMEOUT } = await import('../reactions/reaction-stream.repository.js')
      await withDatabase(async ({ db, withoutTimeouts, logger }) => {
        const dryRun = options.dryRun === true
        // one statement per table rewrites every history row: no statement timeout ends it half way (it would roll back)
        const rebase = (on: typeof db) => rebaseStreamPositions(on, { now: new Date(), dryRun })
        let outcome: Awaited<ReturnType<typeof rebase>>
        try {
          outcome = await (withoutTimeouts ? withoutTimeouts(rebase) : rebase(db))
        } catch (error) {
          if ((error as { code?: unknown }).code !== '55P03') throw error
          throw new CommandFailedError(
            'tables_busy',
            `Could not lock the orders, their history and the reaction streams within ${REBASE_LOCK_TIMEOUT}: a transaction that writes them stays open (the "reaction stream held back" warning names the oldest); nothing was changed, run it again once it has ended`,
          )
        }
        if (options.json) printJson({ ...outcome, dryRun })
        if (outcome.result === 'not_ahead') {
          if (!options.json) {
            write(
              `no stream position is ahead of this server's transaction counter (largest ${outcome.largest ?? 'none'}, next transaction id ${outcome.next}): nothing to rebase\n`,
            )
          }
          return
        }
        if (outcome.result === 'no_room') {
          setExitCode(1)
          if (options.json) return
          throw new CommandFailedError(
            'rebase_no_room',
            `The positions of events not yet read span more transaction ids than this server has below its oldest open transaction: the stream ${printable(outcome.lowest.handler)} is at ${outcome.lowest.position} and the largest position is ${outcome.largest}, ${BigInt(outcome.largest) - BigInt(outcome.lowest.position)} apart, and at most ${outcome.top} fit below it; nothing was changed. End a transaction left open, or wait until the server's counter passes ${BigInt(outcome.largest) - BigInt(outcome.lowest.position) + 1n}, and run it again (a stream of a handler that is gone keeps the oldest place: delete its reaction_streams row)`,
          )
        }
        if (!dryRun) {
          logger.info({ ...outcome }, 'reaction stream positions rebased by an operator')
          await markTookEffect({ done: 'the stream positions were shifted', see: '`reactions rebase --dry-run` says none is ahead' })
        }
        if (options.json) return
        const { shift, largest, top, streams, events, orders, batches, clamped } = outcome
        write(
          [
            `${dryRun ? 'would shift' : 'shifted'} every reaction stream position back by ${shift} transaction ids, in their order: the largest from ${largest} to ${top}, below this server's next transaction id ${outcome.next}`,
            `  ${streams} stream place(s), ${events} event(s), ${orders} order(s), ${batches} batch record(s)`,
            `  ${clamped} position(s) below every stream's place (taken by every handler already) ${dryRun ? 'would be ' : ''}set to 0`,
            dryRun ? 'nothing was changed (--dry-run)' : 'the handlers now get every transition they had not taken, in order, and the new ones',
          ].join('\n') + '\n',
        )
      }, { committing: { change: 'the shift of the stream positions', see: '`reactions rebase --dry-run` says whether one is still ahead' } })
    })

  registerReleaseStream(reactions)
}

function registerReleaseStream(reactions: Command): void {
  reactions
    .command('release-stream')
    .description(
      "give back a handler's stream lease (one a replica killed with its clock far ahead left, holding the handler's new transitions back until it ends), and the jobs its holder handed off (running under it), pending and due now: the next replica to read the stream takes it; a holder still running writes nothing of its batch in flight, whose events run again",
    )
    .argument('<handler>', 'the handler whose stream it is (forwarder, amqp, or a fork\'s own; a name with no stream is answered with those there are)', handlerName)
    .option('--json', 'print as JSON')
    .action(async (handler: string, options: { json?: boolean }) => {
      const { releaseStreamLease } = await import('../reactions/reaction-stream.repository.js')
      await withDatabase(async ({ db, logger }) => {
        const outcome = await releaseStreamLease(db, handler)
        if (options.json) printJson({ handler, ...outcome })
        if (outcome.result === 'not_found') {
          setExitCode(1)
          if (options.json) return
          const streams = outcome.handlers.length === 0 ? 'there is none yet (a service makes them as it starts, and as it finds one of its handlers missing)' : `the streams are ${outcome.handlers.map(printable).join(', ')}`
          throw new CommandFailedError('stream_not_found', `No reaction stream of handler ${printable(handler)}: ${streams}`)
        }
        if (outcome.result === 'not_held') {
          if (!options.json) write(`reaction stream ${printable(handler)} holds no lease: nothing to release\n`)
          return
        }
        await markTookEffect({ done: 'the lease was released', see: '`reactions list` shows the jobs' })
        logger.info(
          { handler, leaseExpiresAt: outcome.leaseExpiresAt, leftS: outcome.leftS, freedJobs: outcome.freedJobs },
          'reaction stream lease released by an operator',
        )
        // a lease that had not run out may be a replica's still running (or one killed with its clock ahead): allowed,
        // and said, as what it had in hand runs again
        if (outcome.leftS !== null && outcome.leftS > 0) writeError(`${LIVE_LEASE_WARNING}\n`)
        if (options.json) return
        write(`released the lease on reaction stream ${printable(handler)}${leaseEnd(outcome.leaseExpiresAt, outcome.leftS)}: the next replica to read it takes it\n`)
        write(
          outcome.freedJobs === 0
            ? 'no job was running under that lease\n'
            : `gave back ${outcome.freedJobs} ${outcome.freedJobs === 1 ? 'job' : 'jobs'} its holder had handed off (running under that lease): pending, due now, attempts as they were\n`,
        )
      }, { committing: { change: `the release of the lease on reaction stream ${handler}`, see: '`reactions list` shows its jobs' } })
    })
}

const LIVE_LEASE_WARNING =
  "warning: that lease had not run out: if the replica holding it still runs, the batch it is reading and the jobs it handed off run again elsewhere (at least once, each with its event id); a replica stopped or killed loses nothing"

/** When a released lease was to end, by the database's clock. */
function leaseEnd(at: Date | null, leftS: number | null): string {
  if (at === null || leftS === null) return ''
  const seconds = Math.round(Math.abs(leftS))
  return leftS >= 0 ? `, held until ${at.toISOString()} (${seconds} s from now by the database's clock)` : `, which had run out at ${at.toISOString()} (${seconds} s ago by the database's clock)`
}

/** How many job ids a line names: an outage fails hundreds of jobs, and `--json` lists them all. */
const IDS_NAMED = 20

/** The first IDS_NAMED ids, and how many more there are. */
function idList(ids: readonly string[]): string {
  if (ids.length <= IDS_NAMED) return ids.join(', ')
  return `${ids.slice(0, IDS_NAMED).join(', ')} and ${ids.length - IDS_NAMED} more (--json lists them all)`
}

/** What `reactions retry` and `skip` changed, said when only their output is lost. */
const JOBS_CHANGED = { done: 'the job states were changed', see: 'see them with `reactions list`' }

async function report(
  id: string,
  outcome: { result: 'retried' | 'skipped' | 'not_found' | 'not_allowed'; state?: string; waitsBehind?: JobWaitedFor },
  done: 'retried' | 'skipped',
  json: boolean | undefined,
): Promise<void> {
  if (outcome.result === done) await markTookEffect(JOBS_CHANGED)
  if (json) printJson({ id, ...outcome })
  if (outcome.result === done) {
    if (!json) write(done === 'retried' ? `${retriedText(id, outcome.waitsBehind)}\n` : `job ${id} skipped\n`)
    return
  }
  setExitCode(1)
  if (json) return
  if (outcome.result === 'not_found') throw reactionNotFound(id)
  throw new CommandFailedError(
    done === 'retried' ? 'job_not_retryable' : 'job_not_skippable',
    `Job ${id} is ${outcome.state}: only a failed or pending job can be ${done}`,
  )
}

function reactionNotFound(id: string): CommandFailedError {
  return new CommandFailedError('reaction_not_found', `No reaction job ${id}`)
}

/**
 * When a job runs next: a pending job's due time, a running one's lease end (when it is taken again if its replica
 * is gone); none for a finished job, whose run_at is the lease end of its last claim (--json gave it, minutes ahead)
 */
function nextRun(job: { state: string; runAt: Date }): Date | null {
  return job.state === 'pending' || job.state === 'running' ? job.runAt : null
}

function withNextRun<T extends { state: string; runAt: Date }>(job: T): Omit<T, 'runAt'> & { runAt: Date | null } {
  return { ...job, runAt: nextRun(job) }
}

/** What a running job's next run is: its lease's end, and what ends the wait sooner when its replica was killed. */
function runningNote(job: { state: string; handler: string }, underStreamLease: boolean): string {
  if (job.state !== 'running') return ''
  const end = " (its lease's end: it runs again then if the replica running it is gone"
  return underStreamLease
    ? `${end}; it was handed off under the ${job.handler} stream's lease: if that replica was killed, \`reactions release-stream ${job.handler}\` gives it back now)`
    : `${end})`
}

/** A held-back job's cell: what it waits for (its order's events reach a handler in order). */
function waitingText(waitsFor: JobWaitedFor | null): string | null {
  return waitsFor === null ? null : `waits for job ${waitsFor.id} (${waitsFor.state}), an earlier event of its order`
}

/** A stored error on one line, whole, for a field (an error text may hold newlines). */
function oneLine(text: string): string {
  return printable(text.replace(/\s+/g, ' '))
}

/** A line cut for a table cell: the table is a summary, and `show` has the whole error (its end often says the most). */
function cutForTable(line: string): string {
  return line.length > 120 ? `${line.slice(0, 119)}…` : line
}
