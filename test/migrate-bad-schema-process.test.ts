// A DATABASE_URL whose search_path names no schema (`options=-c search_path=nope`), or a schema holding another
// application's table of one of our names: `migrate` printed `Migration (before any migration ran) failed: …` with no
// code, exit 1, and `serve` logged `start-up failed` with the whole stack and no SQLSTATE (an outside tester's
// badconfig.sh). Now `migrate` ends the line in its code and exits 2, as for a configuration that does not hold;
// `serve` logs the database's code, no stack, and exits 1 as any failed start does. The compiled CLI, as run.
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, expect, it } from 'vitest'
import { postgresServeEnv, runCli } from './helpers/cli-process.js'
import { describePostgres, postgresUrl, withPostgresClient } from './helpers/test-database.js'

describePostgres('migrate and serve on a search_path that names no schema or a schema another application holds (Postgres)', () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'migrate-bad-schema-'))
  const schemas: string[] = []
  afterAll(async () => {
    rmSync(dataDir, { recursive: true, force: true })
    await admin(async (client) => {
      for (const schema of schemas) await client.query(`drop schema if exists ${schema} cascade`)
    })
  })

  const admin = withPostgresClient
  const withSearchPath = (schema: string) => {
    const url = new URL(postgresUrl!)
    url.searchParams.set('options', `-c search_path=${schema}`)
    return url.toString()
  }
  const migrate = (databaseUrl: string) => runCli(['migrate'], { DATA_DIR: dataDir, DATABASE_URL: databaseUrl })

  it('migrate names the missing schema in one line ending [no_schema], exit 2', async () => {
    const result = await migrate(withSearchPath(`nope_${randomBytes(4).toString('hex')}`))
    expect(result).toEqual({
      code: 2,
      stdout: '',
      stderr:
        "Migration (before any migration ran) failed: no schema of the connection's search_path exists to create the tables in (3F000): " +
        'create it (CREATE SCHEMA …), or name an existing one in DATABASE_URL (options=-c search_path=…) [no_schema]\n',
    })
  })

  it("migrate names another application's table in one line ending [schema_taken], exit 2, and creates nothing", async () => {
    const schema = `taken_${randomBytes(4).toString('hex')}`
    schemas.push(schema)
    await admin(async (client) => {
      await client.query(`create schema ${schema}`)
      await client.query(`create table ${schema}.orders (id int primary key, customer text)`)
    })
    const result = await migrate(withSearchPath(schema))
    expect(result).toEqual({
      code: 2,
      stdout: '',
      stderr:
        `Migration 0001_initial failed: "orders", which it creates, is already in the connection's schema, made by something other ` +
        "than this service's migrations (42P07): give the service a schema of its own (options=-c search_path=… in DATABASE_URL) [schema_taken]\n",
    })
    await admin(async (client) => {
      const { rows } = await client.query('select tablename from pg_tables where schemaname = $1', [schema])
      expect(rows).toEqual([{ tablename: 'orders' }])
    })
  })

  it('any other failed migration ends in [migration_failed], exit 1', async () => {
    // a role that may not create tables in its schema
    const schema = `limited_${randomBytes(4).toString('hex')}`
    const role = schema
    schemas.push(schema)
    await admin(async (client) => {
      await client.query(`create schema ${schema}`)
      await client.query(`create role ${role} login`)
      await client.query(`grant usage on schema ${schema} to ${role}`)
    })
    try {
      const url = new URL(withSearchPath(schema))
      url.username = role
      const result = await migrate(url.toString())
      expect(result.code).toBe(1)
      expect(result.stderr).toMatch(/^Migration \(before any migration ran\) failed: the role \S+ may not create tables in the schema .* \[migration_failed\]\n$/)
    } finally {
      await admin(async (client) => {
        await client.query(`drop schema if exists ${schema} cascade`)
        await client.query(`drop role if exists ${role}`)
      })
    }
  })

  it('serve logs start-up failed with the code 3F000 and the advice, no stack, exit 1', async () => {
    const result = await runCli(['serve'], postgresServeEnv({ databaseUrl: withSearchPath(`nope_${randomBytes(4).toString('hex')}`), dataDir }))
    expect(result.code).toBe(1)
    const lines = `${result.stdout}${result.stderr}`
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as { msg: string; err?: Record<string, unknown> })
    const failed = lines.find((line) => line.msg === 'start-up failed')
    expect(failed?.err).toMatchObject({
      code: '3F000',
      context: expect.stringContaining("no schema of the connection's search_path exists to create the tables in (3F000)"),
    })
    expect(failed?.err?.stack ?? '').toBe('')
    expect(`${result.stdout}${result.stderr}`).not.toMatch(/\n\s+at /)
  })
})
