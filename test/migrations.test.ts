import { type KyselyPlugin, sql } from 'kysely'
import { describe, expect, it } from 'vitest'
import { migrations } from '../migrations/index.js'
import { migrateToLatest, migrationsAreCurrent } from '../src/db/migrate.js'
import { runCli } from './helpers/cli-process.js'
import { createTestDatabase, describePostgres } from './helpers/test-database.js'

const allMigrations = Object.keys(migrations)

describe('migrations', () => {
  it('apply every migration once and nothing on a second run', async () => {
    const database = await createTestDatabase({ migrate: false })
    try {
      expect(await migrationsAreCurrent(database.db)).toBe(false)
      expect((await migrateToLatest(database.db)).applied).toEqual(allMigrations)
      expect((await migrateToLatest(database.db)).applied).toEqual([])
      expect(await migrationsAreCurrent(database.db)).toBe(true)
    } finally {
      await database.close()
    }
  })
})

describe('migrations on a database older than Postgres 13', () => {
  it('are refused before any runs, in words that name the version needed', async () => {
    const database = await createTestDatabase({ migrate: false })
    // the server's answer to the version asked, as a Postgres 12 would give it
    const asPostgres12: KyselyPlugin = {
      transformQuery: (args) => args.node,
      transformResult: async ({ result }) =>
        result.rows[0] && 'version' in result.rows[0] ? { ...result, rows: [{ version: 120_018 }] } : result,
    }
    try {
      await expect(migrateToLatest(database.db.withPlugin(asPostgres12))).rejects.toThrow(
        'Migration (before any migration ran) failed: Postgres 13 or later is needed, and this database is 12: upgrade it, or give DATABASE_URL another',
      )
      expect(await migrationsAreCurrent(database.db)).toBe(false)
      const { rows } = await sql<{ name: string }>`select tablename as name from pg_tables where schemaname = current_schema() and tablename not like 'kysely%'`.execute(database.db)
      expect(rows).toEqual([])
    } finally {
      await database.close()
    }
  })
})

describePostgres('migrations from several processes (Postgres)', () => {
  it('are applied exactly once when two processes migrate at the same moment', async () => {
    const database = await createTestDatabase({ migrate: false })
    try {
      const env = { DATABASE_URL: database.url!, LOG_LEVEL: 'warn' }
      const results = await Promise.all([
        runCli(['migrate', '--json'], env),
        runCli(['migrate', '--json'], env),
      ])
      for (const result of results) expect(result.code, result.stderr).toBe(0)
      const applied = results.flatMap((result) => JSON.parse(result.stdout).applied as string[])
      expect(applied.sort()).toEqual([...allMigrations].sort())
      expect(await migrationsAreCurrent(database.db)).toBe(true)
    } finally {
      await database.close()
    }
  })
})
