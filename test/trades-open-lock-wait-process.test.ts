// `trades open` whose statements wait on a lock another session holds, over Postgres and the compiled CLI.
// - F2: the create's pending mark was stamped with its statement's start, and a wait on a lock ate the create's whole
//   time: another `trades open` called the create "past its timeout: the command sending it stopped" while it was
//   still to be sent, and its --retry sent a second create while the first was at the platform. Its whole time now
//   counts from the stamp written as it leaves.
// - F3: a SIGINT then a SIGTERM while the mark waited: the process ended (exit 143) without a word, the mark committed
//   once the lock went, and the next `trades open` said the create "was sent … its answer was never recorded"
//   [trade_create_unknown], though nothing had been sent. Now the second signal says the mark may or may not have been
//   made, and a mark whose command stopped before sending reads as never sent.
// - The create is sent only when its sent stamp came back within SEND_WITHIN_MS; three stamps that each waited longer
//   on a lock send nothing and end [database_slow], the order set back.
// The lock is a transaction's only statement, LOCK TABLE … IN SHARE MODE: no transaction id, no snapshot, so the wait
// holds back no other session's horizon.
import { type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { killLeftovers, runCli, startedCli } from './helpers/cli-process.js'
import { type GatedPlatform, startGatedPlatform } from './helpers/gated-platform.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const scratch = mkdtempSync(path.join(tmpdir(), 'trades-open-lock-'))
const children: ChildProcess[] = []
const OPEN = ['--title', 'Bicycle', '--amount', '10.00', '--currency', 'EUR', '--seller', 's1']

const started = (args: string[], env: Record<string, string>) => startedCli(args, env, children)

async function until(check: () => Promise<boolean> | boolean, what: string): Promise<void> {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; ) {
    if (await check()) return
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error(`timed out: ${what}`)
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describePostgres('trades open waiting on a lock (Postgres)', () => {
  let database: TestDatabase
  let platform: GatedPlatform
  let watcher: pg.Client
  const application = `trades-open-lock-${process.pid}`
  let env: Record<string, string>

  beforeAll(async () => {
    database = await createTestDatabase({ kind: 'postgres' })
    watcher = new pg.Client({ connectionString: database.url! })
    await watcher.connect()
    platform = await startGatedPlatform()
    const url = new URL(database.url!)
    url.searchParams.set('application_name', application)
    env = {
      DATA_DIR: path.join(scratch, 'data'),
      DATABASE_URL: url.toString(),
      // no statement of the command's ends at its statement timeout while the test holds the lock
      DATABASE_STATEMENT_TIMEOUT_MS: '60000',
      PARTNER_API_BASE_URL: platform.url,
      PARTNER_API_KEY_ID: TEST_API_KEY_ID,
      PARTNER_API_SECRET: TEST_API_SECRET,
      WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
    }
  })

  afterAll(async () => {
    killLeftovers(children)
    await platform?.close()
    await watcher?.end()
    await database?.close()
    rmSync(scratch, { recursive: true, force: true })
  })

  /** A session holding SHARE on orders, taken as its transaction's only statement: no transaction id. */
  async function holdOrders(): Promise<{ client: pg.Client; pid: number }> {
    const client = new pg.Client({ connectionString: database.url! })
    client.on('error', () => {})
    await client.connect()
    const { rows } = await client.query<{ pid: number }>('select pg_backend_pid() as pid')
    await client.query('begin; lock table orders in share mode')
    const held = await watcher.query(`select backend_xid from pg_stat_activity where pid = $1`, [rows[0]!.pid])
    expect(held.rows).toEqual([{ backend_xid: null }])
    return { client, pid: rows[0]!.pid }
  }

  /**
   * A session asking for SHARE on orders behind whatever waits for the table now (a waiter's ROW EXCLUSIVE comes first
   * in the lock's queue): it is granted the moment that waiter's statement commits, before the command has its answer,
   * so the command's next write waits on it. `granted` resolves then, its transaction checked to hold no transaction id.
   */
  async function queueHolder(): Promise<{ client: pg.Client; pid: number; granted: Promise<void> }> {
    const client = new pg.Client({ connectionString: database.url! })
    client.on('error', () => {})
    await client.connect()
    const { rows } = await client.query<{ pid: number }>('select pg_backend_pid() as pid')
    const pid = rows[0]!.pid
    const granted = client.query('begin; lock table orders in share mode').then(async () => {
      const held = await watcher.query(`select backend_xid from pg_stat_activity where pid = $1`, [pid])
      expect(held.rows).toEqual([{ backend_xid: null }])
    })
    granted.catch(() => {})
    await until(async () => {
      const waiting = await watcher.query<{ n: number }>('select cardinality(pg_blocking_pids($1))::int as n', [pid])
      return waiting.rows[0]!.n > 0
    }, 'the next holder waits in the queue')
    return { client, pid, granted }
  }

  async function release(holder: { client: pg.Client; pid: number }): Promise<void> {
    await watcher.query('select pg_terminate_backend($1)', [holder.pid])
    await holder.client.end().catch(() => {})
  }

  async function waitsOn(holder: { pid: number }): Promise<boolean> {
    const { rows } = await watcher.query<{ n: number }>(
      `select count(*)::int as n from pg_stat_activity where application_name = $1 and $2 = any(pg_blocking_pids(pid))`,
      [application, holder.pid],
    )
    return rows[0]!.n > 0
  }

  async function orderRow(reference: string) {
    const { rows } = await watcher.query(
      `select trade_id, trade_create_state, trade_create_wait_ms, updated_at, now() as now from orders where external_reference = $1`,
      [reference],
    )
    return rows[0] as { trade_id: string | null; trade_create_state: string; trade_create_wait_ms: number | null; updated_at: Date; now: Date }
  }

  const creates = () => platform.requests.filter((each) => each.method === 'POST' && each.path.endsWith('/v1/trades/'))

  it('a mark that waited on a lock past the whole time: a --retry while the create is at the platform sends nothing', async () => {
    const timeoutEnv = { ...env, PARTNER_API_TIMEOUT_MS: '15000' }
    expect((await runCli(['orders', 'create', '--external-reference', 'f2-1'], timeoutEnv)).code).toBe(0)
    const before = creates().length
    let retrying: ReturnType<typeof runCli> | undefined
    platform.gate = {
      tradeId: 'tr_f2',
      before: async () => {
        if (retrying) return
        // while this create is at the platform (its answer held until then): the operator's --retry
        retrying = runCli(['trades', 'open', 'f2-1', ...OPEN, '--retry'], timeoutEnv)
        await retrying
      },
    }
    const holder = await holdOrders()
    let opening: ReturnType<typeof started> | undefined
    try {
      opening = started(['trades', 'open', 'f2-1', ...OPEN], timeoutEnv)
      await until(() => waitsOn(holder), 'the mark waits on the lock')
      // past the create's whole time (15 s and the 5 s margin) from the mark's statement's start
      await sleep(21_000)
    } finally {
      await release(holder)
    }
    const ended = await opening.ended()
    const retried = await retrying
    platform.gate = {}
    expect(creates().length - before).toBe(1)
    expect(retried?.stderr).toMatch(/\[trade_create_in_flight\]/)
    expect(ended.stdout).toMatch(/f2-1: trade tr_f2 \(.*\) is created/)
    expect(ended.code).toBe(0)
    expect(await orderRow('f2-1')).toMatchObject({ trade_id: 'tr_f2', trade_create_state: 'created' })
  })

  // the create is sent only when its sent stamp came back within SEND_WITHIN_MS (2 s) of being issued, written again up
  // to three times: here each of the three waits 3 s or more on a lock (each holder taken in turn, as the stamp before
  // it commits), and the command sends nothing, sets the order back and says so, [database_slow]
  it('a sent stamp that waits on a lock past 2 s three times: nothing is sent, the order is set back, [database_slow]', async () => {
    expect((await runCli(['orders', 'create', '--external-reference', 'slow-1'], env)).code).toBe(0)
    const before = creates().length
    platform.gate = { tradeId: 'tr_slow' }
    let holder: { client: pg.Client; pid: number } = await holdOrders()
    let opening: ReturnType<typeof started> | undefined
    const holders = [holder]
    try {
      opening = started(['trades', 'open', 'slow-1', ...OPEN], env)
      // the mark waits on the first holder; the next one queues behind it and takes the table as the mark commits
      await until(() => waitsOn(holder), 'the mark waits on the lock')
      let next = await queueHolder()
      holders.push(next)
      await release(holder)
      await next.granted
      holder = next
      for (let stamp = 1; stamp <= 3; stamp += 1) {
        await until(() => {
          // a stamp that came back late is no leave to send: failed here, at once, if one was taken as such
          if (creates().length !== before) throw new Error(`a create reached the platform before sent stamp ${stamp}`)
          return waitsOn(holder)
        }, `sent stamp ${stamp} waits on the lock`)
        expect((await orderRow('slow-1')).trade_create_state).toBe('pending')
        if (stamp < 3) {
          next = await queueHolder()
          holders.push(next)
        }
        // longer than SEND_WITHIN_MS, counted from before the stamp was seen waiting
        await sleep(3_000)
        await release(holder)
        if (stamp < 3) {
          await next.granted
          holder = next
        }
      }
      await until(() => opening!.closed() !== undefined, 'the command ends')
    } finally {
      for (const each of holders) await release(each)
    }
    const ended = await opening.ended()
    expect(ended.stdout).toBe('')
    expect(ended.stderr).toMatch(
      /^The database took \d+\.\d s to stamp order slow-1's create as leaving \(3 times over 2 s: a lock wait\?\): nothing was sent to the platform, and the order is set back to none\. Run the command again once the database answers in time\. \[database_slow\]\n$/,
    )
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 1, signal: null })
    expect(creates().length - before).toBe(0)
    expect(await orderRow('slow-1')).toMatchObject({ trade_id: null, trade_create_state: 'none', trade_create_wait_ms: null })
    // set back to none: the same command, the database answering in time, sends the create at once
    const again = await runCli(['trades', 'open', 'slow-1', ...OPEN], env)
    platform.gate = {}
    expect({ stdout: again.stdout, code: again.code }, again.stderr).toMatchObject({ stdout: expect.stringMatching(/slow-1: trade tr_slow \(.*\) is created/), code: 0 })
    expect(creates().length - before).toBe(1)
  })

  it('SIGINT then SIGTERM while the mark waits: says it may or may not have been made; the mark, committed later, reads as never sent', async () => {
    const timeoutEnv = { ...env, PARTNER_API_TIMEOUT_MS: '3000' }
    expect((await runCli(['orders', 'create', '--external-reference', 'f3-1'], timeoutEnv)).code).toBe(0)
    const before = creates().length
    const holder = await holdOrders()
    let opening: ReturnType<typeof started> | undefined
    try {
      opening = started(['trades', 'open', 'f3-1', ...OPEN], timeoutEnv)
      await until(() => waitsOn(holder), 'the mark waits on the lock')
      opening.child.kill('SIGINT')
      await until(() => opening!.stderr().includes('stopping before the call'), 'the first signal is taken')
      opening.child.kill('SIGTERM')
      await until(() => opening!.closed() !== undefined, 'the command ends')
    } finally {
      await release(holder)
    }
    const ended = await opening.ended()
    expect(ended.stderr).toMatch(/Stopped by a second signal while .* was in flight: nothing was sent to the platform, and the write may or may not have been made .*`orders show f3-1`.* \[stopped\]\n$/s)
    expect({ code: ended.code, signal: ended.signal }).toEqual({ code: 130, signal: null })
    // the mark's statement runs on without the process, and commits once the lock is gone
    await until(async () => (await orderRow('f3-1')).trade_create_state === 'pending', 'the mark commits')
    expect(creates().length - before).toBe(0)
    const shown = await runCli(['orders', 'show', 'f3-1'], timeoutEnv)
    expect(shown.stdout).toMatch(/create +pending \(marked, not sent\)/)
    // once its whole time is up (3 s and the 5 s margin), the next open sends it, no --retry needed
    await until(async () => {
      const row = await orderRow('f3-1')
      return row.now.getTime() > row.updated_at.getTime() + 8_500
    }, 'the mark is past its whole time')
    platform.gate = { tradeId: 'tr_f3' }
    const next = await runCli(['trades', 'open', 'f3-1', ...OPEN], timeoutEnv)
    platform.gate = {}
    expect(next.stderr).not.toMatch(/trade_create_unknown/)
    expect(next.stderr).toMatch(/stopped before sending it: nothing was sent then/)
    expect({ stdout: next.stdout, stderr: next.stderr, code: next.code }).toMatchObject({ stdout: expect.stringMatching(/f3-1: trade tr_f3 \(.*\) is created/), code: 0 })
    expect(creates().length - before).toBe(1)
  })
})
