// `prune --dry-run` as its own process (the compiled CLI) on a machine whose clock runs 400 days ahead of the
// database's (libfaketime, Postgres keeping the real clock): it counts ages by the database's clock, and says so on
// its error output, where the pass's warning went to a log a command shows from errors up only (an outside review
// found it silent, though README said it printed the warning).
import { existsSync } from 'node:fs'
import { afterAll, expect, it } from 'vitest'
import { receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const DAY = 86_400_000
const FAKETIME_LIBRARY = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1'

const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup()
})

it.skipIf(!postgresUrl || !existsSync(FAKETIME_LIBRARY))(
  "counts ages by the database's clock on a machine 400 days ahead, and says how far ahead (Postgres, libfaketime)",
  async () => {
    const database: TestDatabase = await createTestDatabase({ kind: 'postgres' })
    cleanups.push(() => database.close())
    // received 1 and 91 days ago by the database's clock: only the second is past DELIVERY_RETENTION_DAYS (90)
    const now = Date.now()
    await database.db
      .insertInto('webhookDeliveries')
      .values(
        [1, 91].map((ageDays) => ({
          deliveryId: `d-${ageDays}`,
          bodySha256: `sha-${ageDays}`,
          receivedAt: new Date(now - ageDays * DAY),
          eventType: 'trade.funded',
          externalReference: `ref-${ageDays}`,
          outcome: 'applied',
          rawBody: '{}',
        })),
      )
      .execute()
    const env = {
      ...receiverEnv(migratedDataDir('prune-clock-ahead-')),
      DATABASE_URL: database.url!,
      LD_PRELOAD: FAKETIME_LIBRARY,
      FAKETIME: '+400d',
      // timers keep the real clock: only the time of day is 400 days ahead
      FAKETIME_DONT_FAKE_MONOTONIC: '1',
    }

    const text = await runCli(['prune', '--dry-run'], env)
    expect(text.code, text.stderr).toBe(0)
    expect(text.stdout).toContain('would prune: 1 delivery rows')
    const said = /this machine's clock is (\d+) s ahead of the database's: ages were counted by the database's clock/.exec(text.stderr)
    expect(said, text.stderr).not.toBeNull()
    expect(Math.abs(Number(said![1]) - 400 * 86_400)).toBeLessThan(120)

    const json = await runCli(['prune', '--dry-run', '--json'], env)
    expect(json.code, json.stderr).toBe(0)
    const result = JSON.parse(json.stdout) as { counts: { delivery: number }; clockAheadS: number; deliveriesBefore: string }
    expect(result.counts.delivery).toBe(1)
    expect(Math.abs(result.clockAheadS - 400 * 86_400)).toBeLessThan(120)
    // the cutoff is 90 days before the database's now, not before this machine's
    expect(Math.abs(new Date(result.deliveriesBefore).getTime() - (now - 90 * DAY))).toBeLessThan(120_000)
  },
  120_000,
)
