// A DATA_DIR whose embedded database is already made and migrated, for a test that starts the service (or a
// command) as a process and is not about its first start: the copy takes milliseconds where PGlite's initdb
// takes 6-15 s of a core. The template is made once per run (helpers/pglite-template.ts). A test of what a
// first start does (initdb, its log line, the modes of new files) takes an empty directory instead.
import { cpSync, mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { inject } from 'vitest'

/** A new directory under the system's temporary one, named `prefix…`, holding a migrated embedded database. */
export function migratedDataDir(prefix: string): string {
  const directory = mkdtempSync(path.join(tmpdir(), prefix))
  cpSync(inject('pgliteTemplates').migratedDataDir, directory, { recursive: true })
  return directory
}
