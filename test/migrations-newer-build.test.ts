// A database a newer build of the service migrated (a rolling upgrade rolled back, an older replica restarted
// beside upgraded ones): this build's start and commands said only "corrupted migrations: previously executed
// migration … is missing", which points at nothing. The compiled CLI on a DATA_DIR whose database holds a
// migration this build does not have names it and what to do.
import path from 'node:path'
import { PGlite } from '@electric-sql/pglite'
import { describe, expect, it } from 'vitest'
import { runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const NEWER = '9999_from_a_newer_build'

describe('a database migrated by a newer build', () => {
  it('is refused by migrate and by a command, naming the migration this build does not have', async () => {
    const dataDir = migratedDataDir('newer-build-')
    const database = new PGlite(path.join(dataDir, 'pglite'))
    await database.query('insert into kysely_migration (name, timestamp) values ($1, $2)', [NEWER, new Date().toISOString()])
    await database.close()

    for (const args of [['migrate'], ['orders', 'list']]) {
      const result = await runCli(args, { DATA_DIR: dataDir })
      expect(result.code, args.join(' ')).toBe(1)
      expect(result.stderr).toContain(
        `this database was migrated by a newer build of the service: ${NEWER} is applied, and this build does not have it: ` +
          'run that build or a later one, or restore the database from before it',
      )
      expect(result.stderr).not.toContain('corrupted migrations')
      // ending in its code, as a database a migration behind does ([not_migrated]): it had none
      expect(result.stderr).toMatch(/^[^\n]+ \[migrated_by_newer_build\]\n$/)
    }
  })
})
