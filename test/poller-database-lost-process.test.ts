// Postgres lost in the middle of a poll cycle (Postgres): the compiled `serve` reaches the database through a
// TCP proxy this test owns, and the proxy is cut while the cycle's GETs are at the platform. The service stays
// up, logs the failure without a secret or a stack, and once the database is back records the end of the run it
// could not finish (stopped_reason `database`) instead of leaving it `running` for good, as a dead replica's run.
import { once } from 'node:events'
import { rmSync } from 'node:fs'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { jsonLogLines, pollingServeEnv, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { eventually } from './helpers/reconcile-poller.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'
import { TEST_API_SECRET } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, postgresUrl, type TestDatabase } from './helpers/test-database.js'

/** The platform: records each GET and holds it until the test answers it. */
async function holdingPlatform() {
  const held: { path: string; res: http.ServerResponse }[] = []
  const server = http.createServer((req, res) => {
    req.resume()
    held.push({ path: req.url ?? '', res })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    held,
    answerAll() {
      for (const { path, res } of held.splice(0)) {
        const tradeId = decodeURIComponent(path.split('/').at(-2)!)
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ trade_id: tradeId, reference: `R-${tradeId}`, status: 'delivered', external_reference: tradeId.replace(/^tr_/, '') }))
      }
    },
    close: async () => {
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

describePostgres('Postgres lost mid-cycle under the compiled serve (Postgres)', () => {
  let database: TestDatabase
  let proxy: TcpProxy
  let platform: Awaited<ReturnType<typeof holdingPlatform>>
  const dataDir = migratedDataDir('database-lost-')

  beforeAll(async () => {
    database = await createTestDatabase()
    const url = new URL(postgresUrl!)
    proxy = await startTcpProxy({ host: url.hostname, port: Number(url.port || 5432) })
    platform = await holdingPlatform()
  })
  afterAll(async () => {
    await platform.close()
    await proxy.close()
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it('stays up, and records the end of the run it could not finish once the database is back', async () => {
    await insertOrders(database.db, [
      { externalReference: 'lost-0', nextPollAt: new Date(Date.now() - 60_000) },
      { externalReference: 'lost-1', nextPollAt: new Date(Date.now() - 59_000) },
    ])
    const child = spawnCli(
      ['serve'],
      { ...pollingServeEnv({ databaseUrl: proxy.rewrite(database.url!), dataDir, platformUrl: platform.url }), PARTNER_API_TIMEOUT_MS: '300000' },
    )
    const output: string[] = []
    child.stdout!.on('data', (chunk: Buffer) => output.push(chunk.toString()))
    child.stderr!.on('data', (chunk: Buffer) => output.push(chunk.toString()))
    const lines = jsonLogLines(child)
    try {
      await waitForLogLine(child, 'service listening')
      await eventually(() => platform.held.length === 2, 'both GETs are at the platform', 120_000)

      // the database goes away while the cycle waits on the platform; then the platform answers
      proxy.cut()
      platform.answerAll()
      await eventually(
        () => lines.some((line) => line.msg === 'reconcile cycle failed; trying again after the poll interval'),
        'the cycle failed on the database',
        120_000,
      )
      const [run] = await database.db.selectFrom('reconcileRuns').selectAll().execute()
      expect(run).toMatchObject({ finishedAt: null })

      proxy.restore()
      await eventually(
        async () => (await database.db.selectFrom('reconcileRuns').select('finishedAt').where('id', '=', run!.id).executeTakeFirst())?.finishedAt != null,
        'the run that lost the database is recorded as finished',
        120_000,
      )
      const finished = await database.db.selectFrom('reconcileRuns').selectAll().where('id', '=', run!.id).executeTakeFirstOrThrow()
      expect(finished).toMatchObject({ stoppedReason: 'database', polled: 2, changed: 0, errors: 2 })
      expect(child.exitCode).toBeNull()
      // the line follows the update that recorded it
      await eventually(
        () => lines.some((line) => line.msg === 'recorded the end of a reconcile run that lost the database'),
        'the service says it recorded the run',
        60_000,
      )

      const log = output.join('')
      expect(log).not.toContain(TEST_API_SECRET)
      expect(log).not.toMatch(/\n\s+at /)
    } finally {
      await stopChild(child)
      if (child.exitCode === null && child.signalCode === null) await once(child, 'exit')
    }
  })
})
