// The service in a schema of its own, named on the search_path of DATABASE_URL (`options=-c search_path=…`): a name
// that needs quoting is used as it is. The compiled CLI, as run.
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, expect, it } from 'vitest'
import { migrations } from '../migrations/index.js'
import { runCli } from './helpers/cli-process.js'
import { describePostgres, postgresUrl } from './helpers/test-database.js'

describePostgres('migrate and serve in a schema of their own (Postgres)', () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'migrate-own-schema-'))
  const cleanUps: string[] = []
  afterAll(async () => {
    rmSync(dataDir, { recursive: true, force: true })
    await admin(async (client) => {
      for (const statement of cleanUps.reverse()) await client.query(statement)
    })
  })

  const admin = async <T>(run: (client: pg.Client) => Promise<T>): Promise<T> => {
    const client = new pg.Client({ connectionString: postgresUrl })
    await client.connect()
    try {
      return await run(client)
    } finally {
      await client.end()
    }
  }
  const withSearchPath = (searchPath: string, user?: string) => {
    const url = new URL(postgresUrl!)
    url.searchParams.set('options', `-c search_path=${searchPath}`)
    if (user) url.username = user
    return url.toString()
  }
  const cli = (args: string[], databaseUrl: string) => runCli(args, { DATA_DIR: dataDir, DATABASE_URL: databaseUrl }, { built: true })
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
})
