// `trades open` and `trades fund` as their own processes (the compiled CLI; on embedded PGlite, and on Postgres through
// DATABASE_URL when TEST_DATABASE_URL is given), stopped by two signals while their connection to the platform is
// still being set up: the platform is a listener whose backlog is full, so the connect stays in SYN-SENT (as behind a
// firewall that drops packets), and the signals are sent once the CLI's own socket is seen in that state. Not one byte
// of the request was written, so the call was not sent: the second signal read as a giving up on an answer, said
// `[outcome_unknown]` and marked the create unknown (a fund's order was polled soon), though nothing had left.
// Linux only: the CLI's socket is found in /proc.
import { type ChildProcess } from 'node:child_process'
import type { Kysely } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { killLeftovers, startedCli } from './helpers/cli-process.js'
import { casesLeftOut, type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { connectingTo, useUnansweredListener } from './helpers/unanswered-connect.js'

const DAY = 86_400_000
const children: ChildProcess[] = []
const cleanups: (() => Promise<void>)[] = []
const platform = useUnansweredListener()
afterAll(async () => {
  killLeftovers(children)
  for (const cleanup of cleanups) await cleanup()
})

async function until(check: () => boolean, what: string, run: ReturnType<typeof startedCli>): Promise<void> {
  for (const deadline = Date.now() + 30_000; Date.now() < deadline; ) {
    if (run.closed()) throw new Error(`ended before ${what}:\n${run.stderr()}`)
    if (check()) return
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`timed out: ${what}\n${run.stderr()}`)
}

/** Runs `args` until its connection to the platform is under way, then SIGINT and, once it waits, SIGTERM. */
async function stoppedWhileConnecting(args: string[], env: Record<string, string>) {
  const run = startedCli(args, env, children)
  await until(() => connectingTo(run.child.pid!, platform.port), 'its connection to the platform is under way', run)
  run.child.kill('SIGINT')
  await until(() => run.stderr().includes('to the call in flight'), 'the first signal is taken', run)
  run.child.kill('SIGTERM')
  return run.ended()
}

async function orderState(read: Reader, externalReference: string) {
  return read((db) =>
    db
      .selectFrom('orders')
      .select(['tradeId', 'tradeStatus', 'tradeCreateState', 'tradeCreateWaitMs', 'nextPollAt', 'attention'])
      .where('externalReference', '=', externalReference)
      .executeTakeFirstOrThrow(),
  )
}

for (const kind of ['pglite', 'postgres'] as const) {
  const name = kind === 'postgres' ? 'on Postgres through DATABASE_URL (Postgres)' : 'on embedded PGlite'
  describe.skipIf(casesLeftOut(kind))(`a second stop signal while the connection is being set up, ${name}`, () => {
    let env: Record<string, string>
    let read: Reader
    const polledAt = new Date(Date.now() + DAY)
    beforeAll(async () => {
      const seed = (db: Kysely<Database>) =>
        insertOrders(db, [
          { externalReference: 'fund-connecting', tradeStatus: 'created', nextPollAt: polledAt },
          { externalReference: 'fund-connect-timeout', tradeStatus: 'created', nextPollAt: polledAt },
        ])
      ;({ env, read } = await seededCliDatabase(kind, {
        prefix: 'trades-stop-connecting-',
        // far past the test: the connect never ends by the call's timeout while the signals come
        env: { PARTNER_API_BASE_URL: `http://127.0.0.1:${platform.port}`, PARTNER_API_TIMEOUT_MS: '120000' },
        seed,
        cleanups,
      }))
    })

    it('trades open: nothing was sent, said as a stop before sending ([stopped], exit 130), and the create is not marked unknown', async () => {
      const open = ['trades', 'open', 'open-connecting', '--title', 'A lamp', '--amount', '10.00', '--currency', 'KES', '--seller', 'usr_1']
      const ended = await stoppedWhileConnecting(open, env)

      expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
      expect(ended.stdout).toBe('')
      expect(ended.stderr).toMatch(
        /\nStopped by a signal before the trade create for order open-connecting was sent \(its connection to the platform was not up yet\): nothing sent to the platform, the order created locally, with no trade \[stopped\]\n$/,
      )
      expect(ended.stderr).not.toContain('outcome_unknown')
      expect(ended.stderr).not.toContain('may or may not')
      expect(await orderState(read, 'open-connecting')).toMatchObject({ tradeId: null, tradeCreateState: 'none', tradeCreateWaitMs: null, attention: null })
    })

    it('trades fund: nothing was sent, said as a stop before sending, and the order is not polled soon', async () => {
      const ended = await stoppedWhileConnecting(['trades', 'fund', 'fund-connecting'], env)

      expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
      expect(ended.stdout).toBe('')
      expect(ended.stderr).toMatch(
        /\nStopped by a signal before the fund call on trade tr_fund-connecting for order fund-connecting was sent \(its connection to the platform was not up yet\): nothing sent to the platform, the order as it was \[stopped\]\n$/,
      )
      expect(ended.stderr).not.toContain('outcome_unknown')
      // as it was: a call never sent moves nothing, and brings the order's poll no nearer
      const after = await orderState(read, 'fund-connecting')
      expect(after).toMatchObject({ tradeStatus: 'created', nextPollAt: polledAt })
    })

    // as `trades fund`'s first Ctrl-C then no answer in time (test/trades-cli-interrupt.test.ts): it exited 1, the
    // signal unmentioned; the timeout is the one end, well after the signal
    it('trades fund: the first Ctrl-C, then no connection in time: [not_sent], the signal said, exit 130', async () => {
      const run = startedCli(['trades', 'fund', 'fund-connect-timeout'], { ...env, PARTNER_API_TIMEOUT_MS: '8000' }, children)
      await until(() => connectingTo(run.child.pid!, platform.port), 'its connection to the platform is under way', run)
      run.child.kill('SIGINT')
      const ended = await run.ended()

      expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
      expect(ended.stdout).toBe('')
      expect(ended.stderr).toContain('waiting for the platform’s answer to the call in flight')
      expect(ended.stderr).toContain('no connection within 8,000 ms, so the request was not written')
      expect(ended.stderr).toMatch(/ \[not_sent\]\nstopped by a signal while the call waited for its connection: nothing was sent \(above\)\n$/)
      expect(await orderState(read, 'fund-connect-timeout')).toMatchObject({ tradeStatus: 'created', nextPollAt: polledAt })
    })
  })
}
