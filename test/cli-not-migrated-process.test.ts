// A command run against Postgres migrated it first: a mistyped DATABASE_URL put this service's tables into another
// application's database (an `orders show` made ten tables there), and a newer build's CLI, run for a read, moved
// production ahead of the replicas still running the older build. On Postgres a command now only looks: a database
// not at this build's migrations is refused, [not_migrated], exit 1, nothing changed. `migrate` and the service's
// start migrate as before, and so does a command on the embedded database in DATA_DIR, the service's own.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { runCli } from './helpers/cli-process.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

describe.skipIf(!process.env.TEST_DATABASE_URL)('a command on a Postgres database not at this build’s migrations', () => {
  let database: TestDatabase
  const dataDir = mkdtempSync(path.join(tmpdir(), 'not-migrated-'))
  beforeAll(async () => {
    // an empty schema: another application's database, or one no service has started on
    database = await createTestDatabase({ kind: 'postgres', migrate: false })
  })
  afterAll(async () => {
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  })
  const tables = async () => {
    const { rows } = await sql<{ count: number }>`select count(*)::int as count from pg_tables where schemaname = current_schema()`.execute(database.db)
    return rows[0]!.count
  }
  const run = (args: string[]) => runCli(args, { DATA_DIR: dataDir, DATABASE_URL: database.url! })
  const next = 'run `migrate` (the service runs it as it starts) and then the command again; nothing was changed'

  it('refuses an empty database, [not_migrated], and makes no table in it', async () => {
    const refused = await run(['orders', 'show', 'order-1'])
    expect(refused).toEqual({
      code: 1,
      stdout: '',
      stderr: `The database has none of this service's tables (no migration ran on it): check DATABASE_URL, or ${next} [not_migrated]\n`,
    })
    expect(await tables()).toBe(0)
  })

  it('runs once `migrate` ran, and refuses again, naming the migration, a database a migration behind', async () => {
    expect((await run(['migrate'])).code).toBe(0)
    expect(await run(['orders', 'show', 'order-1'])).toEqual(expect.objectContaining({ code: 1, stderr: 'No order with external reference order-1 [order_not_found]\n' }))
    // as a newer build's CLI finds the database of replicas that still run this one
    const { rows } = await sql<{ name: string }>`delete from kysely_migration where name = (select max(name) from kysely_migration) returning name`.execute(database.db)
    const behind = await run(['orders', 'show', 'order-1'])
    expect(behind).toEqual({
      code: 1,
      stdout: '',
      stderr: `The database is behind this build: migration ${rows[0]!.name} not applied yet; once the service's replicas run this build, ${next} [not_migrated]\n`,
    })
    const { rows: after } = await sql<{ count: number }>`select count(*)::int as count from kysely_migration where name = ${rows[0]!.name}`.execute(database.db)
    expect(after[0]!.count).toBe(0)
  })

  it('refuses a database a newer build migrated with its own code, as `migrate` does', async () => {
    // (a migration behind as the test above left it: the newer one is what is said)
    await sql`insert into kysely_migration (name, timestamp) values ('9999_from_a_newer_build', ${new Date().toISOString()})`.execute(database.db)
    try {
      const said =
        'his database was migrated by a newer build of the service: 9999_from_a_newer_build is applied, and this build does not have it: ' +
        'run that build or a later one, or restore the database from before it'
      expect(await run(['orders', 'show', 'order-1'])).toEqual({ code: 1, stdout: '', stderr: `T${said} [migrated_by_newer_build]\n` })
      expect(await run(['migrate'])).toEqual(
        expect.objectContaining({ code: 1, stderr: `Migration (before any migration ran) failed: t${said} [migrated_by_newer_build]\n` }),
      )
    } finally {
      await sql`delete from kysely_migration where name = '9999_from_a_newer_build'`.execute(database.db)
    }
  })
})
