// A platform whose error answers are large (Postgres): the compiled `serve` polls an order whose GET is
// answered 500 with a 600 kB error body. The poller's warning names the failure in a line of a few kB: the
// platform's code and message shortened, and nothing else of its body (no log line may hold a raw body).
import { rmSync } from 'node:fs'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { MAX_PLATFORM_MESSAGE_LENGTH } from '../src/partner-api/partner-api-transport.js'
import { pollingServeEnv, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { TEST_API_SECRET } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const BODY_MARK = 'field-of-the-platforms-body'

describePostgres('a platform whose error answers are large (Postgres)', () => {
  let database: TestDatabase
  let platform: RecordingServer
  const dataDir = migratedDataDir('error-log-')

  beforeAll(async () => {
    database = await createTestDatabase()
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({
        status: 500,
        body: {
          error: { code: `overloaded_${'c'.repeat(5_000)}`, message: `try later ${'m'.repeat(200_000)}` },
          trace: BODY_MARK.repeat(10_000),
        },
      }),
    })
  })
  afterAll(async () => {
    await platform.close()
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it('logs the failed poll in a short line, without the body', async () => {
    await insertOrders(database.db, [{ externalReference: 'big-error', nextPollAt: new Date(Date.now() - 60_000) }])
    const child = spawnCli(
      ['serve'],
      pollingServeEnv({ databaseUrl: database.url!, dataDir, platformUrl: platform.url }),
    )
    const output: string[] = []
    child.stdout!.on('data', (chunk: Buffer) => output.push(chunk.toString()))
    try {
      const line = await waitForLogLine(child, 'reconcile cycle done with errors: those orders back off')
      const text = JSON.stringify(line)
      const err = line.err as { type: string; message: string; status: number; code: string }
      expect(err).toMatchObject({ type: 'PartnerApiError', status: 500 })
      expect(err.message).toContain('answered 500 overloaded_ccc')
      expect(err.message).toContain('try later mmm')
      expect(err.message).toContain('(200,010 characters)')
      expect(err.message.length).toBeLessThan(MAX_PLATFORM_MESSAGE_LENGTH + 300)
      expect(text).not.toContain(BODY_MARK)
      expect(text.length).toBeLessThan(8_192)
    } finally {
      await stopChild(child)
    }
    expect(output.join('')).not.toContain(BODY_MARK)
  })
})
