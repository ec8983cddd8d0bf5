// `reactions list|show|retry|skip` against a database holding jobs in every state.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { applyObservation } from '../src/orders/apply-observation.js'
import { createOrder } from './helpers/orders.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { claimReactionJobs, completeJob, failJob, reactionJobStats, skipJobNotTaken } from '../src/reactions/reaction-job.repository.js'
import { ensureReactionStreams, readReactionStream, type StreamOutcome, writeReactionStream } from '../src/reactions/reaction-stream.repository.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { runCommand } from './helpers/cli-in-process.js'
import { untilEventsReadable } from './helpers/reaction-jobs.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

describe('the reactions command', () => {
  let database: TestDatabase
  const ids: Record<string, string> = {}
  const run = (...args: string[]) => runCommand(['reactions', ...args], database.db)
  const stateOf = async (id: string) =>
    (await database.db.selectFrom('reactionJobs').select('state').where('id', '=', id).executeTakeFirstOrThrow()).state

  beforeAll(async () => {
    database = await createTestDatabase()
    const reactions = createReactionRegistry().on('trade.*', 'ledger', async () => {}).on('trade.funded', 'ship-goods', async () => {})
    await ensureReactionStreams(database.db, reactions.names, new Date())
    const { order } = await createOrder(database.db, { externalReference: 'cli-1' })
    const now = new Date('2026-05-01T10:00:00Z')
    for (const status of ['created', 'funded']) {
      await applyObservation(
        database.db,
        { target: { orderId: order.id }, tradeId: 'trd_cli-1', status, source: 'webhook', observedAt: now },
        { staleAfterS: 3_600, handlersFor: reactions.handlersFor },
      )
    }
    // as the streams' batches write them: ledger seq 1 done, ledger seq 2 still pending (behind a retry, say),
    // ship-goods failed with a two-line error
    const outcome = {
      ledger: (sequence: number): Omit<StreamOutcome, 'event' | 'createdAt'> =>
        sequence === 1 ? { state: 'done', attempts: 1, runAt: now, lastError: null } : { state: 'pending', attempts: 0, runAt: now, lastError: null },
      'ship-goods': (): Omit<StreamOutcome, 'event' | 'createdAt'> => ({
        state: 'failed',
        attempts: 1,
        runAt: now,
        lastError: 'Error: warehouse said no\n\u001b[31mred\u001b[0m',
      }),
    }
    // a transaction of another suite on the same server withholds the events from the reads until it ends
    await untilEventsReadable(database.db)
    for (const handler of ['ledger', 'ship-goods'] as const) {
      const { events } = await readReactionStream(database.db, { handler, leaseToken: 'cli', now, leaseEnd: new Date(now.getTime() + 60_000), limit: 10 })
      const mine = events.filter((entry) => reactions.handlersFor(entry.event.type).includes(handler))
      await writeReactionStream(database.db, {
        handler,
        leaseToken: 'cli',
        place: events.at(-1)!,
        outcomes: mine.map((entry) => ({ event: entry.event, createdAt: now, ...outcome[handler](entry.event.sequence) })),
        now,
        leaseEnd: new Date(now.getTime() + 60_000),
      })
    }
    const rows = await database.db.selectFrom('reactionJobs').select(['id', 'handler', 'sequence']).execute()
    for (const row of rows) ids[`${row.handler}-${row.sequence}`] = String(row.id)
  })
  afterAll(async () => {
    await database.close()
  })

  it('counts pending, running and failed jobs and the age of the oldest to run for the metrics', async () => {
    const now = new Date('2026-05-01T10:05:00Z')
    const createdAt = await database.db.selectFrom('reactionJobs').select('createdAt').where('id', '=', ids['ledger-2']!).executeTakeFirstOrThrow()
    const stats = await reactionJobStats(database.db, now)
    expect(stats).toEqual({
      pending: 1,
      running: 0,
      failed: 1,
      oldestPendingAgeS: Math.max(0, (now.getTime() - new Date(createdAt.createdAt).getTime()) / 1000),
    })
    const metrics = createMetrics({ reactionJobs: () => reactionJobStats(database.db, now) }, { defaultMetrics: false })
    const scrape = await metrics.registry.metrics()
    expect(scrape).toMatch(/^reaction_jobs_pending 1$/m)
    expect(scrape).toMatch(/^reaction_jobs_running 0$/m)
    expect(scrape).toMatch(/^reaction_jobs_failed 1$/m)
  })

  it('lists jobs newest first, filtered by state and handler, as a table or JSON', async () => {
    const all = await run('list')
    expect(all.code).toBe(0)
    const lines = all.stdout.trim().split('\n')
    expect(lines[0]).toMatch(/^id\s+order\s+seq\s+type\s+handler\s+state\s+attempts\s+next\s+error$/)
    expect(lines).toHaveLength(4)
    const failed = await run('list', '--state', 'failed', '--json')
    expect(JSON.parse(failed.stdout)).toMatchObject([
      { id: ids['ship-goods-2'], handler: 'ship-goods', state: 'failed', attempts: 1, type: 'trade.funded', sequence: 2, externalReference: 'cli-1' },
    ])
    // the error is one line, its control codes shown escaped
    const table = await run('list', '--state', 'failed')
    expect(table.stdout).toContain('Error: warehouse said no \\u001b[31mred\\u001b[0m')
    expect(table.stdout).not.toContain('\u001b')
    const ledger = JSON.parse((await run('list', '--handler', 'ledger', '--json')).stdout) as { state: string }[]
    expect(ledger.map((job) => job.state)).toEqual(['pending', 'done'])
    expect((await run('list', '--handler', 'nobody')).stdout).toBe('(no reaction jobs)\n')
    const bad = await run('list', '--state', 'lost')
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('Allowed choices are pending, running, failed, done, skipped')
    // an empty handler name is no handler's: it listed every handler's jobs
    for (const name of ['', ' ']) {
      const empty = await run('list', '--handler', name)
      expect([empty.code, empty.stdout], JSON.stringify(name)).toEqual([2, ''])
      expect(empty.stderr).toContain('must name a handler')
    }
  })

  it('shows one job with its event', async () => {
    const shown = await run('show', ids['ship-goods-2']!)
    expect(shown.code).toBe(0)
    expect(shown.stdout).toContain(`job        ${ids['ship-goods-2']}: ship-goods for trade.funded`)
    expect(shown.stdout).toContain('state      failed after 1 attempt(s)')
    expect(shown.stdout).toContain('order      cli-1')
    expect(shown.stdout).toContain('move       created -> funded by webhook at 2026-05-01T10:00:00.000Z')
    // the error on one line, its control codes shown escaped
    expect(shown.stdout).toContain('\nlast error Error: warehouse said no \\u001b[31mred\\u001b[0m\n')
    expect(shown.stdout).not.toContain('\u001b')
    const json = JSON.parse((await run('show', ids['ship-goods-2']!, '--json')).stdout)
    expect(json.event).toMatchObject({ type: 'trade.funded', from: 'created', to: 'funded', sequence: 2, tradeId: 'trd_cli-1' })
    const missing = await run('show', '987654')
    expect(missing).toMatchObject({ code: 1, stderr: 'No reaction job 987654 [reaction_not_found]\n' })
    expect((await run('show', 'abc')).code).toBe(2)
  })

  it('refuses with exit 2 a job id past the largest bigint, before the database sees it', async () => {
    for (const command of ['show', 'retry', 'skip']) {
      const result = await run(command, '9223372036854775808')
      expect(result.code).toBe(2)
      expect(result.stderr).toContain('must be a job id')
      expect(result.stderr).not.toContain('out of range')
    }
    expect(await run('show', '9223372036854775807')).toMatchObject({ code: 1, stderr: 'No reaction job 9223372036854775807 [reaction_not_found]\n' })
  })

  it('retries a failed job, refuses a finished one, and needs exactly one of an id and --failed', async () => {
    expect(await run('retry', ids['ledger-1']!)).toMatchObject({
      code: 1,
      stdout: '',
      stderr: `Job ${ids['ledger-1']} is done: only a failed or pending job can be retried [job_not_retryable]\n`,
    })
    const refused = await run('retry', ids['ledger-1']!, '--json')
    expect([refused.code, JSON.parse(refused.stdout), refused.stderr]).toEqual([1, { id: ids['ledger-1'], result: 'not_allowed', state: 'done' }, ''])
    expect((await run('retry')).code).toBe(2)
    expect((await run('retry', ids['ship-goods-2']!, '--failed')).code).toBe(2)
    const all = await run('retry', '--failed', '--json')
    expect(JSON.parse(all.stdout)).toEqual({ retried: [ids['ship-goods-2']] })
    expect(await stateOf(ids['ship-goods-2']!)).toBe('pending')
    expect((await run('retry', '--failed')).stdout).toBe('no failed reaction jobs\n')
    expect(await run('retry', ids['ship-goods-2']!)).toMatchObject({ code: 0, stdout: `job ${ids['ship-goods-2']} runs again now\n` })
    expect(await run('retry', '987654')).toMatchObject({ code: 1, stdout: '', stderr: 'No reaction job 987654 [reaction_not_found]\n' })
    const json = await run('retry', '987654', '--json')
    expect([json.code, JSON.parse(json.stdout), json.stderr]).toEqual([1, { id: '987654', result: 'not_found' }, ''])
  })

  // found from outside: a job held back behind its order's failed earlier one was said to run "again now"
  it('says, when it retries a job held back behind an earlier one of its order, which one it waits for', async () => {
    await database.db.updateTable('reactionJobs').set({ state: 'failed' }).where('id', '=', ids['ledger-1']!).execute()
    try {
      expect(await run('retry', ids['ledger-2']!)).toMatchObject({
        code: 0,
        stdout:
          `job ${ids['ledger-2']} is pending again, and runs once job ${ids['ledger-1']} (an earlier event of its order for ` +
          "the same handler, failed) is done or skipped: one order's events reach a handler in order\n",
      })
      const json = JSON.parse((await run('retry', ids['ledger-2']!, '--json')).stdout)
      expect(json).toEqual({ id: ids['ledger-2'], result: 'retried', waitsBehind: { id: ids['ledger-1'], sequence: 1, state: 'failed' } })
    } finally {
      await database.db.updateTable('reactionJobs').set({ state: 'done' }).where('id', '=', ids['ledger-1']!).execute()
    }
    expect((await run('retry', ids['ledger-2']!)).stdout).toBe(`job ${ids['ledger-2']} runs again now\n`)
  })

  it('lists an event its handler took on the first attempt: done, with no job id', async () => {
    const now = new Date('2026-05-01T11:00:00Z')
    await ensureReactionStreams(database.db, ['audit'], now)
    const { order } = await createOrder(database.db, { externalReference: 'cli-first' })
    await applyObservation(
      database.db,
      { target: { orderId: order.id }, tradeId: 'trd_cli-first', status: 'created', source: 'poll', observedAt: now },
      { staleAfterS: 3_600, handlersFor: () => ['audit'] },
    )
    const lease = { handler: 'audit', leaseToken: 'cli', now, leaseEnd: new Date(now.getTime() + 60_000) }
    // a transaction of another suite on the same server withholds the event from the read until it ends
    await untilEventsReadable(database.db)
    const { events } = await readReactionStream(database.db, { ...lease, limit: 10 })
    expect(events).toHaveLength(1)
    await writeReactionStream(database.db, { ...lease, place: events[0]!, outcomes: [], done: [events[0]!.historyId] })
    const listed = JSON.parse((await run('list', '--state', 'done', '--handler', 'audit', '--json')).stdout)
    expect(listed).toMatchObject([{ id: null, eventId: events[0]!.event.eventId, handler: 'audit', state: 'done', attempts: 1, externalReference: 'cli-first' }])
    const table = (await run('list', '--handler', 'audit')).stdout.trim().split('\n')
    expect(table[1]).toMatch(/^-\s+cli-first\s+1\s+trade\.created\s+audit\s+done\s+1\s+-\s+-$/)
    // not a job: the other states do not list it
    expect((await run('list', '--state', 'pending', '--handler', 'audit')).stdout).toBe('(no reaction jobs)\n')
  })

  it('skips a pending job and refuses, with a code, to skip a done or a skipped one', async () => {
    expect(await run('skip', ids['ledger-2']!)).toMatchObject({ code: 0, stdout: `job ${ids['ledger-2']} skipped\n` })
    expect(await stateOf(ids['ledger-2']!)).toBe('skipped')
    expect(await run('skip', ids['ledger-1']!)).toMatchObject({
      code: 1,
      stdout: '',
      stderr: `Job ${ids['ledger-1']} is done: only a failed or pending job can be skipped [job_not_skippable]\n`,
    })
    expect(await run('skip', ids['ledger-2']!)).toMatchObject({
      code: 1,
      stdout: '',
      stderr: `Job ${ids['ledger-2']} is skipped: only a failed or pending job can be skipped [job_not_skippable]\n`,
    })
    expect(await run('skip', '987654')).toMatchObject({ code: 1, stdout: '', stderr: 'No reaction job 987654 [reaction_not_found]\n' })
  })

  it('shows why a job was skipped without a call (its handler no longer takes its type), the error before it too', async () => {
    const now = new Date('2026-05-01T12:00:00Z')
    await ensureReactionStreams(database.db, ['amqp'], now)
    const { order } = await createOrder(database.db, { externalReference: 'cli-narrowed' })
    await applyObservation(
      database.db,
      { target: { orderId: order.id }, tradeId: 'trd_cli-narrowed', status: 'created', source: 'poll', observedAt: now },
      { staleAfterS: 3_600, handlersFor: () => ['amqp'] },
    )
    const lease = { handler: 'amqp', leaseToken: 'cli', now, leaseEnd: new Date(now.getTime() + 60_000) }
    await untilEventsReadable(database.db)
    const { events } = await readReactionStream(database.db, { ...lease, limit: 10 })
    const unroutable = 'AmqpPublishError: no queue is bound to exchange "partner-escrow" for routing key trade.created'
    await writeReactionStream(database.db, {
      ...lease,
      place: events[0]!,
      outcomes: [{ event: events[0]!.event, createdAt: now, state: 'pending', attempts: 1, runAt: now, lastError: unroutable }],
    })
    // the dispatcher of a service restarted with AMQP_EVENTS=trade.funded claims it, and skips it uncalled (the
    // last test: the claim takes the other pending jobs too)
    const [job] = (await claimReactionJobs(database.db, { now, limit: 10, leaseMs: 60_000, leaseToken: 'narrowed' })).filter(
      (claimed) => claimed.handler === 'amqp',
    )
    const reason = 'handler amqp no longer takes trade.created (AMQP_EVENTS); skipped without running'
    expect(await skipJobNotTaken(database.db, { id: job!.id, leaseToken: 'narrowed', now, reason })).toBe(true)

    const shown = await run('show', job!.id)
    expect(shown.stdout).toContain('state      skipped after 1 attempt(s)')
    // one line, whole: the reason first, then what the job had failed with before, to its end
    expect(shown.stdout).toContain(`\nlast error ${reason} (the error before: ${unroutable})\n`)
    // the table's cell is cut short (show has the rest)
    const table = (await run('list', '--state', 'skipped', '--handler', 'amqp')).stdout.trim().split('\n')
    expect(table[1]).toMatch(/ amqp +skipped +1 +- +handler amqp no longer takes trade\.created \(AMQP_EVENTS\); skipped without running \(the error before: [^)]*…$/)
  })
})

// a claim sets run_at to its lease's end and a finished job keeps it: --json gave a done or failed job's runAt as
// minutes in the future, where the text shows -
describe('reactions list and show --json of finished jobs', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })

  it('give runAt null for a done and a failed job, as the text shows -, and name the job a held-back one waits for', async () => {
    const reactions = createReactionRegistry().on('trade.*', 'ledger', async () => {})
    const now = new Date('2026-05-01T10:00:00Z')
    await ensureReactionStreams(database.db, reactions.names, now)
    const { order } = await createOrder(database.db, { externalReference: 'cli-finished' })
    for (const status of ['created', 'funded', 'delivered']) {
      await applyObservation(
        database.db,
        { target: { orderId: order.id }, tradeId: 'trd_cli-finished', status, source: 'webhook', observedAt: now },
        { staleAfterS: 3_600, handlersFor: reactions.handlersFor },
      )
    }
    const lease = { handler: 'ledger', leaseToken: 'cli', now, leaseEnd: new Date(now.getTime() + 60_000) }
    await untilEventsReadable(database.db)
    const { events } = await readReactionStream(database.db, { ...lease, limit: 10 })
    await writeReactionStream(database.db, {
      ...lease,
      place: events.at(-1)!,
      outcomes: events.map((entry) => ({ event: entry.event, createdAt: now, state: 'pending' as const, attempts: 0, runAt: now, lastError: null })),
    })
    // one order's jobs are claimed one at a time, in sequence
    const claim = async () => (await claimReactionJobs(database.db, { now, limit: 10, leaseMs: 600_000, leaseToken: 'finishing' }))[0]!
    const done = await claim()
    expect(await completeJob(database.db, { id: done.id, leaseToken: 'finishing', now })).toBe(true)
    const failed = await claim()
    expect(await failJob(database.db, { id: failed.id, leaseToken: 'finishing', now, error: 'Error: no' })).toBe(true)
    const run = (...args: string[]) => runCommand(['reactions', ...args], database.db)

    const listed = JSON.parse((await run('list', '--json', '--state', 'done')).stdout) as { id: string; state: string; runAt: string | null }[]
    expect(listed.map(({ state, runAt }) => ({ state, runAt }))).toEqual([{ state: 'done', runAt: null }])
    const failedListed = JSON.parse((await run('list', '--json', '--state', 'failed')).stdout) as { id: string; state: string; runAt: string | null }[]
    expect(failedListed.map(({ state, runAt }) => ({ state, runAt }))).toEqual([{ state: 'failed', runAt: null }])
    for (const id of [done.id, failed.id]) {
      expect(JSON.parse((await run('show', id, '--json')).stdout), id).toMatchObject({ id, runAt: null })
      expect((await run('show', id)).stdout, id).toContain('\nnext run   -\n')
    }

    // the order's third event waits behind the failed job: it showed as `pending 0`, due in the past, error -
    const held = JSON.parse((await run('list', '--json', '--state', 'pending')).stdout) as { id: string; sequence: number; waitsFor: unknown }[]
    expect(held).toEqual([expect.objectContaining({ sequence: 3, waitsFor: { id: failed.id, sequence: 2, state: 'failed' } })])
    const table = (await run('list', '--state', 'pending')).stdout.trim().split('\n')
    expect(table[1]).toMatch(new RegExp(` pending +0 +- +waits for job ${failed.id} \\(failed\\), an earlier event of its order$`))
    expect(JSON.parse((await run('show', held[0]!.id, '--json')).stdout)).toMatchObject({ waitsFor: { id: failed.id, sequence: 2, state: 'failed' } })
    expect((await run('show', held[0]!.id)).stdout).toContain(`\nnext run   once job ${failed.id} (sequence 2, failed) is done or skipped\n`)
    // done and failed jobs wait for nothing
    expect(JSON.parse((await run('show', done.id, '--json')).stdout)).toMatchObject({ waitsFor: null })
    expect(failedListed).toEqual([expect.objectContaining({ waitsFor: null })])
  })
})

// an outage fails hundreds of jobs: `retry --failed` printed every id on one line (568 seen); --json keeps them all
describe('reactions retry --failed with many failed jobs', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })
  const failJobs = (count: number) =>
    database.db
      .insertInto('reactionJobs')
      .values(
        Array.from({ length: count }, (_, index) => ({
          eventId: `00000000-0000-4000-8000-${String(index).padStart(12, '0')}`,
          orderId: index + 1,
          sequence: 1,
          handler: 'forwarder',
          state: 'failed',
          attempts: 10,
          runAt: new Date(),
          lastError: 'ForwardError: the receiver is unreachable',
        })),
      )
      .returning('id')
      .execute()

  it('names the first 20 ids and how many more; --json lists every one', async () => {
    const ids = (await failJobs(25)).map((row) => String(row.id)).sort((a, b) => Number(a) - Number(b))
    const text = await runCommand(['reactions', 'retry', '--failed'], database.db)
    expect(text.code).toBe(0)
    expect(text.stdout).toMatch(/ and 5 more \(--json lists them all\)\n$/)
    const [, listed, more] = /^retrying 25 job\(s\): (.*) and (\d+) more \(--json lists them all\)\n$/.exec(text.stdout) ?? []
    expect(listed?.split(', ')).toHaveLength(20)
    expect(more).toBe('5')
    expect(listed!.split(', ').every((id) => ids.includes(id))).toBe(true)

    await database.db.updateTable('reactionJobs').set({ state: 'failed' }).execute()
    const json = await runCommand(['reactions', 'retry', '--failed', '--json'], database.db)
    expect((JSON.parse(json.stdout) as { retried: string[] }).retried.sort((a, b) => Number(a) - Number(b))).toEqual(ids)
  })
})
