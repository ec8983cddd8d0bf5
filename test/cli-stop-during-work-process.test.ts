// A stop signal during a command's own work (a statement waiting on a lock another session holds, a long requeue, a
// webhook whose receiver never answers): the command ended killed by the signal, without a word (exit 143 for
// SIGTERM, 130 for SIGINT, each a shell's number for a signal, not the command's). Now it says it was stopped and what
// that means, and exits 130 with [stopped]: a command of one transaction did nothing; `reconcile --requeue-open`,
// which commits a slice of 10,000 orders at a time, stops after the slice in flight and says how many it requeued.
import { type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, expect, it } from 'vitest'
import { MIGRATION_LOCK_KEY } from '../src/db/migrate.js'
import { killLeftovers, receiverEnv, spawnCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'
import { tradePayload } from './helpers/webhook-delivery.js'

const children: ChildProcess[] = []
const cleanups: (() => Promise<void>)[] = []
const scratch = mkdtempSync(path.join(tmpdir(), 'cli-stop-work-'))
afterAll(async () => {
  killLeftovers(children)
  for (const cleanup of cleanups.splice(0)) await cleanup()
  rmSync(scratch, { recursive: true, force: true })
})

/** The compiled CLI, its stdout and stderr read. */
function started(args: string[], env: Record<string, string>) {
  const child = spawnCli(args, env, { built: true })
  children.push(child)
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (chunk) => (stdout += chunk))
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  const ended = once(child, 'close') as Promise<[number | null, NodeJS.Signals | null]>
  return {
    child,
    stdout: () => stdout,
    stderr: () => stderr,
    ended: async () => {
      const [code, signal] = await ended
      return { code, signal, stdout, stderr }
    },
  }
}

async function until(check: () => Promise<boolean> | boolean, what: string): Promise<void> {
  for (const deadline = Date.now() + 120_000; Date.now() < deadline; ) {
    if (await check()) return
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error(`timed out: ${what}`)
}

describePostgres('a stop signal during a command’s work on Postgres', () => {
  let database: TestDatabase
  let holder: pg.Client
  // another session: one in a transaction sees pg_stat_activity as it was at the transaction's first look
  let watcher: pg.Client
  const application = `cli-stop-work-${process.pid}`

  async function setUp(): Promise<Record<string, string>> {
    database ??= await createTestDatabase({ kind: 'postgres' })
    if (!holder) {
      cleanups.push(() => database.close())
      holder = new pg.Client({ connectionString: database.url! })
      await holder.connect()
      watcher = new pg.Client({ connectionString: database.url! })
      await watcher.connect()
      cleanups.unshift(() => holder.end(), () => watcher.end())
    }
    const url = new URL(database.url!)
    url.searchParams.set('application_name', application)
    return { ...receiverEnv(path.join(scratch, 'data')), DATABASE_URL: url.toString() }
  }

  /** True once a statement of the command's waits on a lock. */
  async function commandWaitsOnLock(): Promise<boolean> {
    const { rows } = await watcher.query<{ n: number }>(
      `select count(*)::int as n from pg_stat_activity where application_name = $1 and wait_event_type = 'Lock'`,
      [application],
    )
    return rows[0]!.n > 0
  }

  it.each([
    ['orders list', ['orders', 'list'], 'SIGTERM'],
    ['orders create', ['orders', 'create', '--external-reference', 'stop-locked'], 'SIGINT'],
  ] as const)('%s waiting on a table lock: says it did nothing, exit 130 [stopped]', async (_, args, signal) => {
    const env = await setUp()
    await holder.query('begin')
    try {
      await holder.query('lock table orders')
      const command = started([...args], env)
      await until(commandWaitsOnLock, 'the command waits on the lock')
      command.child.kill(signal)
      const ended = await command.ended()
      expect(ended.stderr).toMatch(/Stopped by a signal before the command was done: nothing was done \(.*\) \[stopped\]\n$/)
      expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
    } finally {
      await holder.query('rollback')
    }
    const { rows } = await holder.query(`select 1 from orders where external_reference = 'stop-locked'`)
    expect(rows).toEqual([])
  }, 180_000)

  it('migrate waiting on the migration lock: says it did nothing, exit 130 [stopped]', async () => {
    const env = await setUp()
    await holder.query('begin')
    try {
      await holder.query('select pg_advisory_xact_lock($1::bigint)', [MIGRATION_LOCK_KEY])
      const command = started(['migrate'], env)
      await until(commandWaitsOnLock, 'migrate waits on the lock')
      command.child.kill('SIGTERM')
      const ended = await command.ended()
      expect(ended.stderr).toMatch(/nothing was done .*\[stopped\]\n$/)
      expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
    } finally {
      await holder.query('rollback')
    }
  }, 180_000)

  // 25,000 open orders, three slices: the second waits on a row the test holds; the signal comes then, and once the
  // row is let go that slice ends and the command stops, the third not run
  it('reconcile --requeue-open stops after the batch in flight and says how many it requeued, exit 130 [stopped]', async () => {
    const env = await setUp()
    await holder.query(`delete from orders`)
    await holder.query(
      `insert into orders (external_reference, trade_id, next_poll_at)
       select 'open-' || g, 'trd_open_' || g, now() + interval '1 day' from generate_series(1, 25000) g`,
    )
    const { rows: ids } = await holder.query<{ id: number }>(`select id from orders order by id offset 15000 limit 1`)
    await holder.query('begin')
    let command: ReturnType<typeof started>
    try {
      await holder.query('select 1 from orders where id = $1 for update', [ids[0]!.id])
      command = started(['reconcile', '--requeue-open', '--within', '0'], env)
      await until(commandWaitsOnLock, 'the second slice waits on the row')
      command.child.kill('SIGTERM')
      await until(() => command.stderr().includes('stopping after the batch in flight'), 'the command takes the signal')
    } finally {
      await holder.query('rollback')
    }
    const ended = await command.ended()
    expect(ended.stderr).toMatch(/stopped by a signal after the batch in flight: 20,000 of 25,000 open orders were requeued \(above\); .*\[stopped\]\n$/)
    expect(ended.stdout).toContain('20,000 open order(s) due now')
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
    const { rows } = await holder.query<{ n: number }>(`select count(*)::int as n from orders where next_poll_at <= now()`)
    expect(rows).toEqual([{ n: 20_000 }])
  }, 180_000)
})

it('webhook send to a receiver that never answers: says the delivery may have been taken, exit 130 [stopped]', async () => {
  let received = false
  const silent: Server = createServer(() => {
    received = true
  })
  silent.listen(0, '127.0.0.1')
  await once(silent, 'listening')
  try {
    const file = path.join(scratch, 'body.json')
    writeFileSync(file, JSON.stringify(tradePayload('stop-send', 'funded')))
    const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}/webhooks/partner`
    const command = started(['webhook', 'send', '--file', file, '--url', url, '--secret', 'whsec_stop', '--delivery-id', 'dlv-stop-1'], {
      DATA_DIR: migratedDataDir('cli-stop-send-'),
    })
    await until(() => received, 'the receiver has the request')
    command.child.kill('SIGTERM')
    const ended = await command.ended()
    expect(ended.stderr).toMatch(/Stopped by a signal before the receiver's answer: delivery dlv-stop-1 may or may not have been taken; .*\[stopped\]\n$/)
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
  } finally {
    silent.closeAllConnections()
    silent.close()
  }
}, 120_000)
