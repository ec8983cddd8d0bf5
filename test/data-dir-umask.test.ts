// While the embedded database holds a DATA_DIR on disk the process umask is 077 (db/private-directory.ts), so the
// files PGlite creates later are private. It was left 077 for the rest of the process: a process that embeds the
// service (the tests, a tool) and closed its database went on creating 0600 files where it asked for 0644.
import { afterEach, expect, it } from 'vitest'
import { openDatabase } from '../src/db/open-database.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const umaskAtStart = process.umask(0o022)
afterEach(() => {
  process.umask(umaskAtStart)
})

it('makes the umask 077 while an embedded database holds its DATA_DIR, and gives back the one it found once the last is closed', async () => {
  process.umask(0o022)
  const first = openDatabase({ dataDir: migratedDataDir('umask-first-') })
  expect(process.umask().toString(8)).toBe('77')
  const second = openDatabase({ dataDir: migratedDataDir('umask-second-') })
  await first.close()
  expect(process.umask().toString(8), 'another still holds its DATA_DIR').toBe('77')
  await second.close()
  expect(process.umask().toString(8)).toBe('22')
})
