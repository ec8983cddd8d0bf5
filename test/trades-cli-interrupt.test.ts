// `trades open` and `trades fund` as their own processes (the compiled CLI; on embedded PGlite, and on Postgres
// through DATABASE_URL when TEST_DATABASE_URL is given), stopped by signals while their POST is at a platform that
// holds it until the test answers: the call is in flight for certain when the signal is sent. The first signal
// waits for the answer, which is recorded and printed, exit 130; a second one stops waiting and leaves the order
// as a timeout does (checked against a run that times out), exit 130.
import { type ChildProcess } from 'node:child_process'
import type { Kysely } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { killLeftovers, startedCli } from './helpers/cli-process.js'
import { casesLeftOut, type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { useHoldingPlatform } from './helpers/holding-platform.js'
import { milestoneRecord, tradeRecord } from './helpers/partner-api-fixtures.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { expectPolledAfterTheCall, expectStoppedWaiting, FIRST_IN_FLIGHT, says, stopWaitingAtASecondSignal } from './helpers/signals-in-flight.js'

const DAY = 86_400_000
/** What a call whose outcome is not known says of it: a create's (`trades open REF`), another operation's. */
const unknownCreate = (reference: string) =>
  'The trade may or may not exist: the order is marked unknown and is linked when the trade’s webhook arrives. Send ' +
  `the create again only on purpose: \`trades open ${reference} ... --retry\`.`
const UNKNOWN_OPERATION = 'The platform may or may not have done it: check with `trades get` (the order is polled soon).'

const platform = useHoldingPlatform()
const children: ChildProcess[] = []
const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  killLeftovers(children)
  for (const cleanup of cleanups) await cleanup()
})

/**
 * One CLI run. `marker` is in its request's path or body (the order's reference or trade id): the held request
 * it waits for is its own, never one that another run's call left at the platform.
 */
function started(args: string[], env: Record<string, string>, marker: string) {
  const run = startedCli(args, env, children)
  /** Its request, once the platform holds it, failing if the process ends before it sends one. */
  return { ...run, request: () => platform.requestOf(run, marker) }
}

/**
 * One signal while the call (a POST to `path`) is at the platform, which then answers `status` `body`: the command
 * waits for that answer, and exits 130. How it ended.
 */
async function waitsForTheAnswerAtAFirstSignal(run: ReturnType<typeof started>, path: string, status: number, body: unknown) {
  const request = await run.request()
  expect(request).toMatchObject({ method: 'POST', path })
  run.child.kill('SIGINT')
  await says(run, FIRST_IN_FLIGHT)
  request.respond(status, body)
  const ended = await run.ended()

  expect({ code: ended.code, signal: ended.signal }, ended.stderr.slice(-2_000)).toEqual({ code: 130, signal: null })
  return ended
}

/** Two signals while the call is at the platform: the command stops waiting, says the outcome is unknown, exits 130. */
async function stopsWaitingAtASecondSignal(run: ReturnType<typeof started>, unknownWords: string): Promise<void> {
  expectStoppedWaiting(await stopWaitingAtASecondSignal(run, await run.request()), unknownWords)
}

/**
 * The same call on another order, timed out instead (the platform never answers): exit 1, the same words. The timeout
 * is 2 s: at 300 ms a run at a load of 20 had no connection yet when it ended, and was rightly told apart as a call
 * not sent (`[not_sent]`), which is not what this checks.
 */
async function timesOutWithTheSameWords(args: string[], env: Record<string, string>, unknownWords: string): Promise<void> {
  const timedOut = await started(args, { ...env, PARTNER_API_TIMEOUT_MS: '2000' }, args[2]!).ended()
  expect(timedOut.code, timedOut.stderr).toBe(1)
  expect(timedOut.stderr).toMatch(/ \[outcome_unknown\]\n$/)
  expect(timedOut.stderr).toContain(`${unknownWords} [outcome_unknown]\n`)
}

const openArgs = (reference: string) => [
  'trades', 'open', reference, '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1', '--json',
]

async function orderState(read: Reader, externalReference: string) {
  return read((db) =>
    db
      .selectFrom('orders')
      .select(['tradeId', 'tradeStatus', 'tradeCreateState', 'nextPollAt'])
      .where('externalReference', '=', externalReference)
      .executeTakeFirstOrThrow(),
  )
}

/** A database with the funded-to-be orders, and the environment of a CLI run on it alone. */
function seeded(kind: 'pglite' | 'postgres', fundOrders: string[]): Promise<{ env: Record<string, string>; read: Reader }> {
  const seed = (db: Kysely<Database>) =>
    insertOrders(
      db,
      fundOrders.map((externalReference) => ({
        externalReference,
        tradeStatus: externalReference.startsWith('milestone') ? 'funded' : 'created',
        nextPollAt: new Date(Date.now() + DAY),
      })),
    )
  return seededCliDatabase(kind, { prefix: 'trades-interrupt-', env: { PARTNER_API_BASE_URL: platform.url }, seed, cleanups })
}

for (const kind of ['pglite', 'postgres'] as const) {
  const name = kind === 'postgres' ? 'on Postgres through DATABASE_URL (Postgres)' : 'on embedded PGlite'
  describe.skipIf(casesLeftOut(kind))(`trades commands stopped by a signal, ${name}`, () => {
    let env: Record<string, string>
    let read: Reader
    beforeAll(async () => {
      ;({ env, read } = await seeded(kind, ['fund-answered', 'fund-abandoned', 'fund-timeout', 'fund-signal-timeout', 'milestone-answered']))
    })

    it('trades open: the first Ctrl-C waits for the answer, which is printed and recorded, and exits 130', async () => {
      const run = started(openArgs('open-answered'), env, 'open-answered')
      const ended = await waitsForTheAnswerAtAFirstSignal(
        run,
        '/api/partner/v1/trades/',
        201,
        tradeRecord({ trade_id: 'tr_open-answered', external_reference: 'open-answered' }),
      )
      expect(JSON.parse(ended.stdout).trade.trade_id).toBe('tr_open-answered')
      expect(ended.stderr).toContain('stopped by a signal after the call in flight')
      // as on success: linked, created, polled if no webhook comes
      expect(await orderState(read, 'open-answered')).toMatchObject({
        tradeId: 'tr_open-answered',
        tradeStatus: 'created',
        tradeCreateState: 'created',
      })
    })

    it('trades open: a second signal stops waiting, says the outcome is unknown, exits 130, and leaves what a timeout leaves', async () => {
      const run = started(openArgs('open-abandoned'), env, 'open-abandoned')
      await stopsWaitingAtASecondSignal(run, unknownCreate('open-abandoned'))

      // another order, timed out instead: the same words and the same state
      await timesOutWithTheSameWords(openArgs('open-timeout'), env, unknownCreate('open-timeout'))
      const abandoned = await orderState(read, 'open-abandoned')
      expect(abandoned).toMatchObject({ tradeId: null, tradeCreateState: 'unknown' })
      expect(abandoned).toEqual(await orderState(read, 'open-timeout'))
    })

    it('trades fund: the first Ctrl-C waits for the answer, which is printed and applied, and exits 130', async () => {
      const run = started(['trades', 'fund', 'fund-answered', '--json'], env, 'tr_fund-answered')
      const ended = await waitsForTheAnswerAtAFirstSignal(
        run,
        '/api/partner/v1/trades/tr_fund-answered/fund/',
        200,
        tradeRecord({ trade_id: 'tr_fund-answered', external_reference: 'fund-answered', status: 'funded' }),
      )
      expect(JSON.parse(ended.stdout).trade.status).toBe('funded')
      expect(ended.stderr).toContain('stopped by a signal after the call in flight')
      const after = await orderState(read, 'fund-answered')
      expect(after.tradeStatus).toBe('funded')
      expect(after.nextPollAt!.getTime()).toBeLessThan(Date.now() + DAY / 2)
    })

    // a milestone record holds no trade status: of it the order records only its poll brought forward, and the line
    // after the signal said "recorded locally"
    it('trades milestone deliver answered with the milestone record: the first Ctrl-C, and the line says only the poll is recorded, exit 130', async () => {
      const run = started(['trades', 'milestone', 'deliver', 'milestone-answered', 'ms_1', '--json'], env, 'tr_milestone-answered')
      const ended = await waitsForTheAnswerAtAFirstSignal(
        run,
        '/api/partner/v1/trades/tr_milestone-answered/milestones/ms_1/deliver/',
        200,
        milestoneRecord({ milestone_id: 'ms_1', status: 'delivered' }),
      )
      expect(JSON.parse(ended.stdout).milestone.status).toBe('delivered')
      expect(ended.stderr).toMatch(
        /\nstopped by a signal after the call in flight: the platform’s answer is above, and the order records only its poll brought forward \(a milestone record holds no trade status\)\n$/,
      )
      const after = await orderState(read, 'milestone-answered')
      expect(after.tradeStatus).toBe('funded')
      expect(after.nextPollAt!.getTime()).toBeLessThan(Date.now() + DAY / 2)
    })

    // found from outside: the first Ctrl-C, then no answer within PARTNER_API_TIMEOUT_MS, exited 1 and said nothing of
    // the signal (an answer came: 130); the timeout is the one end, whatever the machine's speed, well after the signal
    it('trades fund: the first Ctrl-C, then no answer in time: the outcome is unknown, said as a timeout, and exits 130', async () => {
      const run = started(['trades', 'fund', 'fund-signal-timeout'], { ...env, PARTNER_API_TIMEOUT_MS: '8000' }, 'tr_fund-signal-timeout')
      await run.request()
      run.child.kill('SIGINT')
      await says(run, FIRST_IN_FLIGHT)
      const ended = await run.ended()

      expect({ code: ended.code, signal: ended.signal }, ended.stderr.slice(-2_000)).toEqual({ code: 130, signal: null })
      expect(ended.stdout).toBe('')
      expect(ended.stderr).toContain(UNKNOWN_OPERATION)
      expect(ended.stderr).toContain(' [outcome_unknown]\n')
      expect(ended.stderr).toMatch(/\nstopped by a signal while the call was in flight: its outcome is above\n$/)
    })

    it('trades fund: a second signal stops waiting, says the outcome is unknown, exits 130, and leaves what a timeout leaves', async () => {
      const before = Date.now()
      const run = started(['trades', 'fund', 'fund-abandoned'], env, 'tr_fund-abandoned')
      await stopsWaitingAtASecondSignal(run, UNKNOWN_OPERATION)

      await timesOutWithTheSameWords(['trades', 'fund', 'fund-timeout'], env, UNKNOWN_OPERATION)
      const after = Date.now()
      // both: status unchanged, polled EXPECTED_WEBHOOK_S after the call rather than a day later
      for (const reference of ['fund-abandoned', 'fund-timeout']) {
        const state = await orderState(read, reference)
        expect(state.tradeStatus, reference).toBe('created')
        expectPolledAfterTheCall(state.nextPollAt, { before, after }, reference)
      }
    })
  })
}
