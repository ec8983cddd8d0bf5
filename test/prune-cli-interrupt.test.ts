// `prune` as its own process (the compiled CLI; on embedded PGlite, and on Postgres through DATABASE_URL when
// TEST_DATABASE_URL is given), stopped by Ctrl-C in the middle of a pass: it stops after the batch in flight,
// says what it pruned so far, and exits 130; what it said is what was done.
import { once } from 'node:events'
import { type Kysely, sql } from 'kysely'
import { afterAll, expect, it } from 'vitest'
import type { Database } from '../src/db/database.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { casesLeftOut } from './helpers/cli-database.js'
import { receiverEnv, spawnCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { PRUNE_LOCK_KEY } from '../src/retention/prune.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const DAY = 86_400_000
// 200 batches of 10 rows, 50 ms apart: the pass is far from done when the first batch is reported
const ROWS = 2_000
const BATCH = 10

const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup()
})

async function seedOldDeliveries(db: Kysely<Database>): Promise<void> {
  const receivedAt = new Date(Date.now() - 100 * DAY)
  for (let start = 0; start < ROWS; start += 500) {
    await db
      .insertInto('webhookDeliveries')
      .values(
        Array.from({ length: 500 }, (_, index) => ({
          deliveryId: `old-${start + index}`,
          bodySha256: `sha-${start + index}`,
          receivedAt,
          eventType: 'trade.funded',
          externalReference: `ref-${start + index}`,
          outcome: 'applied',
          rawBody: '{}',
        })),
      )
      .execute()
  }
}

/** A database with ROWS deliveries past DELIVERY_RETENTION_DAYS, and the environment of a CLI run on it alone. */
async function seeded(kind: 'pglite' | 'postgres'): Promise<{ env: Record<string, string>; reopen: () => DatabaseHandle }> {
  const dataDir = migratedDataDir('prune-interrupt-')
  if (kind === 'pglite') {
    const seed = openDatabase({ dataDir })
    await migrateToLatest(seed.db)
    await seedOldDeliveries(seed.db)
    await seed.close()
    return { env: receiverEnv(dataDir), reopen: () => openDatabase({ dataDir }) }
  }
  const database: TestDatabase = await createTestDatabase({ kind: 'postgres' })
  cleanups.push(() => database.close())
  await seedOldDeliveries(database.db)
  return {
    env: { ...receiverEnv(dataDir), DATABASE_URL: database.url! },
    reopen: () => openDatabase({ databaseUrl: database.url! }),
  }
}

/** Resolves once the child has written a JSON log line with this msg to stderr. */
function logLine(child: ReturnType<typeof spawnCli>, msg: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let buffer = ''
    child.stderr!.on('data', (chunk: Buffer) => {
      buffer += chunk
      if (buffer.split('\n').some((line) => line.startsWith('{') && line.includes(`"msg":"${msg}"`))) resolve()
    })
    child.once('exit', (code) => reject(new Error(`exited ${code} before "${msg}":\n${buffer}`)))
  })
}

/** `prune --json` in batches of BATCH, its output collected; resolves once its first batch is pruned. */
async function pruneUnderWay(env: Record<string, string>) {
  const child = spawnCli(['prune', '--json'], { ...env, PRUNE_BATCH_SIZE: String(BATCH), LOG_LEVEL: 'debug' })
  const output = { stdout: '', stderr: '' }
  child.stdout!.on('data', (chunk) => (output.stdout += chunk))
  child.stderr!.on('data', (chunk) => (output.stderr += chunk))
  await logLine(child, 'retention: batch pruned')
  return { child, output }
}

/**
 * The child's exit code, once it exits. A child still running after `ms` is killed, and the test fails with the end
 * of what it wrote: a prune that missed its lock's loss, or hung on the way out, says where it was.
 */
async function exitCode(child: ReturnType<typeof spawnCli>, output: { stderr: string }, ms = 60_000): Promise<number | null> {
  const timer = setTimeout(() => child.kill('SIGKILL'), ms)
  try {
    const [code, signal] = (await once(child, 'exit')) as [number | null, string | null]
    if (signal === 'SIGKILL') throw new Error(`prune still running ${ms} ms after the lock's loss; it wrote:\n${output.stderr.slice(-4_000)}`)
    return code
  } finally {
    clearTimeout(timer)
  }
}

/** The deliveries left in the database. */
async function deliveriesLeft(db: Kysely<Database>): Promise<number> {
  const { left } = await db
    .selectFrom('webhookDeliveries')
    .select((eb) => eb.fn.countAll<string>().as('left'))
    .executeTakeFirstOrThrow()
  return Number(left)
}

for (const kind of ['pglite', 'postgres'] as const) {
  const name = kind === 'postgres' ? 'on Postgres through DATABASE_URL (Postgres)' : 'on embedded PGlite'
  it.skipIf(casesLeftOut(kind))(
    `stops after the batch in flight on Ctrl-C, prints what it pruned so far and exits 130, ${name}`,
    async () => {
      const { env, reopen } = await seeded(kind)
      const { child, output } = await pruneUnderWay(env)
      child.kill('SIGINT')
      const [code, signal] = (await once(child, 'exit')) as [number | null, string | null]
      const { stdout, stderr } = output

      expect({ code, signal }, stderr.slice(-2_000)).toEqual({ code: 130, signal: null })
      expect(stderr).toContain('stopped by a signal after the batch in flight')
      const result = JSON.parse(stdout) as { interrupted: boolean; counts: { delivery: number } }
      expect(result.interrupted).toBe(true)
      expect(result.counts.delivery).toBeGreaterThanOrEqual(BATCH)
      expect(result.counts.delivery).toBeLessThan(ROWS)
      expect(result.counts.delivery % BATCH).toBe(0)
      const after = reopen()
      try {
        // what it said it pruned is what is gone
        expect(await deliveriesLeft(after.db)).toBe(ROWS - result.counts.delivery)
      } finally {
        await after.close()
      }
    },
    120_000,
  )
}

it.skipIf(!postgresUrl)(
  'exits 1 with [prune_running] and prunes nothing while another replica holds the retention lock (Postgres)',
  async () => {
    const database: TestDatabase = await createTestDatabase({ kind: 'postgres' })
    cleanups.push(() => database.close())
    await seedOldDeliveries(database.db)
    // another replica's pass, holding the lock
    const release = await database.holdLock(PRUNE_LOCK_KEY)
    expect(release).toBeDefined()
    try {
      const dataDir = migratedDataDir('prune-locked-')
      const child = spawnCli(['prune'], { ...receiverEnv(dataDir), DATABASE_URL: database.url! })
      let stdout = ''
      let stderr = ''
      child.stdout!.on('data', (chunk) => (stdout += chunk))
      child.stderr!.on('data', (chunk) => (stderr += chunk))
      const [code] = (await once(child, 'exit')) as [number | null]
      expect({ code, stdout, stderr }).toEqual({
        code: 1,
        stdout: '',
        stderr: 'Another replica is pruning now (it holds the retention lock): nothing done; try again later [prune_running]\n',
      })
      expect(await deliveriesLeft(database.db)).toBe(ROWS)
    } finally {
      await release!()
    }
  },
  120_000,
)

// found from outside: a DBA's script that terminated the lock's backend (or a network cut) gave the lock back, the
// pass went on, and a second replica's pass ran beside it; both exited 0
it.skipIf(!postgresUrl)(
  'stops after the batch in flight when the lock is lost with its connection, says so and exits 1 [lock_lost] (Postgres)',
  async ({ onTestFailed }) => {
    // where the time went, if it fails (it once ran past its 120 s in a full run, with nothing to tell where)
    const started = Date.now()
    const phases: string[] = []
    const reached = (phase: string) => phases.push(`${phase} at ${Date.now() - started} ms`)
    onTestFailed(() => console.warn(`prune lock lost: ${phases.join(', ') || 'nothing reached'}`))
    const { env, reopen } = await seeded('postgres')
    reached('seeded')
    const { child, output } = await pruneUnderWay(env)
    reached('first batch pruned')
    const database = reopen()
    try {
      // this schema's pass only: the lock's second key is the schema's (open-database.ts); another test file's
      // pass in the same database holds the same first key
      const { rows } = await sql<{ terminated: boolean }>`
        select pg_terminate_backend(pid) as terminated from pg_locks
        where locktype = 'advisory' and classid::bigint = ${PRUNE_LOCK_KEY} and objsubid = 2 and granted
          and objid::bigint = hashtext(current_schema())::bigint & 4294967295
          and database = (select oid from pg_database where datname = current_database())`.execute(database.db)
      expect(rows).toEqual([{ terminated: true }])
      reached('lock backend terminated')
      const code = await exitCode(child, output)
      reached('prune exited')
      const { stdout, stderr } = output
      expect(code, stderr.slice(-2_000)).toBe(1)
      expect(stderr).toContain('the retention lock was lost with its database connection: stopped after the batch in flight')
      expect(stderr).toContain('[lock_lost]\n')
      const result = JSON.parse(stdout) as { interrupted: boolean; lockLost?: boolean; counts: { delivery: number } }
      expect(result).toMatchObject({ interrupted: true, lockLost: true })
      expect(result.counts.delivery).toBeLessThan(ROWS)
      // it stopped: what it said it pruned is what is gone, and nothing more went after
      expect(await deliveriesLeft(database.db)).toBe(ROWS - result.counts.delivery)
    } finally {
      await database.close()
    }
  },
  120_000,
)
