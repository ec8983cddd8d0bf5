// `disputes open`, `proposals create` and `proposals respond` as their own processes (the compiled CLI; on embedded
// PGlite, and on Postgres through DATABASE_URL when TEST_DATABASE_URL is given), stopped by signals during their call to
// the platform, as `trades open|fund` are (test/trades-cli-interrupt.test.ts, test/trades-call-commit-in-flight-process
// .test.ts, test/trades-stop-while-connecting-process.test.ts): each holds the signals the same way
// (src/cli/hold-signals-for-call.ts), and what it prints and records is checked here for each.
// - a first signal while the call is at a platform that holds it: the command waits for the answer, prints it, records
//   it (a respond's trade status applied; of a dispute or proposal record, which holds none, only the poll brought
//   forward, and the line says so: it said "recorded locally"), exit 130; answered with a record of something else
//   (another trade's, another proposal's), the `[answer_mismatch]` line with the signal said, exit 130 (it was 1);
// - a second signal while the call is at the platform: the command stops waiting, and the call ends as a timeout does
//   (the command's own words of an outcome not known, the order's poll brought forward), exit 130;
// - three signals once the platform has answered, its recording held (on Postgres a SHARE lock of the orders table,
//   taken with no transaction id; on PGlite a BEFORE UPDATE trigger, helpers/pglite-statement-hold.ts): the
//   third ends the process saying nothing of the answer was recorded, exit 130, and nothing is;
// - a platform that cannot be reached (its SYN unanswered): a first signal, then no connection in time, is the
//   `[not_sent]` line with the signal said, exit 130; a second signal while connecting is a stop before sending, exit
//   130; the order as it was either way.
import { type ChildProcess } from 'node:child_process'
import type { Kysely } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { casesLeftOut, type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { killLeftovers, startedCli } from './helpers/cli-process.js'
import { holdStatementOnPglite } from './helpers/pglite-statement-hold.js'
import { useHoldingPlatform } from './helpers/holding-platform.js'
import { disputeRecord, proposalRecord, tradeRecord } from './helpers/partner-api-fixtures.js'
import { eventually } from './helpers/reconcile-poller.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { expectPolledAfterTheCall, expectStoppedWaiting, FIRST_IN_FLIGHT, says, stopWaitingAtASecondSignal } from './helpers/signals-in-flight.js'
import { stopThreeTimes } from './helpers/stop-three-times.js'
import { ordersShareLock } from './helpers/orders-share-lock.js'
import { connectingTo, useUnansweredListener } from './helpers/unanswered-connect.js'

const DAY = 86_400_000
const platform = useHoldingPlatform()
const unreachable = useUnansweredListener()
const children: ChildProcess[] = []
const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  killLeftovers(children)
  for (const cleanup of cleanups) await cleanup()
})

const answeredAfterSignal = (recorded: string) => `stopped by a signal after the call in flight: the platform’s answer is above, ${recorded}\n`

interface Command {
  name: string
  /** The operation's word in the lines: "the dispute call on trade …". */
  kind: 'dispute' | 'proposal' | 'respond'
  /** The order's trade status before the call. */
  status: string
  args: (ref: string) => string[]
  /** The platform's answer to the call on `ref`'s trade. */
  answer: (ref: string) => unknown
  /** An answer that is not of what the call was sent for (another trade's record, another proposal's). */
  otherAnswer: (ref: string) => unknown
  /** What the mismatch line says that answer is, after the order's reference: "(what was asked) with what came". */
  otherWords: (ref: string) => string
  /** What the command says of a call whose outcome is not known (a timeout, an abandoned wait). */
  unknown: (ref: string) => string
  /** What the command prints of that answer. */
  printed: (ref: string) => string
  /** The order's trade status once that answer is recorded. */
  recordedStatus: string
  /**
   * What the line after a first signal says the order records of the answer. A dispute or proposal record holds no
   * trade status, and only the order's poll is brought forward: the line said "recorded locally" of those too.
   */
  recorded: string
}

const tradeOf = (ref: string) => `tr_${ref}`
const proposalOf = (ref: string) => `pr_${ref}`

const commands: Command[] = [
  {
    name: 'disputes open',
    kind: 'dispute',
    status: 'funded',
    args: (ref) => ['disputes', 'open', ref, '--party', 'buyer', '--reason', 'The bicycle arrived with a broken frame'],
    answer: (ref) => disputeRecord({ dispute_id: `dp_${ref}`, trade_id: tradeOf(ref) }),
    otherAnswer: (ref) => disputeRecord({ dispute_id: `dp_${ref}`, trade_id: 'tr_another' }),
    unknown: () => 'The platform may or may not have done it: check with `trades get` (the order is polled soon).',
    otherWords: (ref) => `(a dispute on trade ${tradeOf(ref)}) with the record of dispute dp_${ref} of trade tr_another: another trade`,
    printed: (ref) => `${ref}: dispute dp_${ref} opened by the buyer (open)\n`,
    recordedStatus: 'funded',
    recorded: 'and the order records only its poll brought forward (a dispute record holds no trade status)',
  },
  {
    name: 'proposals create',
    kind: 'proposal',
    status: 'disputed',
    args: (ref) => ['proposals', 'create', ref, '--party', 'buyer', '--outcome', 'split', '--split-buyer-pct', '40'],
    answer: (ref) => proposalRecord({ proposal_id: proposalOf(ref), trade_id: tradeOf(ref) }),
    otherAnswer: (ref) => proposalRecord({ proposal_id: proposalOf(ref), trade_id: 'tr_another' }),
    unknown: (ref) =>
      `The proposal may or may not have been made: \`trades get ${ref}\` lists the dispute's proposals, each with who ` +
      'made it and its status; check there before proposing again, as a second `proposals create` makes a second ' +
      'proposal (the order is polled soon).',
    otherWords: (ref) => `(a proposal on trade ${tradeOf(ref)}) with the record of proposal ${proposalOf(ref)} of trade tr_another: another trade`,
    printed: (ref) => `${ref}: proposal ${proposalOf(ref)} (split) is pending\n`,
    recordedStatus: 'disputed',
    recorded: 'and the order records only its poll brought forward (a proposal record holds no trade status)',
  },
  {
    name: 'proposals respond',
    kind: 'respond',
    status: 'disputed',
    args: (ref) => ['proposals', 'respond', ref, proposalOf(ref), '--party', 'seller', '--accept'],
    answer: (ref) => ({
      proposal: proposalRecord({ proposal_id: proposalOf(ref), trade_id: tradeOf(ref), status: 'accepted' }),
      trade: tradeRecord({ trade_id: tradeOf(ref), external_reference: ref, status: 'resolved' }),
    }),
    otherAnswer: (ref) => ({
      proposal: proposalRecord({ proposal_id: 'pr_another', trade_id: tradeOf(ref), status: 'accepted' }),
      trade: tradeRecord({ trade_id: tradeOf(ref), external_reference: ref, status: 'resolved' }),
    }),
    unknown: (ref) =>
      `The response may or may not have been taken: \`trades get ${ref}\` shows the proposal's status and the trade’s ` +
      '(the order is polled soon).',
    otherWords: (ref) => `(proposal ${proposalOf(ref)} of trade ${tradeOf(ref)}) with the record of proposal pr_another: another proposal`,
    printed: (ref) => `${ref}: proposal ${proposalOf(ref)} is accepted; trade ${tradeOf(ref)} is resolved\n`,
    recordedStatus: 'resolved',
    recorded: 'recorded locally',
  },
]

// one order for each command and case, in one database for each kind
const cases = ['first', 'first-other', 'abandoned', 'third', 'other', 'connect-timeout', 'connecting'] as const
const refOf = (command: Command, kind: string, one: (typeof cases)[number]) => `${command.kind}-${one}-${kind}`

async function orderState(read: Reader, externalReference: string) {
  return read((db) =>
    db
      .selectFrom('orders')
      .select(['tradeStatus', 'nextPollAt'])
      .where('externalReference', '=', externalReference)
      .executeTakeFirstOrThrow(),
  )
}

/** What a third signal says once the answer to `command` on `ref` has come, before its record's COMMIT is sent. */
function stoppedBeforeRecorded(command: Command, ref: string): string {
  return (
    'the platform has answered: recording and printing its answer, then stopping\n' +
    'the platform has answered: recording its answer (another Ctrl-C ends the process now: before its COMMIT is sent, ' +
    'nothing of the answer is recorded; once it is sent, whether it was recorded is not known, and the line says where to look)\n' +
    `Stopped by a third signal before the record of the platform's answer to the ${command.kind} call on trade ` +
    `${tradeOf(ref)} for order ${ref} was committed: the platform answered, and nothing of its answer was recorded (its ` +
    `transaction is rolled back, its COMMIT not sent); \`orders show ${ref}\` shows what the order records, and ` +
    `\`trades get ${ref}\` the platform's record (the poller brings the order to it); do not send the call again: the ` +
    'platform did it [stopped]\n'
  )
}

/**
 * What three signals say once the platform has answered `ref`'s call with a record of something else (nothing of it is
 * applied, what the call did is not known), while the poll brought forward is in flight.
 */
function stoppedAfterAnotherRecord(ref: string): string {
  const came = 'the call to the platform is over, and its outcome is not known (the platform may or may not have done it)'
  const see = `\`orders show ${ref}\` gives its next poll, and \`trades get ${ref}\` the platform's record`
  return (
    `${came}: recording the poll of order ${ref} brought forward and saying so, then stopping; ${see}\n` +
    `${came}: recording the poll of order ${ref} brought forward (another Ctrl-C ends the process now, and says what it leaves)\n` +
    `Stopped by a third signal while the poll of order ${ref} brought forward was in flight, after the call to the ` +
    'platform, whose outcome is not known: the write may or may not have been made (on Postgres a statement sent runs on ' +
    `without this process); ${see} [stopped]\n`
  )
}

/** Until `check`, failing if `run` ends first. */
async function until(check: () => boolean, what: string, run: ReturnType<typeof startedCli>): Promise<void> {
  await eventually(() => {
    if (run.closed()) throw new Error(`the command ended before ${what}:\n${run.stderr()}`)
    return check()
  }, what, 120_000)
}

for (const kind of ['pglite', 'postgres'] as const) {
  const name = kind === 'postgres' ? 'on Postgres through DATABASE_URL (Postgres)' : 'on embedded PGlite'
  describe.skipIf(casesLeftOut(kind))(`disputes and proposals stopped by signals, ${name}`, () => {
    let env: Record<string, string>
    let read: Reader
    const polledAt = new Date(Date.now() + DAY)
    beforeAll(async () => {
      const seed = (db: Kysely<Database>) =>
        insertOrders(
          db,
          commands.flatMap((command) =>
            cases.map((one) => ({ externalReference: refOf(command, kind, one), tradeStatus: command.status, nextPollAt: polledAt })),
          ),
        )
      ;({ env, read } = await seededCliDatabase(kind, { prefix: 'disputes-interrupt-', env: { PARTNER_API_BASE_URL: platform.url }, seed, cleanups }))
    })

    for (const command of commands) {
      it(`${command.name}: the first Ctrl-C waits for the answer, which is printed and recorded, and exits 130`, async () => {
        const ref = refOf(command, kind, 'first')
        const run = startedCli(command.args(ref), env, children)
        const request = await platform.requestOf(run, tradeOf(ref))
        expect(request.method).toBe('POST')
        run.child.kill('SIGINT')
        await says(run, FIRST_IN_FLIGHT)
        request.respond(200, command.answer(ref))
        const ended = await run.ended()

        expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
        expect(ended.stdout).toBe(command.printed(ref))
        expect(ended.stderr).toBe(FIRST_IN_FLIGHT + answeredAfterSignal(command.recorded))
        const after = await orderState(read, ref)
        expect(after.tradeStatus).toBe(command.recordedStatus)
        // recorded: an open order's poll brought forward (EXPECTED_WEBHOOK_S after the call, not a day later)
        if (command.recordedStatus !== 'resolved') expect(after.nextPollAt!.getTime()).toBeLessThan(polledAt.getTime())
      })

      // found from outside: the first Ctrl-C, then an answer not of what the call was sent for, exited 1 with
      // `[answer_mismatch]` and said nothing of the signal; what the call did is not known, as after a timeout (130)
      it(`${command.name}: the first Ctrl-C, then an answer of something else: [answer_mismatch], the signal said, exit 130, the poll brought forward`, async () => {
        const ref = refOf(command, kind, 'first-other')
        const run = startedCli(command.args(ref), env, children)
        const request = await platform.requestOf(run, tradeOf(ref))
        run.child.kill('SIGINT')
        await says(run, FIRST_IN_FLIGHT)
        request.respond(200, command.otherAnswer(ref))
        const ended = await run.ended()

        expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
        expect(ended.stdout).toBe('')
        expect(ended.stderr).toBe(
          FIRST_IN_FLIGHT +
            `The platform answered for order ${ref} ${command.otherWords(ref)}. Nothing of it was applied, and what the ` +
            'call did is not known: check with `trades get`; the order is polled soon. [answer_mismatch]\n' +
            'stopped by a signal during the call, whose answer was not the record it was sent for: its outcome is not known (above)\n',
        )
        const after = await orderState(read, ref)
        expect(after.tradeStatus).toBe(command.status)
        expect(after.nextPollAt!.getTime()).toBeLessThan(polledAt.getTime())
      })

      it(`${command.name}: a second signal stops waiting, says the outcome is not known, exits 130, and brings the poll forward`, async () => {
        const before = Date.now()
        const ref = refOf(command, kind, 'abandoned')
        const run = startedCli(command.args(ref), env, children)
        expectStoppedWaiting(await stopWaitingAtASecondSignal(run, await platform.requestOf(run, tradeOf(ref))), command.unknown(ref))
        const state = await orderState(read, ref)
        expect(state.tradeStatus).toBe(command.status)
        expectPolledAfterTheCall(state.nextPollAt, { before, after: Date.now() }, ref)
      })

      it(`${command.name}: a third signal while its answer's record is held says nothing of it was recorded, exit 130, and nothing is`, async () => {
        const ref = refOf(command, kind, 'third')
        const answer = command.answer(ref)
        const ended = kind === 'postgres' ? await thirdSignalOnPostgres(command, ref, answer) : await thirdSignalOnPglite(command, ref, answer)
        expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
        expect(ended.stdout).toBe('')
        expect(ended.stderr).toBe(stoppedBeforeRecorded(command, ref))
        expect(await orderState(read, ref)).toEqual({ tradeStatus: command.status, nextPollAt: polledAt })
      })

      // the answer is not of what the call was sent for: nothing of it is applied or printed, and what the call did is not
      // known; only the poll is brought forward. The signals said "the platform has answered: recording and printing its
      // answer", and the third "after the call to the platform", as of an answer to be recorded
      it(`${command.name} answered with a record of something else: the signals say its outcome is not known and the poll is brought forward, exit 130`, async () => {
        const ref = refOf(command, kind, 'other')
        const answer = command.otherAnswer(ref)
        const ended = kind === 'postgres' ? await thirdSignalOnPostgres(command, ref, answer) : await thirdSignalOnPglite(command, ref, answer)
        expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
        expect(ended.stdout).toBe('')
        expect(ended.stderr).toBe(stoppedAfterAnotherRecord(ref))
        expect((await orderState(read, ref)).tradeStatus).toBe(command.status)
      })

      // `command` on `ref` at a platform whose SYN goes unanswered, PARTNER_API_TIMEOUT_MS `timeoutMs`: a first signal
      // once its connection is under way, and where `second`, a second once it has said so. It ends 130, having
      // printed nothing, `said` after the first signal's line, and the order is as it was
      const stoppedWhileConnecting = async (ref: string, { timeoutMs, second, said }: { timeoutMs: string; second: boolean; said: string }) => {
        const unreachableEnv = { ...env, PARTNER_API_BASE_URL: `http://127.0.0.1:${unreachable.port}`, PARTNER_API_TIMEOUT_MS: timeoutMs }
        const run = startedCli(command.args(ref), unreachableEnv, children)
        await until(() => connectingTo(run.child.pid!, unreachable.port), 'its connection to the platform is under way', run)
        run.child.kill('SIGINT')
        if (second) {
          await says(run, FIRST_IN_FLIGHT)
          run.child.kill('SIGTERM')
        }
        const ended = await run.ended()

        expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
        expect(ended.stdout).toBe('')
        expect(ended.stderr).toBe(FIRST_IN_FLIGHT + said)
        expect(await orderState(read, ref)).toEqual({ tradeStatus: command.status, nextPollAt: polledAt })
      }

      it(`${command.name}: the first Ctrl-C, then no connection in time: [not_sent], the signal said, exit 130, the order as it was`, async () => {
        await stoppedWhileConnecting(refOf(command, kind, 'connect-timeout'), {
          timeoutMs: '8000',
          second: false,
          said:
            `Could not reach the platform at http://127.0.0.1:${unreachable.port} (no connection within 8,000 ms, so the ` +
            'request was not written): nothing was sent and the order is unchanged. In local mode the sandbox runs ' +
            'inside `npm start`: start it, then run this again; otherwise check PARTNER_API_BASE_URL. [not_sent]\n' +
            'stopped by a signal while the call waited for its connection: nothing was sent (above)\n',
        })
      })

      it(`${command.name}: a second signal while its connection is being set up is a stop before sending, exit 130, the order as it was`, async () => {
        const ref = refOf(command, kind, 'connecting')
        await stoppedWhileConnecting(ref, {
          // far past the test: the connect never ends by the call's timeout while the signals come
          timeoutMs: '120000',
          second: true,
          said:
            `Stopped by a signal before the ${command.kind} call on trade ${tradeOf(ref)} for order ${ref} was sent (its ` +
            'connection to the platform was not up yet): nothing sent to the platform, the order as it was [stopped]\n',
        })
      })
    }

    /** The command on `ref` answered `answer`, its write after the call held by a SHARE lock of the orders table while three signals come. */
    async function thirdSignalOnPostgres(command: Command, ref: string, answer: unknown) {
      const lock = await ordersShareLock(env.DATABASE_URL!, read)
      cleanups.unshift(() => lock.end())
      // no statement of the command's ends at its statement timeout while the test holds it: only the signals stop it
      const run = startedCli(command.args(ref), { ...env, DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }, children)
      try {
        const request = await platform.requestOf(run, tradeOf(ref))
        await lock.take()
        request.respond(200, answer)
        await lock.waitedOn('the recording waits on the lock', () => (run.closed() ? run.stderr() : undefined))
        await stopThreeTimes(run)
      } finally {
        if (!run.closed()) run.child.kill('SIGKILL')
        await lock.release()
      }
      // the command's session, its process gone, ends with its transaction rolled back
      await lock.othersEnded()
      return run.ended()
    }

    /** The command on `ref` answered `answer`, its write after the call held by a BEFORE UPDATE trigger while three signals come. */
    async function thirdSignalOnPglite(command: Command, ref: string, answer: unknown) {
      // named after the reference: each hold's files stay in the data directory after it is dropped
      const name = `test_hold_${ref.replace(/\W+/g, '_')}`
      const held = await read((db) => holdStatementOnPglite(db, env.DATA_DIR!, { name, table: 'orders', when: `new.external_reference = '${ref}'`, at: 'before update' }))
      const run = startedCli(command.args(ref), env, children)
      try {
        const request = await platform.requestOf(run, tradeOf(ref))
        expect(held.held()).toBe(false)
        request.respond(200, answer)
        await until(() => held.held(), 'the write after the call runs the trigger', run)
        await stopThreeTimes(run)
      } finally {
        if (!run.closed()) run.child.kill('SIGKILL')
        held.release()
      }
      const ended = await run.ended()
      await read(held.drop)
      return ended
    }
  })
}
