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
