// The compiled `serve` with the forwarder (Postgres): after the receiver was away (503s, on the events of several
// orders, for more than 5 s), the first event it takes again pulls the failed events' retries forward. The
// backoff is set far past the test's wait (REACTION_BACKOFF_BASE_S=600: a first retry 300 to 600 s later), so
// the failed events reach the receiver within the test only if they were pulled forward, however fast the
// machine.
import { expect, it } from 'vitest'
import { moveNewOrder } from './helpers/orders.js'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { jsonLogLines, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { useForwardingServe } from './helpers/forwarding-serve.js'
import { eventually } from './helpers/reconcile-poller.js'
import { describePostgres } from './helpers/test-database.js'

const BACKOFF_BASE_S = 600
// the recovery watch's least outage (src/reactions/recovery-watch.ts, OUTAGE_MS) and a second more
const OUTAGE_S = 6
const ORDERS_IN_OUTAGE = 3

describePostgres('the compiled serve pulls an outage’s retries forward (Postgres)', () => {
  let away = true
  // the webhook-id of each forward the receiver took (answered 204)
  const taken: string[] = []
  const setting = useForwardingServe('pull-forward-', (request) => {
    if (away) return 503
    taken.push(request.headers['webhook-id']!)
    return 204
  })

  it('sends the events that failed in the outage at once after it, not after their backoff', async () => {
    const { database, receiver } = setting
    const db = database.db
    await ensureReactionStreams(db, [FORWARDER_HANDLER], new Date())
    const env = { ...setting.serveEnv(), REACTION_BACKOFF_BASE_S: String(BACKOFF_BASE_S), REACTION_BACKOFF_CAP_S: '3600' }
    const child = setting.serve(env)
    const lines = jsonLogLines(child)
    await waitForLogLine(child, 'service listening')

    const move = (externalReference: string) =>
      moveNewOrder(db, { externalReference, statuses: ['created'], handlersFor: () => [FORWARDER_HANDLER], now: () => new Date() })
    for (let i = 0; i < ORDERS_IN_OUTAGE; i++) await move(`outage-${i}`)
    await receiver.waitFor(ORDERS_IN_OUTAGE)
    // each failed event is a job waiting out the configured backoff: its first retry 300 s away or more
    await eventually(async () => {
      const waiting = await db.selectFrom('reactionJobs').select('runAt').where('state', '=', 'pending').execute()
      return waiting.length === ORDERS_IN_OUTAGE
    }, 'the failed events wait as jobs', 60_000)
    const waiting = await db.selectFrom('reactionJobs').select(['eventId', 'runAt', 'attempts']).execute()
    for (const job of waiting) {
      expect(job.attempts).toBe(1)
      expect(job.runAt.getTime() - Date.now()).toBeGreaterThan((BACKOFF_BASE_S / 2 - 60) * 1000)
    }
    await new Promise((resolve) => setTimeout(resolve, OUTAGE_S * 1000))

    // the receiver is back: the next event goes through, and the three behind it follow
    away = false
    await move('after-outage')
    const failed = waiting.map((job) => job.eventId)
    await eventually(() => failed.every((id) => taken.includes(id)), 'the events of the outage are forwarded', 120_000)
    expect(taken).toHaveLength(ORDERS_IN_OUTAGE + 1)
    // the line is written before those forwards go out, but the child's stdout may reach this process after them
    const isPulled = (line: { msg?: unknown }) => line.msg === 'reaction handler succeeds again after failing: its waiting retries are due now'
    await eventually(() => lines.some(isPulled), 'the pull-forward is logged', 30_000)
    const pulled = lines.find(isPulled)
    expect(pulled).toMatchObject({ handler: FORWARDER_HANDLER, jobs: ORDERS_IN_OUTAGE })
    expect(pulled!.failedForS as number).toBeGreaterThanOrEqual(5)
    const jobs = () => db.selectFrom('reactionJobs').select(['state', 'attempts']).execute()
    await eventually(async () => (await jobs()).every((job) => job.state === 'done'), 'the jobs are done', 60_000)
    expect(await jobs()).toEqual(failed.map(() => ({ state: 'done', attempts: 2 })))
    expect(await stopChild(child)).toBe(0)
  })
})
