// A DATA_DIR whose embedded database is already made and migrated, for a test that starts the service (or a
// command) as a process and is not about its first start: the copy takes milliseconds where PGlite's initdb
// takes 6-15 s of a core. The template is made once per run (helpers/pglite-template.ts). A test of what a
// first start does (initdb, its log line, the modes of new files) takes an empty directory instead.
import { cpSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { inject } from 'vitest'

// Each copy is some 40 MB: removed once the test file is done, by helpers/setup.ts's after-hook (registered before
// the file's own hooks, so it runs after them: the file has stopped its processes by then). Not an afterAll of this
// module's own: in a worker that runs file after file with their modules shared (isolate: false), a module is
// imported once, and its hook would be the first file's alone.
const copies: string[] = []

/** Removes the copies made since the last call (helpers/setup.ts, at each test file's end). */
export function removeDataDirCopies(): void {
  // maxRetries: a child killed at the file's end (killLeftovers) may still be writing there for a moment
  for (const directory of copies.splice(0)) rmSync(directory, { recursive: true, force: true, maxRetries: 5 })
}

/** A new directory under the system's temporary one, named `prefix…`, holding a migrated embedded database. */
export function migratedDataDir(prefix: string): string {
  const directory = mkdtempSync(path.join(tmpdir(), prefix))
  copies.push(directory)
  cpSync(inject('pgliteTemplates').migratedDataDir, directory, { recursive: true })
  return directory
}
