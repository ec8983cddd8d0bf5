// `trades open` stopped by signals once its create is answered with a record that is not the order's trade: another
// order's (its external_reference another's: the create is marked unknown), or a trade other than the one linked to the
// order meanwhile (the order is flagged trade_mismatch). The recording of the answer is held, so the signals come while
// the command is in the settled phase. The compiled CLI as its own process, on Postgres through DATABASE_URL and on
// embedded PGlite. The first signal said "the platform has answered: recording and printing its answer" of both, the
// mismatch found only by the recording: now an answer of another order is said as a call whose outcome is not known,
// with the mark it records, and an answer of the order's own, once the recording has found the trade linked meanwhile,
// with that and the flag it records; a third signal no longer sends the operator to `trades link`, which an order
// linked to another trade refuses. What the recording writes is as it was: the unknown mark, the flag.
//
// The order is linked "meanwhile" by a trigger on its sent stamp (the write as the create leaves), standing for the
// first create's webhook. The recording is held on Postgres by a SHARE lock of the orders table the test takes in a
// transaction with no transaction id once the create is at the platform (the recording's row lock goes through, its
// write waits); on PGlite by a BEFORE UPDATE trigger that writes a file into the data directory and sleeps until the
// test writes another (helpers/pglite-statement-hold.ts).
import { type Kysely, sql } from 'kysely'
import { describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { describeEmbedded, endedAfterAll, startedCli } from './helpers/cli-process.js'
import { useHoldingPlatform } from './helpers/holding-platform.js'
import { ordersShareLock } from './helpers/orders-share-lock.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { holdStatementOnPglite } from './helpers/pglite-statement-hold.js'
import { eventually } from './helpers/reconcile-poller.js'
import { says } from './helpers/signals-in-flight.js'
import { stopThreeTimes } from './helpers/stop-three-times.js'
import { postgresUrl } from './helpers/test-database.js'

const platform = useHoldingPlatform()
const { children, cleanups } = endedAfterAll()

const openArgs = (ref: string) => ['trades', 'open', ref, '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1']

interface Case {
  name: string
  /** The references' start: each test's order is `${prefix} ${mode}`. */
  prefix: string
  answer: (ref: string) => unknown
  /** Whether a trade is linked to the order while its create is at the platform. */
  linkedMeanwhile: boolean
  /** On PGlite, the condition on the new row of the recording's write held. */
  heldWrite: string
  first: (ref: string) => string
  second: (ref: string) => string
  third: (ref: string) => string
  /** What the command says once the first signal's stop lets the recording go. */
  failure: (ref: string) => string
  /** What the order records of the answer, as today. */
  recorded: Record<string, unknown>
}

const WHEN_NOT_KNOWN = 'its outcome is not known (the platform may or may not have done it)'
const otherMark = (ref: string) => `the mark of order ${ref}'s create as unknown (its answer is the record of another order)`
const linkedFound = (ref: string) => `the platform has answered, and order ${ref} was linked to trade tr_linked meanwhile`
const BEFORE_COMMIT =
  'was committed: the platform answered, and nothing of its answer was recorded (its transaction is rolled back, its COMMIT not sent)'
const STOPPED_ON_MISMATCH = 'stopped by a signal during the call, whose answer was not the record it was sent for: its outcome is not known (above)\n'

const cases: Case[] = [
  {
    name: 'answered with the record of another order',
    prefix: 'open other',
    answer: () => tradeRecord({ trade_id: 'tr_other', external_reference: 'someone else' }),
    linkedMeanwhile: false,
    heldWrite: "new.trade_create_state = 'unknown'",
    first: (ref) =>
      `the call to the platform is over, and ${WHEN_NOT_KNOWN}: recording ${otherMark(ref)} and saying so, then stopping; ` +
      `\`orders show '${ref}'\` shows it; do not send the create again before checking the platform\n`,
    second: (ref) =>
      `the call to the platform is over, and ${WHEN_NOT_KNOWN}: recording ${otherMark(ref)} (another Ctrl-C ends the ` +
      'process now, and says what it leaves)\n',
    third: (ref) =>
      `Stopped by a third signal before the record of the answer to order ${ref}'s create (trade tr_other, another ` +
      `order's) ${BEFORE_COMMIT}; \`orders show '${ref}'\` shows what the order records of its create; do not send the ` +
      'create again before checking the platform [stopped]\n',
    failure: (ref) =>
      `The platform answered for order ${ref} (a trade create) with the record of trade tr_other for external reference ` +
      'someone else: another trade or order. Nothing was linked, and whether the create made a trade is not known: it ' +
      'is marked unknown; check the platform, then send it again only on purpose with --retry. [answer_mismatch]\n',
    recorded: { tradeId: null, tradeCreateState: 'unknown', attention: null },
  },
  {
    name: 'answered with a trade other than the one linked meanwhile',
    prefix: 'open linked',
    answer: (ref) => tradeRecord({ trade_id: 'tr_second', external_reference: ref }),
    linkedMeanwhile: true,
    heldWrite: "new.attention = 'trade_mismatch'",
    first: (ref) => `${linkedFound(ref)}: recording the order's trade_mismatch flag and saying so, then stopping\n`,
    second: (ref) =>
      `${linkedFound(ref)}: recording the order's trade_mismatch flag (another Ctrl-C ends the process now: before its ` +
      'COMMIT is sent, nothing of the answer is recorded; once it is sent, whether it was recorded is not known, and the ' +
      'line says where to look)\n',
    // not `trades link`, which the order, linked to tr_linked, refuses
    third: (ref) =>
      `Stopped by a third signal before the record of trade tr_second, created by the platform for order ${ref} ` +
      `${BEFORE_COMMIT}; \`orders show '${ref}'\` shows trade tr_linked (and the trade_mismatch flag, if recorded): the ` +
      'platform may hold a second trade for the order; check its trades there, cancel the one not linked, then ' +
      `\`reconcile --requeue '${ref}'\` if the order is flagged [stopped]\n`,
    failure: (ref) =>
      `The platform answered for order ${ref} (a trade create) with the record of trade tr_second for external reference ` +
      `${ref}: another trade or order. Nothing of it was applied: the order was linked to trade tr_linked meanwhile (by ` +
      'its webhook or another command), so the platform may now hold a second trade for it. The order is flagged ' +
      'trade_mismatch and polled no more: check its trades on the platform, cancel the one not linked, then ' +
      `\`reconcile --requeue ${ref}\`. [answer_mismatch]\n`,
    recorded: { tradeId: 'tr_linked', attention: 'trade_mismatch', nextPollAt: null },
  },
]

/**
 * A trigger that links the order `ref` to trade tr_linked as its create's sent stamp is written (its whole time turned
 * from "not sent", negative, to sent): the first create's webhook, come while this create is at the platform.
 */
async function linkMeanwhile(db: Kysely<Database>, ref: string, name: string): Promise<void> {
  await sql`create function ${sql.id(name)}() returns trigger language plpgsql as $$ begin
    new.trade_id := 'tr_linked'; new.trade_status := 'created'; new.trade_reference := 'TRD-LINKED';
    return new; end $$`.execute(db)
  await sql`create trigger ${sql.id(name)} before update on orders for each row
    when (new.external_reference = ${sql.lit(ref)} and old.trade_create_wait_ms < 0 and new.trade_create_wait_ms > 0)
    execute function ${sql.id(name)}()`.execute(db)
}

function seeded(kind: 'pglite' | 'postgres'): Promise<{ env: Record<string, string>; read: Reader }> {
  return seededCliDatabase(kind, { prefix: 'trades-open-mismatch-', env: { PARTNER_API_BASE_URL: platform.url }, seed: async () => {}, cleanups })
}

type Mode = 'one signal' | 'three signals'
const MODES: Mode[] = ['one signal', 'three signals']

/** The signals of `mode`, once the recording is held, until the command ends; `release` lets it go (after the first signal, for one). */
async function signal(command: ReturnType<typeof startedCli>, mode: Mode, release: () => Promise<void> | void) {
  if (mode === 'three signals') {
    await stopThreeTimes(command)
    return
  }
  command.child.kill('SIGINT')
  // its line whole, whatever it says (expectEnded compares it)
  await says(command, '\n')
  await release()
  await command.ended()
}

async function expectEnded(command: ReturnType<typeof startedCli>, mode: Mode, c: Case, ref: string, read: Reader) {
  const ended = await command.ended()
  expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
  expect(ended.stdout).toBe('')
  if (mode === 'three signals') {
    expect(ended.stderr).toBe(c.first(ref) + c.second(ref) + c.third(ref))
    return
  }
  expect(ended.stderr).toBe(c.first(ref) + c.failure(ref) + STOPPED_ON_MISMATCH)
  // what the recording writes, as without the signal
  expect(await read((db) => findOrderByExternalReference(db, ref))).toMatchObject(c.recorded)
}

describe.skipIf(!postgresUrl)('trades open answered with a record not of the order, stopped by signals while the answer is recorded (Postgres)', () => {
  for (const c of cases) {
    for (const mode of MODES) {
      it(`${c.name}, ${mode}: the lines say what the recording writes, never only "recording and printing its answer"; exit 130`, async () => {
        const ref = `${c.prefix} ${mode === 'one signal' ? 'one' : 'three'}`
        const { env, read } = await seeded('postgres')
        if (c.linkedMeanwhile) await read((db) => linkMeanwhile(db, ref, 'test_link_meanwhile'))
        const lock = await ordersShareLock(env.DATABASE_URL!, read)
        cleanups.unshift(() => lock.end())
        // no statement of the command's ends at its statement timeout while the test holds it: only the signals stop it
        const command = startedCli(openArgs(ref), { ...env, DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }, children)
        try {
          const request = await platform.requestOf(command, ref)
          await lock.take()
          request.respond(200, c.answer(ref))
          await lock.waitedOn('the recording waits on the lock', () => (command.closed() ? command.stderr() : undefined))
          await signal(command, mode, () => lock.release())
        } finally {
          if (!command.closed()) command.child.kill('SIGKILL')
          await lock.release()
        }
        await expectEnded(command, mode, c, ref, read)
      })
    }
  }
})

describeEmbedded('trades open answered with a record not of the order, stopped by signals while the answer is recorded (embedded PGlite)', () => {
  for (const c of cases) {
    for (const mode of MODES) {
      it(`${c.name}, ${mode}: the lines say what the recording writes, never only "recording and printing its answer"; exit 130`, async () => {
        const ref = `${c.prefix} ${mode === 'one signal' ? 'one' : 'three'}`
        const { env, read } = await seeded('pglite')
        if (c.linkedMeanwhile) await read((db) => linkMeanwhile(db, ref, 'test_link_meanwhile'))
        const held = await read((db) =>
          holdStatementOnPglite(db, env.DATA_DIR!, {
            name: 'test_hold_write',
            table: 'orders',
            when: `new.external_reference = '${ref}' and ${c.heldWrite}`,
            at: 'before update',
          }),
        )
        const command = startedCli(openArgs(ref), env, children)
        try {
          const request = await platform.requestOf(command, ref)
          expect(held.held()).toBe(false)
          request.respond(200, c.answer(ref))
          await eventually(() => {
            if (command.closed()) throw new Error(`the command ended before its recording was held: ${command.stderr()}`)
            return held.held()
          }, 'the recording runs the trigger', 120_000)
          await signal(command, mode, () => held.release())
        } finally {
          if (!command.closed()) command.child.kill('SIGKILL')
          held.release()
        }
        await expectEnded(command, mode, c, ref, read)
      })
    }
  }
})
