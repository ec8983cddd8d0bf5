// SIGTERM gives leases back (Postgres): the compiled `serve` holds poll claims (the platform's GETs never
// answer) and reaction leases (the forward receiver never answers: its stream hands the running handlers off
// as leased jobs, and leaves the events beyond its slots to the job loop, which has no slot) when it gets SIGTERM. Once it has
// exited 0, no order and no job is leased any more: the orders are due again at the time they were due, the
// jobs pending and due now, neither with the interrupted attempt counted. Another replica can take them at
// once instead of waiting for the leases (300 s here) to run out.
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { rmSync } from 'node:fs'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { applyObservation } from '../src/orders/apply-observation.js'
import { createOrder } from './helpers/orders.js'
import { FORWARDER_HANDLER } from '../src/reactions/configured-reactions.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { pollingServeEnv, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { rememberSecret } from './helpers/log-sink.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const DUE_ORDERS = 3
const JOB_ORDERS = 6
const CONCURRENCY = 4

/** A server that takes requests and never answers them (until closed). */
async function silentServer(): Promise<{ url: string; requests: string[]; close: () => Promise<void> }> {
  const requests: string[] = []
  const server = http.createServer((req) => {
    requests.push(`${req.method} ${req.url}`)
    req.resume()
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: async () => {
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

describePostgres('SIGTERM gives the leases back (Postgres)', () => {
  let database: TestDatabase
  let platform: Awaited<ReturnType<typeof silentServer>>
  let receiver: Awaited<ReturnType<typeof silentServer>>
  const dataDir = migratedDataDir('drain-leases-')

  beforeAll(async () => {
    database = await createTestDatabase()
    platform = await silentServer()
    receiver = await silentServer()
  })
  afterAll(async () => {
    await platform.close()
    await receiver.close()
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it('leaves no order and no reaction job leased, each due again with its attempt taken back', async () => {
    const dueAt = new Date(Date.now() - 60_000)
    await insertOrders(
      database.db,
      Array.from({ length: DUE_ORDERS }, (_, i) => ({ externalReference: `due-${i}`, nextPollAt: new Date(dueAt.getTime() + i) })),
    )
    // the forwarder's stream begins before these transitions (as it would have begun at an earlier start)
    await ensureReactionStreams(database.db, [FORWARDER_HANDLER], new Date())
    for (let i = 0; i < JOB_ORDERS; i++) {
      const { order } = await createOrder(database.db, { externalReference: `job-${i}` })
      await applyObservation(
        database.db,
        { target: { orderId: order.id }, tradeId: `trd_job-${i}`, status: 'funded', source: 'api', observedAt: new Date() },
        // not due for a poll during the test: only the due-* orders are claimed
        { staleAfterS: 3_600, handlersFor: () => [FORWARDER_HANDLER] },
      )
    }

    const secret = `whsec_${randomBytes(32).toString('base64')}`
    rememberSecret(secret.slice('whsec_'.length))
    const child = spawnCli(
      ['serve'],
      {
        ...pollingServeEnv({ databaseUrl: database.url!, dataDir, platformUrl: platform.url }),
        PARTNER_API_TIMEOUT_MS: '300000',
        FORWARD_URL: `${receiver.url}/hooks`,
        FORWARD_SECRET: secret,
        FORWARD_TIMEOUT_MS: '290000',
        REACTION_CONCURRENCY: String(CONCURRENCY),
        REACTION_LEASE_S: '300',
        // half of it is the handlers' grace: they never finish, so it runs out and they are aborted
        SHUTDOWN_TIMEOUT_MS: '6000',
        SHUTDOWN_DRAIN_DELAY_MS: '0',
      },
    )
    const output: string[] = []
    child.stdout!.on('data', (chunk: Buffer) => output.push(chunk.toString()))
    child.stderr!.on('data', (chunk: Buffer) => output.push(chunk.toString()))
    try {
      await waitForLogLine(child, 'service listening')
      // every due order's GET and as many forwards as there are slots are in flight, unanswered
      await eventually(
        () => platform.requests.length >= DUE_ORDERS && receiver.requests.length >= CONCURRENCY,
        'the polls and the handlers are in flight',
        120_000,
      )
      const leasedOrders = await database.db.selectFrom('orders').select('id').where('pollLeaseToken', 'is not', null).execute()
      expect(leasedOrders).toHaveLength(DUE_ORDERS)
      // the stream's batch does not wait for them: the running handlers are handed off as leased jobs, the
      // other events left pending for the job loop, which has no free slot
      const jobsIn = async (state: string) => (await database.db.selectFrom('reactionJobs').select('id').where('state', '=', state).execute()).length
      await eventually(async () => (await jobsIn('running')) === CONCURRENCY && (await jobsIn('pending')) === JOB_ORDERS - CONCURRENCY, 'the batch is handed off', 60_000)
      expect(receiver.requests).toHaveLength(CONCURRENCY)

      const exited = once(child, 'exit')
      child.kill('SIGTERM')
      const [code] = (await exited) as [number | null]
      expect(code, output.join('')).toBe(0)
      expect(output.join('')).toContain('reaction handlers stopped before finishing; their jobs run again')

      const orders = await database.db
        .selectFrom('orders')
        .select(['externalReference', 'pollLeaseToken', 'pollLeaseExpiresAt', 'nextPollAt', 'pollAttempts'])
        .where('externalReference', 'like', 'due-%')
        .orderBy('externalReference')
        .execute()
      expect(orders).toEqual(
        Array.from({ length: DUE_ORDERS }, (_, i) => ({
          externalReference: `due-${i}`,
          pollLeaseToken: null,
          pollLeaseExpiresAt: null,
          nextPollAt: new Date(dueAt.getTime() + i),
          pollAttempts: 0,
        })),
      )
      const jobs = await database.db.selectFrom('reactionJobs').select(['state', 'leaseToken', 'attempts', 'runAt']).execute()
      expect(jobs).toHaveLength(JOB_ORDERS)
      const now = Date.now()
      for (const job of jobs) {
        expect(job).toMatchObject({ state: 'pending', leaseToken: null, attempts: 0 })
        expect(job.runAt.getTime()).toBeLessThanOrEqual(now)
      }
    } finally {
      child.kill('SIGKILL')
    }
  })
})
