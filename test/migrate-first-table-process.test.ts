// A first migration whose first table the database refuses: a read-only session (a standby, or a role or database
// with default_transaction_read_only), or a default_tablespace the role may not create in. The migrator looked again
// in the transaction the refusal aborted, and all `migrate` and a start said was `the database refused the statement
// (25P02)`; a start on a read-only database, which it waits out elsewhere, ended with exit 1. The compiled CLI, as run.
import { once } from 'node:events'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, expect, it } from 'vitest'
import { jsonLogLines, postgresServeEnv, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { describePostgres, postgresUrl, withPostgresClient } from './helpers/test-database.js'

describePostgres("migrate and serve where the database refuses the migrations' first table (Postgres)", () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'migrate-first-table-'))
  const roles: string[] = []
  afterAll(async () => {
    rmSync(dataDir, { recursive: true, force: true })
    await admin(async (client) => {
      for (const role of roles) {
        await client.query(`drop schema if exists ${role} cascade`)
        await client.query(`drop role if exists ${role}`)
      }
    })
  })

  const admin = withPostgresClient
  // a role with a schema of its own, its sessions started with `setting`
  const roleWith = async (prefix: string, setting: string) => {
    const role = `${prefix}_${randomBytes(4).toString('hex')}`
    roles.push(role)
    await admin(async (client) => {
      await client.query(`create role ${role} login`)
      await client.query(`create schema ${role} authorization ${role}`)
      await client.query(`alter role ${role} set ${setting}`)
    })
    const url = new URL(postgresUrl!)
    url.username = role
    url.searchParams.set('options', `-c search_path=${role}`)
    return { role, url: url.toString() }
  }
  const tablesOf = async (schema: string) => {
    let count = -1
    await admin(async (client) => {
      count = (await client.query('select 1 from pg_tables where schemaname = $1', [schema])).rowCount ?? -1
    })
    return count
  }

  it('migrate names the default tablespace the role may not create in, its code 42501 and the grant, exit 1', async () => {
    // the role may create in its schema; the tablespace is another matter (pg_global: no role but the superuser's)
    const { role, url } = await roleWith('tablespace', 'default_tablespace = pg_global')
    const result = await runCli(['migrate'], { DATA_DIR: dataDir, DATABASE_URL: url })
    expect(result).toEqual({
      code: 1,
      stdout: '',
      stderr:
        `Migration (before any migration ran) failed: no table can be created in the schema ${role}: the role ${role} may not create tables in the ` +
        `tablespace pg_global, its default_tablespace (42501): GRANT CREATE ON TABLESPACE pg_global TO ${role}, or give the role a default_tablespace ` +
        `it may use (ALTER ROLE ${role} SET default_tablespace = …) [migration_failed]\n`,
    })
    expect(await tablesOf(role)).toBe(0)
  })

  it('migrate says the database is read-only (25006), try again later; serve waits it out and migrates once it takes writes', async () => {
    const { role, url } = await roleWith('read_only', 'default_transaction_read_only = on')
    const result = await runCli(['migrate'], { DATA_DIR: dataDir, DATABASE_URL: url })
    expect([result.code, result.stdout, result.stderr]).toEqual([
      1,
      '',
      'The database could not run the command now: the database is read-only (a standby, a failover under way, or default_transaction_read_only) ' +
        '(25006); try again later [database_unavailable]\n',
    ])

    const child = spawnCli(['serve'], postgresServeEnv({ databaseUrl: url, dataDir }))
    try {
      const lines = jsonLogLines(child)
      const retrying = await waitForLogLine(child, 'database not available at start-up; retrying')
      expect(retrying.err).toMatchObject({ kind: 'unavailable', code: '25006' })
      await admin((client) => client.query(`alter role ${role} reset default_transaction_read_only`))
      await waitForLogLine(child, 'service listening')
      expect(lines.filter((line) => line.msg === 'start-up failed')).toEqual([])
      expect(await tablesOf(role)).toBeGreaterThan(0)
      child.kill('SIGTERM')
      const [code] = (await once(child, 'exit')) as [number | null]
      expect(code).toBe(0)
    } finally {
      await stopChild(child, 'SIGKILL')
    }
  })
})
