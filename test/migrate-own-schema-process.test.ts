// The service in a schema of its own, named on the search_path of DATABASE_URL (`options=-c search_path=…`): a name
// that needs quoting is used as it is. A schema a DBA made for the role (CREATE SCHEMA app AUTHORIZATION app) on a
// database migrated in another schema of its search_path comes first on it ("$user"): the next `serve` or `migrate`
// applied every migration there and ran on empty tables, the orders out of view (an outside review). The compiled
// CLI, as run.
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, expect, it } from 'vitest'
import { migrations } from '../migrations/index.js'
import { postgresServeEnv, runCli } from './helpers/cli-process.js'
import { describePostgres, postgresUrl, withPostgresClient } from './helpers/test-database.js'

describePostgres('migrate and serve in a schema of their own (Postgres)', () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'migrate-own-schema-'))
  const cleanUps: string[] = []
  afterAll(async () => {
    rmSync(dataDir, { recursive: true, force: true })
    await admin(async (client) => {
      for (const statement of cleanUps.reverse()) await client.query(statement)
    })
  })

  const admin = withPostgresClient
  const withSearchPath = (searchPath: string | undefined, user?: string) => {
    const url = new URL(postgresUrl!)
    if (searchPath) url.searchParams.set('options', `-c search_path=${searchPath}`)
    if (user) url.username = user
    return url.toString()
  }
  const cli = (args: string[], databaseUrl: string) => runCli(args, { DATA_DIR: dataDir, DATABASE_URL: databaseUrl })
  const tablesIn = (schema: string) =>
    admin(async (client) =>
      (await client.query<{ name: string }>('select tablename as name from pg_tables where schemaname = $1', [schema])).rows.map((row) => row.name),
    )

  it('whose name needs quoting: migrate applies every migration there, finds them current after, and a command runs', async () => {
    const schema = `Escrow-Prod-${randomBytes(4).toString('hex')}`
    await admin((client) => client.query(`create schema "${schema}"`))
    cleanUps.push(`drop schema if exists "${schema}" cascade`)
    const url = withSearchPath(`"${schema}"`)

    expect(await cli(['migrate'], url)).toEqual({ code: 0, stdout: `applied: ${Object.keys(migrations).join(', ')}\n`, stderr: '' })
    expect(await cli(['migrate'], url)).toEqual({ code: 0, stdout: 'migrations are current\n', stderr: '' })
    expect(await cli(['orders', 'list', '--json'], url)).toMatchObject({ code: 0, stderr: '' })
    expect(await tablesIn(schema)).toEqual(expect.arrayContaining(['kysely_migration', 'orders', 'webhook_deliveries']))
    expect(await tablesIn(schema.toLowerCase())).toEqual([])
  })

  it("refuses to migrate into a role's new schema in front of the one its tables are in, naming both and the search_path to pin", async () => {
    // the role's search_path as Postgres's default, "$user", public, with a schema of the test's for public
    const role = `own_${randomBytes(4).toString('hex')}`
    const old = `${role}_old`
    await admin(async (client) => {
      await client.query(`create role ${role} login`)
      await client.query(`create schema ${old} authorization ${role}`)
      await client.query(`alter role ${role} set search_path = "$user", ${old}`)
    })
    cleanUps.push(`drop role if exists ${role}`, `drop schema if exists ${old} cascade`, `drop schema if exists ${role} cascade`)
    const url = withSearchPath(undefined, role)
    expect((await cli(['migrate'], url)).code).toBe(0)
    expect(await tablesIn(old)).toContain('orders')

    await admin((client) => client.query(`create schema ${role} authorization ${role}`))
    const refusal =
      `the connection's schema ${role} has none of this service's tables, and the schema ${old}, after it on the search_path, has them ` +
      `(${Object.keys(migrations).length} migrations applied): migrating would make new, empty tables in ${role} in front of them. ` +
      `To go on with those in ${old}, name it alone on the search_path in DATABASE_URL (?options=-c%20search_path%3D${old}); ` +
      `to start anew in ${role}, name that one alone (?options=-c%20search_path%3D${role})`
    expect(await cli(['migrate'], url)).toEqual({ code: 2, stdout: '', stderr: `Migration (before any migration ran) failed: ${refusal} [migrated_elsewhere]\n` })

    const served = await runCli(['serve'], postgresServeEnv({ databaseUrl: url, dataDir }))
    expect(served.code).toBe(1)
    const failed = `${served.stdout}${served.stderr}`
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as { msg: string; err?: unknown })
      .find((line) => line.msg === 'start-up failed')
    // a refusal, not a crash: its code and message, no stack trace
    expect(failed?.err).toEqual({ code: 'migrated_elsewhere', message: `Migration (before any migration ran) failed: ${refusal}` })

    // a command is not told to run `migrate`
    const command = await cli(['orders', 'list'], url)
    expect([command.code, command.stderr]).toEqual([1, `${refusal.charAt(0).toUpperCase()}${refusal.slice(1)}; nothing was changed [not_migrated]\n`])
    expect(await tablesIn(role)).toEqual([])

    // pinned as the refusal says, the service goes on with its tables
    expect(await cli(['migrate'], `${withSearchPath(undefined, role)}?options=-c%20search_path%3D${old}`)).toEqual({
      code: 0,
      stdout: 'migrations are current\n',
      stderr: '',
    })
  })

  it("migrates into the connection's schema where a later one holds another application's migration table", async () => {
    const ours = `ours_${randomBytes(4).toString('hex')}`
    const theirs = `${ours}_theirs`
    await admin(async (client) => {
      await client.query(`create schema ${ours}`)
      await client.query(`create schema ${theirs}`)
      await client.query(`create table ${theirs}.kysely_migration (name varchar(255) primary key, timestamp varchar(255) not null)`)
      await client.query(`insert into ${theirs}.kysely_migration values ('2024_01_create_invoices', '2024-01-01T00:00:00.000Z')`)
    })
    cleanUps.push(`drop schema if exists ${ours} cascade`, `drop schema if exists ${theirs} cascade`)
    expect(await cli(['migrate'], withSearchPath(`${ours},${theirs}`))).toEqual({
      code: 0,
      stdout: `applied: ${Object.keys(migrations).join(', ')}\n`,
      stderr: '',
    })
  })
})
