// The clock guard in the compiled `serve` (src/db/clock-guard.ts): a replica whose clock runs 600 s ahead of the
// database's (libfaketime; Postgres keeps the machine's clock) claims no order, records no run and writes no lease,
// says why in one error line and counts each refusal, while it still stores webhooks. An outside review ran such a
// replica: killed, it had left every order claimed by its clock, and a healthy replica saw nothing due meanwhile.
import type { ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as delay } from 'node:timers/promises'
import { sql } from 'kysely'
import { afterAll, expect, it } from 'vitest'
import { jsonLogLines, pollingServeEnv, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { moveNewOrder } from './helpers/orders.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const FAKETIME_LIBRARY = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1'

let child: ChildProcess | undefined
let database: TestDatabase | undefined
const dataDir = mkdtempSync(path.join(tmpdir(), 'clock-guard-'))
afterAll(async () => {
  if (child) await stopChild(child, 'SIGKILL')
  await database?.close()
  rmSync(dataDir, { recursive: true, force: true })
})

/** The value of clock_offset_refused_total{loop} on the admin listener's /metrics, 0 before the first refusal. */
async function refusals(adminUrl: string, loop: string): Promise<number> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text()
  const line = text.split('\n').find((each) => each.startsWith(`clock_offset_refused_total{loop="${loop}"}`))
  return line === undefined ? 0 : Number(line.split(' ').at(-1))
}

it.skipIf(!postgresUrl || !existsSync(FAKETIME_LIBRARY))(
  "claims nothing while its clock runs 600 s ahead of the database's, says so once, and still stores webhooks (Postgres, libfaketime)",
  async () => {
    database = await createTestDatabase({ kind: 'postgres' })
    const db = database.db
    // an order linked to a trade, due now by the database's clock
    await moveNewOrder(db, { externalReference: 'clock-1', statuses: ['funded'], handlersFor: () => [], now: () => new Date() })
    await sql`update orders set next_poll_at = now() - interval '1 minute'`.execute(db)

    child = spawnCli(
      ['serve'],
      {
        ...pollingServeEnv({ databaseUrl: database.url!, dataDir, platformUrl: 'http://127.0.0.1:1' }),
        LD_PRELOAD: FAKETIME_LIBRARY,
        FAKETIME: '+600s',
        // timers keep the machine's monotonic clock: only the time of day runs ahead
        FAKETIME_DONT_FAKE_MONOTONIC: '1',
      },
    )
    const lines = jsonLogLines(child)
    const { url, adminUrl } = (await waitForLogLine(child, 'service listening')) as { url: string; adminUrl: string }
    // the poller runs a cycle a second (POLL_INTERVAL_S=1): three refused in a row
    for (let waited = 0; (await refusals(adminUrl, 'poller')) < 3; waited += 200) {
      expect(waited, 'three refused cycles').toBeLessThan(60_000)
      await delay(200)
    }

    const off = lines.filter((line) => typeof line.msg === 'string' && line.msg.includes('past the 30 s bound'))
    expect(off).toHaveLength(1)
    expect(off[0]).toMatchObject({ level: 50 })
    expect(Math.abs((off[0]!.offsetS as number) + 600)).toBeLessThanOrEqual(2)
    expect(off[0]!.msg).toContain("this machine's clock is 600 s ahead of the database's")
    // no claim, no run: the order is due for a replica whose clock is right
    const order = await db.selectFrom('orders').select(['pollLeaseExpiresAt', 'nextPollAt']).executeTakeFirstOrThrow()
    expect(order.pollLeaseExpiresAt).toBeNull()
    expect(order.nextPollAt!.getTime()).toBeLessThan(Date.now())
    const runs = await db.selectFrom('reconcileRuns').select((eb) => eb.fn.countAll<string>().as('n')).executeTakeFirstOrThrow()
    expect(Number(runs.n)).toBe(0)

    // webhooks are still stored and applied
    const body = JSON.stringify(tradePayload('clock-1', 'delivered'))
    const answer = await fetch(`${url}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `dlv_${randomUUID()}`, 'x-partner-signature': signBody(body) },
      body,
    })
    expect(answer.status).toBe(200)
  },
  120_000,
)
