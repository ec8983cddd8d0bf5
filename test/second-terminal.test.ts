// A second terminal next to `npm start`: it must reach the running service's database and platform, or
// say what to set; never write somewhere else unnoticed. A refused connection to the platform sent nothing.
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import { afterAll, beforeAll, expect, it } from 'vitest'
import type { CliContext } from '../src/cli/cli-context.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { freePort, postgresServeEnv, runCli, spawnCli, waitForLogLine, stopChild } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { startRecordingServer } from './helpers/partner-api-recording-server.js'
import { TEST_API_SECRET, TEST_WEBHOOK_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const cli = (context: CliContext, ...args: string[]) => runCommandWith(args, context)

it('treats a refused connection as not sent: a new order stays, created with no trade, and the same command opens it later', async () => {
  const database = await createTestDatabase()
  const port = await freePort()
  try {
    const config = testConfig({ PARTNER_API_BASE_URL: `http://127.0.0.1:${port}` })
    const context = { config, logger: testLogger([TEST_API_SECRET]), db: database.db }
    const open = () =>
      cli(context, 'trades', 'open', 'second-1', '--title', 'Chair', '--amount', '10.00', '--currency', 'EUR', '--seller', 's_1')

    const refused = await open()
    expect(refused.code).toBe(1)
    expect(refused.stderr).toContain(
      'nothing was sent and no trade was opened, but order second-1 was created locally: the same command opens its trade',
    )
    expect(refused.stderr).not.toContain('unchanged')
    expect(refused.stderr).toContain('[not_sent]')
    // one line for a person: no stack, no log line
    expect(refused.stderr.trim().split('\n')).toHaveLength(1)
    expect((await findOrderByExternalReference(database.db, 'second-1'))?.tradeCreateState).toBe('none')

    // now the order exists: refused again, it is unchanged
    const again = await open()
    expect(again.code).toBe(1)
    expect(again.stderr).toContain('nothing was sent and the order is unchanged')

    // the platform comes up: the same command works, without --retry
    const platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      port,
      answer: () => ({ status: 201, body: tradeRecord({ trade_id: 'tr_second_1', external_reference: 'second-1' }) }),
    })
    try {
      const opened = await open()
      expect(opened.stderr).toBe('')
      expect(opened.code).toBe(0)
      expect((await findOrderByExternalReference(database.db, 'second-1'))?.tradeId).toBe('tr_second_1')
    } finally {
      await platform.close()
    }
  } finally {
    await database.close()
  }
})

it('says so when `trades open` with no service running created the order and sent nothing, in a process of its own', async () => {
  // local mode, no service: the platform is the sandbox at SANDBOX_PORT, where nothing listens
  const env = { DATA_DIR: migratedDataDir('second-terminal-'), SANDBOX_PORT: String(await freePort()) }
  const opened = await runCli(['trades', 'open', 'order-3', '--title', 'Desk', '--amount', '80.00', '--currency', 'EUR', '--seller', 's_1'], env)
  expect(opened.code).toBe(1)
  expect(opened.stderr).toMatch(
    /^Could not reach the platform at \S+ \(ECONNREFUSED\): nothing was sent and no trade was opened, but order order-3 was created locally: the same command opens its trade once the platform can be reached\. .* \[not_sent\]\n$/,
  )
  const shown = await runCli(['orders', 'show', 'order-3'], env)
  expect(shown.code, shown.stderr).toBe(0)
  expect(shown.stdout).toContain('order-3')
})

describePostgres('a second terminal next to a service on Postgres (Postgres)', () => {
  let database: TestDatabase
  let service: ReturnType<typeof spawnCli>
  const dataDir = mkdtempSync(path.join(tmpdir(), 'second-terminal-'))

  // a `serve` from dataDir on the test's Postgres
  const startServe = async () =>
    spawnCli(['serve'], {
      DATA_DIR: dataDir,
      DATABASE_URL: database.url!,
      PORT: '0',
      // the operator listener too: its default port may be another test's or service's
      ADMIN_PORT: '0',
      SANDBOX_PORT: String(await freePort()),
      POLL_ENABLED: 'false',
    })

  beforeAll(async () => {
    database = await createTestDatabase({ kind: 'postgres' })
    service = await startServe()
    await waitForLogLine(service, 'sandbox platform listening')
  })
  afterAll(async () => {
    await stopChild(service)
    await database.close()
  })

  it('runs commands without DATABASE_URL or SANDBOX_PORT in the service, on its Postgres', async () => {
    const env = { DATA_DIR: dataDir }
    const created = await runCli(['orders', 'create', '--external-reference', 'pg-order-1'], env)
    expect(created.stderr).toBe('')
    expect(created.code).toBe(0)
    const opened = await runCli(['trades', 'open', 'pg-order-1', '--title', 'Lamp', '--amount', '5.00', '--currency', 'EUR', '--seller', 's_1'], env)
    expect(opened.stderr).toBe('')
    expect(opened.code).toBe(0)
    const order = await findOrderByExternalReference(database.db, 'pg-order-1')
    expect(order?.tradeId).toMatch(/^trd_/)
    // nothing was written to an embedded database beside it
    expect(existsSync(path.join(dataDir, 'pglite'))).toBe(false)
  })

  it('runs a command whose DATABASE_URL names the service’s database as another role in a process of its own, with that role’s rights', async () => {
    const role = `escrow_reader_${randomBytes(4).toString('hex')}`
    await sql.raw(`create role ${role} login`).execute(database.db)
    try {
      // it may read the service's tables, not write them
      const current = (await sql<{ schema: string }>`select current_schema() as schema`.execute(database.db)).rows[0]!.schema
      await sql.raw(`grant usage on schema ${current} to ${role}; grant select on all tables in schema ${current} to ${role}`).execute(database.db)
      const asReader = new URL(database.url!)
      asReader.username = role
      const env = { DATA_DIR: dataDir, DATABASE_URL: asReader.toString() }
      await database.db.insertInto('orders').values({ externalReference: 'pg-reader-0' }).execute()
      const shown = await runCli(['orders', 'show', 'pg-reader-0'], env)
      expect([shown.code, shown.stderr]).toEqual([0, ''])
      expect(shown.stdout).toContain('pg-reader-0')
      // forwarded, the service would have written it with its own role
      const created = await runCli(['orders', 'create', '--external-reference', 'pg-reader-1'], env)
      expect(created.code, created.stderr).not.toBe(0)
      expect(created.stderr).toMatch(/permission denied/)
      expect(await findOrderByExternalReference(database.db, 'pg-reader-1')).toBeUndefined()
    } finally {
      await sql.raw(`drop owned by ${role}; drop role ${role}`).execute(database.db)
    }
  })

  // A second local-mode service over the same DATA_DIR ran a sandbox over the first's state file (both handed out the
  // same trade references, and a restart lost one's trades): it is refused at start, and leaves the first's serve.json
  it('refuses a second service from the same DATA_DIR, whose sandbox state is the first’s, and leaves the first its serve.json', async () => {
    const file = path.join(dataDir, 'serve.json')
    const owner = () => (JSON.parse(readFileSync(file, 'utf8')) as { pid: number }).pid
    expect(owner()).toBe(service.pid)
    const second = await startServe()
    let stderr = ''
    second.stderr!.on('data', (chunk) => (stderr += chunk))
    const [code] = (await once(second, 'exit')) as [number | null]
    expect(code).toBe(1)
    expect(stderr).toContain(`is in use by process ${service.pid} (another service or sandbox over this DATA_DIR)`)
    expect(stderr).toContain('[sandbox_state_in_use]')
    // the second's refusal left the first's file; a command still runs in the first
    expect(owner()).toBe(service.pid)
    const listed = await runCli(['reactions', 'list', '--json'], { DATA_DIR: dataDir })
    expect([listed.code, listed.stderr]).toEqual([0, ''])
  })

  it('runs `reactions` and `prune` without DATABASE_URL in the service, never in a new embedded database', async () => {
    const env = { DATA_DIR: dataDir }
    const jobs = await runCli(['reactions', 'list', '--json'], env)
    expect(jobs.stderr).toBe('')
    expect(jobs.code).toBe(0)
    const pass = await runCli(['prune', '--dry-run', '--json'], env)
    expect(pass.stderr).toBe('')
    expect(pass.code).toBe(0)
    expect(existsSync(path.join(dataDir, 'pglite'))).toBe(false)
  })
})

describePostgres('a second terminal next to a service in remote mode (Postgres)', () => {
  let database: TestDatabase
  let service: ReturnType<typeof spawnCli>
  const dataDir = mkdtempSync(path.join(tmpdir(), 'second-terminal-remote-'))

  beforeAll(async () => {
    database = await createTestDatabase({ kind: 'postgres' })
    service = spawnCli(['serve'], postgresServeEnv({ databaseUrl: database.url!, dataDir }))
    await waitForLogLine(service, 'service listening')
  })
  afterAll(async () => {
    await stopChild(service)
    await database.close()
  })

  it('runs a command in the service whatever else the shell sets, and writes no local secrets beside it', async () => {
    // a shell of none of the service's variables (so read alone as local mode), and one that would not pass
    // as a configuration of its own: the service runs the command with its own
    const created = await runCli(['orders', 'create', '--external-reference', 'remote-order-1'], { DATA_DIR: dataDir, FORWARD_SECRET: 'x' })
    expect([created.code, created.stderr]).toEqual([0, ''])
    expect(await findOrderByExternalReference(database.db, 'remote-order-1')).toBeDefined()
    // before, that shell's command exited 2 naming FORWARD_SECRET, and one without it wrote local-secrets.json
    // (local mode's generated secrets) into the remote service's DATA_DIR
    const listed = await runCli(['orders', 'list', '--json'], { DATA_DIR: dataDir })
    expect([listed.code, listed.stderr]).toEqual([0, ''])
    expect(existsSync(path.join(dataDir, 'local-secrets.json'))).toBe(false)
  })

  it('refuses to guess its webhook secret for `webhook send`, and sends with the one given', async () => {
    const file = path.join(dataDir, 'delivery.json')
    writeFileSync(file, JSON.stringify({ event: 'trade.funded', trade_id: 'tr_remote_1', status: 'funded', external_reference: 'remote-order-1' }))
    // before, signed with local secrets generated for the occasion, and answered 401 invalid_signature
    const guessed = await runCli(['webhook', 'send', '--file', file], { DATA_DIR: dataDir })
    expect(guessed.code).toBe(2)
    expect(guessed.stderr).toContain('is in remote mode')
    expect(guessed.stderr.trim().endsWith('[secret_required]')).toBe(true)
    expect(existsSync(path.join(dataDir, 'local-secrets.json'))).toBe(false)
    const given = await runCli(['webhook', 'send', '--file', file, '--secret', TEST_WEBHOOK_SECRET, '--json'], { DATA_DIR: dataDir })
    expect([given.code, given.stderr]).toEqual([0, ''])
    expect(JSON.parse(given.stdout)).toMatchObject({ status: 200 })
  })
})
