// A start refused for what the operator is to fix (a database a newer build migrated; migrate-own-schema-process
// covers a search_path in front of the service's tables) is a message with a code, not a crash: its `start-up failed`
// line carried the whole stack trace of the refusal, which read as a fault of the code's. The compiled `serve`, as run.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { sql } from 'kysely'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { postgresServeEnv, runCli } from './helpers/cli-process.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

const NEWER = '9999_from_a_newer_build'

describePostgres('a start refused for a reason of the configuration (Postgres)', () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'start-refusal-'))
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase({ kind: 'postgres' })
  })
  afterAll(async () => {
    await database?.close()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it('on a database a newer build migrated: logs start-up failed with its code and message only, no stack, exit 1', async () => {
    await sql`insert into kysely_migration (name, timestamp) values (${NEWER}, ${new Date().toISOString()})`.execute(database.db)
    const result = await runCli(['serve'], postgresServeEnv({ databaseUrl: database.url!, dataDir }))
    expect(result.code).toBe(1)
    const output = `${result.stdout}${result.stderr}`
    const failed = output
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as { level: number; msg: string; err?: unknown })
      .find((line) => line.msg === 'start-up failed')
    expect(failed?.level).toBe(50)
    expect(failed?.err).toEqual({
      code: 'migrated_by_newer_build',
      message:
        `Migration (before any migration ran) failed: this database was migrated by a newer build of the service: ${NEWER} is applied, ` +
        'and this build does not have it: run that build or a later one, or restore the database from before it',
    })
    expect(output).not.toMatch(/\n\s+at |\\n\s+at /)
  })
})
