// The VACUUM that ends a pruning pass on the embedded database (PGlite has no autovacuum) is one statement, and no
// checkpoint comes until it ends: the write-ahead log it writes, up to a full-page image of every page it changes,
// all stays in pg_wal meanwhile. On a disk without room for that, it would fill the disk and stop the database. So on
// disk it is started only where the database's size fits in DATA_DIR's free space above DATA_DIR_MIN_FREE, and
// deferred otherwise with a warning [vacuum_deferred] naming both; the next pass tries again. In memory it always runs.
import { rmSync } from 'node:fs'
import { sql } from 'kysely'
import { afterAll, describe, expect, it } from 'vitest'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { DEFAULT_BATCH_SIZE, runPrunePass } from '../src/retention/prune.js'
import { systemClock } from '../src/clock.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { logEntries, testLogger } from './helpers/log-sink.js'

const MB = 1024 * 1024
const DAY = 86_400_000

describe('the VACUUM of the embedded database on disk', () => {
  const handles: DatabaseHandle[] = []
  const directories: string[] = []
  afterAll(async () => {
    for (const handle of handles) await handle.close()
    for (const directory of directories) rmSync(directory, { recursive: true, force: true })
  })

  /** The database in a copy of the migrated one, with `freeBytes` as its disk's free space and 16 MB kept free. */
  const open = (freeBytes: () => number) => {
    const dataDir = migratedDataDir('vacuum-room-')
    const handle = openDatabase({ dataDir, logger: testLogger(), minFreeBytes: 16 * MB, readFreeBytes: async () => freeBytes() })
    handles.push(handle)
    return { handle, dataDir }
  }
  const vacuums = async (handle: DatabaseHandle) =>
    Number(
      (await sql<{ count: string }>`select vacuum_count::text as count from pg_stat_user_tables where relname = 'webhook_deliveries'`.execute(handle.db))
        .rows[0]!.count,
    )
  const databaseMb = async (handle: DatabaseHandle) =>
    Number((await sql<{ bytes: string }>`select pg_database_size(current_database())::text as bytes`.execute(handle.db)).rows[0]!.bytes) / MB
  const deferrals = (dataDir: string) => logEntries().filter((entry) => entry.dataDir === dataDir && String(entry.msg).includes('[vacuum_deferred]'))

  it('is deferred, with a warning naming the room it needs and has, where the database does not fit above DATA_DIR_MIN_FREE', async () => {
    let free = 0
    const { handle, dataDir } = open(() => free)
    const size = await databaseMb(handle)
    // room for the database's size, but not above the 16 MB kept free
    free = (size + 8) * MB
    const before = await vacuums(handle)
    await handle.vacuum!()
    expect(await vacuums(handle)).toBe(before)
    expect(deferrals(dataDir)).toEqual([
      expect.objectContaining({ level: 40, neededMb: Math.ceil(size), freeMb: Math.floor(size + 8), minFreeMb: 16 }),
    ])
    expect(String(deferrals(dataDir)[0]!.msg)).toContain(`up to ${Math.ceil(size)} MB of write-ahead log`)

    // room again: the next one runs
    free = (size + 17) * MB
    await handle.vacuum!()
    expect(await vacuums(handle)).toBe(before + 1)
    expect(deferrals(dataDir)).toHaveLength(1)
  })

  it('a pruning pass prunes and defers its VACUUM alike, and the next pass with room runs it', async () => {
    let free = 0
    const { handle, dataDir } = open(() => free)
    const old = new Date(Date.now() - 100 * DAY)
    await sql`insert into webhook_deliveries (delivery_id, received_at, event_type, outcome, raw_body, body_sha256)
      select 'old-' || g, ${old}, 'trade.funded', 'applied', repeat('x', 500), md5(g::text) from generate_series(1, 300) g`.execute(handle.db)
    const deps = { db: handle.db, holdLock: handle.holdLock, vacuum: handle.vacuum, clock: systemClock }
    const settings = { bodyDays: 30, deliveryDays: 90, batchSize: DEFAULT_BATCH_SIZE, pauseMs: 0 }
    const before = await vacuums(handle)
    expect(await runPrunePass(deps, settings)).toMatchObject({ ran: true, counts: { delivery: 300 } })
    expect(await vacuums(handle)).toBe(before)
    expect(deferrals(dataDir)).toHaveLength(1)

    free = 10_000 * MB
    await runPrunePass(deps, settings)
    expect(await vacuums(handle)).toBe(before + 1)
  })
})

describe('the VACUUM of the embedded database in memory', () => {
  it('runs whatever the disk holds: nothing of it is on the disk', async () => {
    const handle = openDatabase({ dataDir: 'memory://', minFreeBytes: 16 * MB, readFreeBytes: async () => 0 })
    try {
      await sql`create table scratch (id int)`.execute(handle.db)
      await handle.vacuum!()
      const { rows } = await sql<{ count: string }>`select vacuum_count::text as count from pg_stat_user_tables where relname = 'scratch'`.execute(handle.db)
      expect(rows[0]!.count).toBe('1')
    } finally {
      await handle.close()
    }
  })
})
