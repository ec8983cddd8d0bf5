// The compiled `serve` and CLI behind PgBouncer in transaction mode, the pooler most hosted Postgres services put
// in front: every transaction may run on another server session. Named prepared statements made every
// delivery a 500 there (42P05: "prepared statement already exists"); they now turn themselves off. The
// pooler is Debian's pgbouncer, started by the test on a port of its own (CI installs it; skipped elsewhere
// when it is missing). The test's database is one of its own: the pooler drops the `options` a test schema
// is chosen by.
import { type ChildProcess, execFileSync, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { freePort, jsonLogLines, receiverEnv, runCli, spawnCli } from './helpers/cli-process.js'
import { type ForwardReceiver, startForwardReceiver } from './helpers/forward-receiver.js'
import { describePostgres, postgresUrl } from './helpers/test-database.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const pgbouncer = (() => {
  try {
    return execFileSync('sh', ['-c', 'command -v pgbouncer'], { encoding: 'utf8' }).trim() || undefined
  } catch {
    return undefined
  }
})()
if (!pgbouncer && postgresUrl && !process.env.CI) {
  console.warn('pgbouncer is not installed: the connection pooler tests are SKIPPED; CI runs them (apt-get install pgbouncer).')
}
const describePooler = pgbouncer || process.env.CI ? describePostgres : describePostgres.skip
const ORDERS = 100
const UNBOUNDED_WARNING =
  "the database does not cancel this service's statements after 14000 ms (a connection pooler that does not pass statement_timeout on?): " +
  'a statement still running when its delivery was answered 503 can commit later, and holds its connection until it ends; ' +
  "set it for the role: ALTER ROLE <the role of DATABASE_URL> SET statement_timeout = '14000ms'"

describePooler('behind PgBouncer in transaction mode (Postgres)', () => {
  const name = `escrow_pool_${randomBytes(4).toString('hex')}`
  // made in beforeAll: a skipped describe still runs its body, without TEST_DATABASE_URL
  let direct: URL
  let pooled: URL
  let pooler: ChildProcess
  let admin: pg.Client
  const children: ChildProcess[] = []

  beforeAll(async () => {
    if (!pgbouncer) throw new Error('pgbouncer is required in CI: .ci/run installs Debian\'s pgbouncer package')
    direct = new URL(postgresUrl!)
    direct.pathname = `/${name}`
    admin = new pg.Client({ connectionString: postgresUrl })
    await admin.connect()
    await admin.query(`create database ${name}`)
    const port = await freePort()
    const directory = mkdtempSync(path.join(tmpdir(), 'pooler-'))
    const config = path.join(directory, 'pgbouncer.ini')
    writeFileSync(path.join(directory, 'users.txt'), `"${direct.username || 'postgres'}" ""\n`)
    writeFileSync(
      config,
      [
        '[databases]',
        `* = host=${direct.hostname} port=${direct.port || 5432}`,
        '[pgbouncer]',
        'listen_addr = 127.0.0.1',
        `listen_port = ${port}`,
        'unix_socket_dir =',
        'auth_type = trust',
        `auth_file = ${path.join(directory, 'users.txt')}`,
        'pool_mode = transaction',
        // a few server sessions taken in turn: a client's statements land on different ones
        'default_pool_size = 3',
        'server_round_robin = 1',
        'ignore_startup_parameters = extra_float_digits,options,application_name',
      ].join('\n'),
    )
    // pgbouncer refuses to run as root: it takes another identity then
    pooler = spawn(pgbouncer!, [...(process.getuid?.() === 0 ? ['-u', 'nobody'] : []), config], { stdio: ['ignore', 'ignore', 'pipe'] })
    await new Promise<void>((resolve, reject) => {
      let log = ''
      pooler.stderr!.on('data', (chunk: Buffer) => {
        log += chunk
        if (log.includes('process up')) resolve()
      })
      pooler.once('exit', (code) => reject(new Error(`pgbouncer exited with ${code}:\n${log}`)))
    })
    pooled = new URL(direct)
    pooled.hostname = '127.0.0.1'
    pooled.port = String(port)
  })

  afterAll(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    pooler?.kill('SIGTERM')
    if (pooler && pooler.exitCode === null) await once(pooler, 'exit')
    await admin?.query(`drop database if exists ${name} with (force)`)
    await admin?.query(`drop database if exists ${name}_bounded with (force)`)
    await admin?.end()
  })

  const env = (extra: Record<string, string> = {}) => ({
    ...receiverEnv(mkdtempSync(path.join(tmpdir(), 'pooler-data-'))),
    DATABASE_URL: pooled.toString(),
    ...extra,
  })

  // the compiled `serve`, its log lines parsed as they come, once it listens
  const startServe = async (extra: Record<string, string>) => {
    const child = spawnCli(['serve'], env(extra))
    children.push(child)
    const lines = jsonLogLines(child)
    let stderr = ''
    child.stderr!.on('data', (chunk) => (stderr += chunk))
    for (;;) {
      const found = lines.find((line) => line.msg === 'service listening')
      if (found) return { child, lines, url: String(found.url), adminUrl: String(found.adminUrl) }
      if (child.exitCode !== null) throw new Error(`serve exited ${child.exitCode}:\n${stderr}`)
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  }

  // database_notifications_heard once the listener's probe is answered (10 s at most after its connect)
  const notificationsHeard = async (adminUrl: string) => {
    for (let waited = 0; waited < 30_000; waited += 200) {
      const sample = /^database_notifications_heard (\d)$/m.exec(await (await fetch(`${adminUrl}/metrics`)).text())
      if (sample) return Number(sample[1])
      await new Promise((resolve) => setTimeout(resolve, 200))
    }
    return undefined
  }

  // the forwarder's settings, posting to the partner's receiver
  const forwardingTo = (receiver: ForwardReceiver) => ({
    FORWARD_URL: receiver.url,
    FORWARD_SECRET: `whsec_${randomBytes(32).toString('base64')}`,
  })

  const deliverTo = async (url: string, n: number, reference: string, status: string) => {
    const body = JSON.stringify(tradePayload(reference, status))
    const response = await fetch(`${url}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `pool-${n}`, 'x-partner-signature': signBody(body) },
      body,
    })
    return response.status
  }

  it('migrates, takes every delivery, applies each once and forwards each transition', async () => {
    const receiver = await startForwardReceiver()
    // with its listener on a direct connection, as README advises behind such a pooler
    const { child, lines, url, adminUrl } = await startServe({ ...forwardingTo(receiver), DATABASE_LISTEN_URL: direct.toString() })
    const seed = new pg.Client({ connectionString: direct.toString() })
    await seed.connect()
    await seed.query(`insert into orders (external_reference) select 'pool-' || g from generate_series(0, ${ORDERS - 1}) g`)

    const deliver = (n: number) => deliverTo(url, n, `pool-${n % ORDERS}`, n < ORDERS ? 'funded' : 'delivered')
    // two rounds of one delivery per order, 20 at a time: each order funded, then delivered
    const statuses: number[] = []
    for (let round = 0; round < 2; round++) {
      for (let start = round * ORDERS; start < (round + 1) * ORDERS; start += 20) {
        statuses.push(...(await Promise.all(Array.from({ length: 20 }, (_, i) => deliver(start + i)))))
      }
    }
    expect(statuses.filter((status) => status !== 200)).toEqual([])

    const { rows } = await seed.query<{ outcome: string; n: number }>(
      `select outcome, count(*)::int as n from webhook_deliveries group by outcome`,
    )
    expect(rows).toEqual([{ outcome: 'applied', n: 2 * ORDERS }])
    const history = await seed.query<{ to_status: string; n: number }>(
      `select to_status, count(*)::int as n from order_status_history group by to_status order by to_status`,
    )
    expect(history.rows).toEqual([
      { to_status: 'delivered', n: ORDERS },
      { to_status: 'funded', n: ORDERS },
    ])
    await seed.end()
    // every transition reaches the partner's receiver
    const count = () => new Set(receiver.received.map((request) => request.headers['webhook-id'])).size
    for (let waited = 0; count() < 2 * ORDERS && waited < 60_000; waited += 100) await new Promise((resolve) => setTimeout(resolve, 100))
    expect(count()).toBe(2 * ORDERS)
    // the listener on DATABASE_LISTEN_URL hears what is sent through the pooler
    expect(await notificationsHeard(adminUrl)).toBe(1)

    // the pooler refuses statement_timeout at connect: the pool connects without it, and the service says once
    // that the role's own setting is what bounds its statements now (the last case here shows that remedy)
    const warnings = lines.filter((line) => line.level === 40).map((line) => String(line.msg))
    expect(warnings.filter((warning) => warning === UNBOUNDED_WARNING)).toHaveLength(1)
    // and one more at most, this one: whether a named statement meets a session without it first depends on
    // which sessions the pooler lent (it did in every run here, and every delivery was a 500 before)
    const others = warnings.filter((warning) => warning !== UNBOUNDED_WARNING)
    expect(others.length).toBeLessThanOrEqual(1)
    for (const warning of others) {
      expect(warning).toBe('named prepared statements fail on this database connection (a pooler in transaction mode?): statements are no longer prepared')
    }
    expect(lines.filter((line) => Number(line.level) >= 50)).toEqual([])
    child.kill('SIGTERM')
    const [code] = await once(child, 'exit')
    expect(code).toBe(0)
    await receiver.close()
  })

  // LISTEN through the pooler: the pooler lends the listening session to others once its statement is done,
  // and no notification reaches the listener (0 of 10 by hand). The replica finds out from its own probe
  it('without DATABASE_LISTEN_URL, a replica finds that its listener hears nothing, and says so once', async () => {
    const { child, lines, adminUrl } = await startServe({})
    expect(await notificationsHeard(adminUrl)).toBe(0)
    child.kill('SIGTERM')
    // every line read: the gauge may be scraped before the warning's line has come through the pipe
    expect((await once(child, 'close'))[0]).toBe(0)
    const deaf = lines.filter((line) => String(line.msg).startsWith('notifications sent through DATABASE_URL do not reach'))
    expect(deaf.map((line) => ({ level: line.level, msg: line.msg }))).toEqual([
      {
        level: 40,
        msg: "notifications sent through DATABASE_URL do not reach this replica's listener (a connection pooler in transaction mode?): other replicas' commits wake it only at its next look, 30 s at most; set DATABASE_LISTEN_URL to a direct connection",
      },
    ])
  })

  // Two replicas, each with its listener on a direct connection: the one that holds the forwarder's stream
  // learns of the other's commits from their NOTIFY. Without it, it looks only every 30 s: each delivery below
  // is sent once the one before was forwarded (that look just over), so it would wait for the next look
  it('with DATABASE_LISTEN_URL, a transition committed by one replica wakes the replica that holds its stream', async () => {
    const seed = new pg.Client({ connectionString: direct.toString() })
    await seed.connect()
    // a failed case leaves it open until afterAll drops the database under it
    seed.on('error', () => {})
    await seed.query(`insert into orders (external_reference) select 'wake-' || g from generate_series(0, 2) g`)
    const receiver = await startForwardReceiver()
    const settings = { ...forwardingTo(receiver), DATABASE_LISTEN_URL: direct.toString() }
    const holder = await startServe(settings)
    // the first replica took the forwarder's stream (its lease lasts REACTION_LEASE_S, 300 s, renewed as it reads)
    const leaseHolder = async () => {
      const { rows } = await seed.query<{ token: string }>(
        `select lease_token as token from reaction_streams where handler = 'forwarder' and lease_expires_at > now()`,
      )
      return rows[0]?.token
    }
    let holderToken: string | undefined
    for (let waited = 0; !holderToken && waited < 30_000; waited += 100) {
      holderToken = await leaseHolder()
      if (!holderToken) await new Promise((resolve) => setTimeout(resolve, 100))
    }
    expect(holderToken).toBeDefined()
    const other = await startServe(settings)
    expect(await notificationsHeard(holder.adminUrl)).toBe(1)
    const waits: number[] = []
    for (let n = 0; n < 3; n++) {
      const before = receiver.received.length
      const sent = Date.now()
      expect(await deliverTo(other.url, 1_000 + n, `wake-${n}`, 'funded')).toBe(200)
      // far below the 30 s between looks, far above a wake's milliseconds
      while (receiver.received.length === before && Date.now() - sent < 15_000) await new Promise((resolve) => setTimeout(resolve, 20))
      waits.push(receiver.received.length > before ? Date.now() - sent : Number.POSITIVE_INFINITY)
    }
    expect(waits.filter((wait) => wait > 15_000)).toEqual([])
    // the holder forwarded them: the stream's lease never moved to the other replica
    expect(await leaseHolder()).toBe(holderToken)
    await seed.end()
    for (const replica of [other, holder]) {
      replica.child.kill('SIGTERM')
      expect((await once(replica.child, 'exit'))[0]).toBe(0)
    }
    await receiver.close()
  })

  // Kysely's migrator takes a session's advisory lock and gives it back as two statements: the pooler sent them
  // to two sessions, the lock stayed with the first, and the next start waited on it until its statement timed
  // out ("Migration (before any migration ran) failed")
  it('starts again and again: each migration run takes and gives back its lock on one session', async () => {
    const runs = []
    for (let run = 0; run < 4; run++) runs.push(await runCli(['migrate'], env()))
    expect(runs.map((result) => ({ code: result.code, stderr: result.stderr }))).toEqual(Array.from({ length: 4 }, () => ({ code: 0, stderr: '' })))
    expect(runs.map((result) => result.stdout)).toEqual(Array.from({ length: 4 }, () => 'migrations are current\n'))
    const held = await admin.query(
      `select count(*)::int as n from pg_locks l join pg_database d on d.oid = l.database where l.locktype = 'advisory' and d.datname = $1`,
      [name],
    )
    expect(held.rows[0].n).toBe(0)
  })

  // the pruning lock was a session's too, held over a pass of batches: it stayed with a pooled session, and
  // later passes that landed on another one were skipped ("Another replica is pruning now")
  it('prunes again and again: each pass holds its lock in a transaction of its own and gives it back', async () => {
    const runs = []
    for (let run = 0; run < 4; run++) runs.push(await runCli(['prune'], env({ RETENTION_DAYS: '1', DELIVERY_RETENTION_DAYS: '1' })))
    for (const result of runs) expect({ code: result.code, stderr: result.stderr, pruned: /^pruned: 0 raw bodies/.test(result.stdout) }).toEqual({ code: 0, stderr: '', pruned: true })
    const held = await admin.query(
      `select count(*)::int as n from pg_locks l join pg_database d on d.oid = l.database where l.locktype = 'advisory' and d.datname = $1`,
      [name],
    )
    expect(held.rows[0].n).toBe(0)
  })

  // The remedy the warning names, through the pooler: the database's own statement_timeout (set for a database of
  // its own, so the pooler opens new sessions for it, which start with the setting). A delivery held up by an
  // operator's lock is cancelled by the database: 503, and nothing written once the lock goes
  it('with the timeout set in the database, statements are bounded through the pooler too, and nothing warns', async () => {
    const bounded = `${name}_bounded`
    await admin.query(`create database ${bounded}`)
    await admin.query(`alter database ${bounded} set statement_timeout = '2s'`)
    const boundedDirect = new URL(direct)
    boundedDirect.pathname = `/${bounded}`
    const boundedPooled = new URL(pooled)
    boundedPooled.pathname = `/${bounded}`
    const { child, lines, url } = await startServe({ DATABASE_URL: boundedPooled.toString(), DATABASE_STATEMENT_TIMEOUT_MS: '2000' })
    expect(lines.filter((line) => String(line.msg).startsWith('the database does not cancel'))).toEqual([])

    const operator = new pg.Client({ connectionString: boundedDirect.toString() })
    await operator.connect()
    try {
      await operator.query(`insert into orders (external_reference) values ('bounded-0')`)
      await operator.query('begin')
      await operator.query(`select id from orders where external_reference = 'bounded-0' for update`)
      expect(await deliverTo(url, 900, 'bounded-0', 'funded')).toBe(503)
      await operator.query('rollback')
      // a delivery through the pool after the lock went, and the 503 was not written
      await operator.query(`insert into orders (external_reference) values ('bounded-1')`)
      expect(await deliverTo(url, 901, 'bounded-1', 'funded')).toBe(200)
      const { rows } = await operator.query<{ id: string }>(`select delivery_id as id from webhook_deliveries order by 1`)
      expect(rows).toEqual([{ id: 'pool-901' }])
    } finally {
      await operator.end()
    }
    child.kill('SIGTERM')
    expect((await once(child, 'exit'))[0]).toBe(0)
  })
})
