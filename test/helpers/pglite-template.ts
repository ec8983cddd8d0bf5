// vitest globalSetup: runs once per `vitest run`, before any test file. PGlite's initdb and the migrations
// cost seconds in every test file that makes a database; instead, one initialised data directory (and one
// migrated) is dumped to a tarball that createTestDatabase() loads. The tarballs are kept in
// node_modules/.cache, named by a hash of PGlite's version and the migrations, so a later run, or a new
// migration, rebuilds them only when they would differ.
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import type { TestProject } from 'vitest/node'
import { migrateToLatest } from '../../src/db/migrate.js'
import { openDatabase } from '../../src/db/open-database.js'

declare module 'vitest' {
  export interface ProvidedContext {
    /** Paths of the PGlite tarballs: a fresh cluster, and one with every migration applied. */
    pgliteTemplates: { empty: string; migrated: string }
  }
}

const root = path.resolve(import.meta.dirname, '../..')

export default async function setup(project: TestProject): Promise<void> {
  project.provide('pgliteTemplates', await ensurePgliteTemplates())
}

async function ensurePgliteTemplates(): Promise<{ empty: string; migrated: string }> {
  const hash = createHash('sha256')
  hash.update(readFileSync(path.join(root, 'node_modules/@electric-sql/pglite/package.json')))
  const sources = [
    ...readdirSync(path.join(root, 'migrations')).map((file) => path.join('migrations', file)),
    'src/db/migrate.ts',
    'src/db/open-database.ts',
  ].sort()
  for (const file of sources) hash.update(file).update(readFileSync(path.join(root, file)))
  const cache = path.join(root, 'node_modules/.cache/partner-escrow-test')
  const key = hash.digest('hex').slice(0, 16)
  const templates = { empty: path.join(cache, `pglite-empty-${key}.tgz`), migrated: path.join(cache, `pglite-migrated-${key}.tgz`) }
  if (existsSync(templates.empty) && existsSync(templates.migrated)) return templates
  mkdirSync(cache, { recursive: true })
  const database = openDatabase({ dataDir: 'memory://' })
  try {
    await write(templates.empty, await database.dumpDataDir!())
    await migrateToLatest(database.db)
    await write(templates.migrated, await database.dumpDataDir!())
  } finally {
    await database.close()
  }
  return templates
}

// written under a temporary name and renamed, so a concurrent run never reads half a tarball
async function write(file: string, tarball: Blob): Promise<void> {
  const partial = `${file}.${process.pid}.partial`
  writeFileSync(partial, Buffer.from(await tarball.arrayBuffer()))
  renameSync(partial, file)
}
