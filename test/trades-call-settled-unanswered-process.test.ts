// Trade calls (`trades fund`, `trades open`) stopped by signals once their call has ended without an answer to record:
// the platform (a server the test owns) answers 503 (the outcome is not known: a gateway's 5xx says nothing of what was
// done behind it) or 409 (refused), and the local write that follows (the poll brought forward, the mark of the create
// as unknown, the setting back of the create) is held, so the signals come while the command is in the settled phase.
// The compiled CLI as its own process, on Postgres through DATABASE_URL and on embedded PGlite. The first and second
// signals said "the platform has answered: recording and printing its answer", though no answer was there to record;
// now they say what the call came to and what the command records of it, and the third what it leaves, exit 130.
// So for an answer that is not the record the call was sent for (`trades fund` answered with another trade's record,
// `trades milestone deliver` with another milestone's): nothing of it is applied and only the poll is brought forward,
// which the lines now say; they said "recording and printing its answer", the mismatch found only by the recording.
//
// The write is held on Postgres by a SHARE lock of the orders table the test takes in a transaction with no
// transaction id, once the request is at the platform (the command's writes before the call go through first); on
// PGlite by a BEFORE UPDATE trigger that writes a file into the data directory and sleeps until the test writes another
// (helpers/pglite-statement-hold.ts).
import type { Kysely } from 'kysely'
import { beforeAll, describe, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { type Reader, seededCliDatabase } from './helpers/cli-database.js'
import { describeEmbedded, endedAfterAll, startedCli } from './helpers/cli-process.js'
import { holdStatementOnPglite } from './helpers/pglite-statement-hold.js'
import { useHoldingPlatform } from './helpers/holding-platform.js'
import { eventually } from './helpers/reconcile-poller.js'
import { milestoneRecord, tradeRecord } from './helpers/partner-api-fixtures.js'
import { insertOrders } from './helpers/reconcile-orders.js'
import { stopThreeTimes } from './helpers/stop-three-times.js'
import { ordersShareLock } from './helpers/orders-share-lock.js'
import { postgresUrl } from './helpers/test-database.js'

const platform = useHoldingPlatform()
const { children, cleanups } = endedAfterAll()

const UNAVAILABLE = { error: { code: 'unavailable', message: 'upstream unavailable' } }
const REFUSED = { error: { code: 'duplicate_reference', message: 'a trade with this reference exists' } }

const openArgs = (reference: string) => [
  'trades', 'open', reference, '--title', 'Used bicycle', '--amount', '120.00', '--currency', 'EUR', '--seller', 's_1',
]

/** The poll brought forward after a call whose outcome is not known, as the lines name it, and where they send the operator. */
const pollForward = {
  change: (ref: string) => `the poll of order ${ref} brought forward`,
  see: (ref: string) => `\`orders show '${ref}'\` gives its next poll, and \`trades get '${ref}'\` the platform's record`,
}

interface Case {
  name: string
  ref: string
  args: (ref: string) => string[]
  /** In the request's path or body. */
  marker: (ref: string) => string
  status: number
  answer: unknown
  /** The write held, as the lines name it. */
  change: (ref: string) => string
  see: (ref: string) => string
  /** What the call came to. */
  outcome: 'unknown' | 'refused'
  /** On PGlite, the trigger's condition on the new row: only the write after the call. */
  pgliteWhen?: string
}

const cases: Case[] = [
  {
    name: 'trades fund answered 503',
    ref: 'fund unknown',
    args: (ref) => ['trades', 'fund', ref],
    marker: (ref) => `tr_${ref.replace(' ', '-')}`,
    status: 503,
    answer: UNAVAILABLE,
    ...pollForward,
    outcome: 'unknown',
    pgliteWhen: "new.external_reference = 'fund unknown'",
  },
  {
    name: 'trades fund answered with the record of another trade',
    ref: 'fund mismatch',
    args: (ref) => ['trades', 'fund', ref],
    marker: () => 'tr_fund-mismatch',
    status: 200,
    answer: tradeRecord({ trade_id: 'tr_another', external_reference: 'fund mismatch', status: 'funded' }),
    ...pollForward,
    outcome: 'unknown',
    pgliteWhen: "new.external_reference = 'fund mismatch'",
  },
  {
    name: 'trades milestone deliver answered with the record of another milestone',
    ref: 'milestone mismatch',
    args: (ref) => ['trades', 'milestone', 'deliver', ref, 'ms_1'],
    marker: () => 'tr_milestone-mismatch',
    status: 200,
    answer: milestoneRecord({ milestone_id: 'ms_2', status: 'delivered' }),
    ...pollForward,
    outcome: 'unknown',
    pgliteWhen: "new.external_reference = 'milestone mismatch'",
  },
  {
    name: 'trades open answered 503',
    ref: 'open unknown',
    args: openArgs,
    marker: (ref) => ref,
    status: 503,
    answer: UNAVAILABLE,
    change: (ref) => `the mark of order ${ref}'s create as unknown (its outcome not known)`,
    see: (ref) => `\`orders show '${ref}'\` shows it; do not send the create again before checking the platform`,
    outcome: 'unknown',
    pgliteWhen: "new.external_reference = 'open unknown' and new.trade_create_state = 'unknown'",
  },
  {
    name: 'trades open refused 409',
    ref: 'open refused',
    args: openArgs,
    marker: (ref) => ref,
    status: 409,
    answer: REFUSED,
    change: (ref) => `the setting back of order ${ref}'s create (this create made no trade)`,
    see: (ref) => `\`orders show '${ref}'\` shows it`,
    outcome: 'refused',
  },
]

function expectedLines(c: Case): { first: string; second: string; third: string } {
  const came = c.outcome === 'unknown' ? 'its outcome is not known (the platform may or may not have done it)' : 'the platform refused it (nothing was done there)'
  const theCall = c.outcome === 'unknown' ? 'the call to the platform, whose outcome is not known' : 'the call to the platform, which it refused'
  return {
    first: `the call to the platform is over, and ${came}: recording ${c.change(c.ref)} and saying so, then stopping; ${c.see(c.ref)}\n`,
    second: `the call to the platform is over, and ${came}: recording ${c.change(c.ref)} (another Ctrl-C ends the process now, and says what it leaves)\n`,
    third:
      `Stopped by a third signal while ${c.change(c.ref)} was in flight, after ${theCall}: the write may or may not have ` +
      `been made (on Postgres a statement sent runs on without this process); ${c.see(c.ref)} [stopped]\n`,
  }
}

/** The fund orders, linked to a trade and not funded, and the milestone one, funded; `trades open` creates its own. */
function seeded(kind: 'pglite' | 'postgres'): Promise<{ env: Record<string, string>; read: Reader }> {
  const nextPollAt = new Date(Date.now() + 86_400_000)
  const seed = (db: Kysely<Database>) =>
    insertOrders(db, [
      { externalReference: 'fund unknown', tradeId: 'tr_fund-unknown', tradeStatus: 'created', nextPollAt },
      { externalReference: 'fund mismatch', tradeId: 'tr_fund-mismatch', tradeStatus: 'created', nextPollAt },
      { externalReference: 'milestone mismatch', tradeId: 'tr_milestone-mismatch', tradeStatus: 'funded', nextPollAt },
    ])
  return seededCliDatabase(kind, { prefix: 'trades-settled-', env: { PARTNER_API_BASE_URL: platform.url }, seed, cleanups })
}

function expectEnded(ended: { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }, c: Case) {
  const lines = expectedLines(c)
  expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
  expect(ended.stdout).toBe('')
  expect(ended.stderr).toBe(lines.first + lines.second + lines.third)
}

describe.skipIf(!postgresUrl)('trade calls stopped by signals once the call ended without an answer to record (Postgres)', () => {
  let env: Record<string, string>
  let read: Reader
  beforeAll(async () => {
    ;({ env, read } = await seeded('postgres'))
  })

  for (const c of cases) {
    it(`${c.name}: says what the call came to and what is recorded, never "answered"; the third what it leaves, exit 130`, async () => {
      const lock = await ordersShareLock(env.DATABASE_URL!, read)
      cleanups.unshift(() => lock.end())
      const command = startedCli(c.args(c.ref), { ...env, DATABASE_STATEMENT_TIMEOUT_MS: '3600000' }, children)
      try {
        const request = await platform.requestOf(command, c.marker(c.ref))
        await lock.take()
        request.respond(c.status, c.answer)
        await lock.waitedOn('the write after the call waits on the lock', () => (command.closed() ? command.stderr() : undefined))
        await stopThreeTimes(command)
      } finally {
        if (!command.closed()) command.child.kill('SIGKILL')
        await lock.release()
      }
      expectEnded(await command.ended(), c)
    })
  }
})

describeEmbedded('trade calls stopped by signals once the call ended without an answer to record (embedded PGlite)', () => {
  for (const c of cases.filter((one) => one.pgliteWhen)) {
    it(`${c.name}: says what the call came to and what is recorded, never "answered"; the third what it leaves, exit 130`, async () => {
      const { env, read } = await seeded('pglite')
      const held = await read((db) => holdStatementOnPglite(db, env.DATA_DIR!, { name: 'test_hold_write', table: 'orders', when: c.pgliteWhen!, at: 'before update' }))
      const command = startedCli(c.args(c.ref), env, children)
      try {
        const request = await platform.requestOf(command, c.marker(c.ref))
        expect(held.held()).toBe(false)
        request.respond(c.status, c.answer)
        await eventually(() => {
          if (command.closed()) throw new Error(`the command ended before its write was held: ${command.stderr()}`)
          return held.held()
        }, 'the write after the call runs the trigger', 120_000)
        await stopThreeTimes(command)
      } finally {
        if (!command.closed()) command.child.kill('SIGKILL')
        held.release()
      }
      expectEnded(await command.ended(), c)
    })
  }
})
