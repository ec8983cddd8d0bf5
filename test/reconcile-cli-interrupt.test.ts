// `reconcile --once` as its own process (the compiled CLI on embedded PGlite), stopped by Ctrl-C while the
// platform has not answered its polls: what it claimed is given back and its run is recorded as stopped. Killed
// (SIGKILL) instead, it gives nothing back: the next `--once` says what the lease holds, and `--report` shows the run.
import { once } from 'node:events'
import { createServer, type IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, expect, it } from 'vitest'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { receiverEnv, runCli, spawnCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { insertOrders } from './helpers/reconcile-orders.js'

// a platform that takes every poll and never answers it
const polls: IncomingMessage[] = []
const platform = createServer((request) => {
  polls.push(request)
  platform.emit('poll')
})
afterAll(() => {
  platform.closeAllConnections()
  platform.close()
})

it('gives the claimed orders back and records the run as stopped when Ctrl-C ends `reconcile --once`', async () => {
  const dataDir = migratedDataDir('reconcile-interrupt-')
  const dueSince = new Date(Date.now() - 60_000)
  const seed = openDatabase({ dataDir })
  await migrateToLatest(seed.db)
  await insertOrders(seed.db, [
    { externalReference: 'interrupt-1', nextPollAt: dueSince },
    { externalReference: 'interrupt-2', nextPollAt: dueSince },
  ])
  await seed.close()
  platform.listen(0, '127.0.0.1')
  await once(platform, 'listening')
  const { port } = platform.address() as AddressInfo

  const child = spawnCli(
    ['reconcile', '--once', '--json'],
    { ...receiverEnv(dataDir), PARTNER_API_BASE_URL: `http://127.0.0.1:${port}`, POLL_CONCURRENCY: '1' },
  )
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (chunk) => (stdout += chunk))
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  // the first poll is at the platform, unanswered: the cycle is under way
  if (polls.length === 0) await once(platform, 'poll')
  child.kill('SIGINT')
  const [code] = (await once(child, 'exit')) as [number | null]

  expect(stderr).toContain('stopped by a signal: the orders not polled were given back')
  expect(code).toBe(130)
  expect(JSON.parse(stdout)).toMatchObject({ claimed: 2, polled: 0, released: 2, stoppedReason: 'shutdown' })
  const after = openDatabase({ dataDir })
  try {
    const orders = await after.db
      .selectFrom('orders')
      .select(['nextPollAt', 'pollLeaseToken', 'pollAttempts'])
      .execute()
    // due again when they were due before, not leased for the poll lease, no attempt counted
    expect(orders).toEqual([
      { nextPollAt: dueSince, pollLeaseToken: null, pollAttempts: 0 },
      { nextPollAt: dueSince, pollLeaseToken: null, pollAttempts: 0 },
    ])
    const runs = await after.db.selectFrom('reconcileRuns').select(['finishedAt', 'stoppedReason']).execute()
    expect(runs).toHaveLength(1)
    expect(runs[0]!.finishedAt).not.toBeNull()
    expect(runs[0]!.stoppedReason).toBe('shutdown')
  } finally {
    await after.close()
  }
})

it("says what a killed `reconcile --once` left leased, and until when, and reports its run with no counts", async () => {
  const dataDir = migratedDataDir('reconcile-killed-')
  const dueSince = new Date(Date.now() - 60_000)
  const seed = openDatabase({ dataDir })
  await migrateToLatest(seed.db)
  await insertOrders(seed.db, [
    { externalReference: 'killed-1', nextPollAt: dueSince },
    { externalReference: 'killed-2', nextPollAt: dueSince },
  ])
  await seed.close()
  if (!platform.listening) {
    platform.listen(0, '127.0.0.1')
    await once(platform, 'listening')
  }
  const { port } = platform.address() as AddressInfo
  const env = { ...receiverEnv(dataDir), PARTNER_API_BASE_URL: `http://127.0.0.1:${port}`, POLL_CONCURRENCY: '1' }

  polls.length = 0
  const child = spawnCli(['reconcile', '--once'], env)
  if (polls.length === 0) await once(platform, 'poll')
  child.kill('SIGKILL')
  await once(child, 'exit')

  const again = await runCli(['reconcile', '--once'], env)
  expect([again.code, again.stderr]).toEqual([0, ''])
  const lines = again.stdout.split('\n')
  expect(lines[0]).toMatch(/^run \d+: claimed 0, polled 0, changed 0, errors 0$/)
  const until = /^left 2 due order\(s\) leased by another poller's cycle, due again by (\S+) as its lease ends /.exec(lines[1]!)?.[1]
  const report = await runCli(['reconcile', '--report'], env)
  expect(report.code).toBe(0)
  // the killed run, started seconds ago: under way for all anyone can tell, its counts not written
  expect(report.stdout.split('\n')[2]).toMatch(/^\d+\s+cli:\S+\s+\S+\s+running\s+-\s+-\s+-\s+-$/)

  const after = openDatabase({ dataDir })
  try {
    const leases = await after.db.selectFrom('orders').select('pollLeaseExpiresAt').execute()
    expect(until).toBe(leases[0]!.pollLeaseExpiresAt!.toISOString())
    expect(leases[1]!.pollLeaseExpiresAt).toEqual(leases[0]!.pollLeaseExpiresAt)
  } finally {
    await after.close()
  }
})
