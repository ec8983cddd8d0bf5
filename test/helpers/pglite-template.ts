// vitest globalSetup: runs once per `vitest run`, before any test file. PGlite's initdb and the migrations
// cost seconds in every test file that makes a database (initdb alone 6-15 s of a core on the 2-core
// machines); instead, one initialised data directory (and one migrated) is dumped to a tarball that
// createTestDatabase() loads, and the migrated one is also laid out as a DATA_DIR that a test starting the
// service as a process copies (helpers/data-dir-template.ts). They are kept in node_modules/.cache, named by
// a hash of PGlite's version and the migrations, so a later run, or a new migration, rebuilds them only when
// they would differ.
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import type { TestProject } from 'vitest/node'
import { migrateToLatest } from '../../src/db/migrate.js'
import { openDatabase } from '../../src/db/open-database.js'

declare module 'vitest' {
  export interface ProvidedContext {
    /**
     * Paths of the PGlite tarballs: a fresh cluster, and one with every migration applied; and a DATA_DIR
     * holding the migrated one, as `serve` leaves it after its first start.
     */
    pgliteTemplates: PgliteTemplates
  }
}

const root = path.resolve(import.meta.dirname, '../..')

interface PgliteTemplates {
  empty: string
  migrated: string
  migratedDataDir: string
}

export default async function setup(project: TestProject): Promise<void> {
  project.provide('pgliteTemplates', await ensurePgliteTemplates())
}

async function ensurePgliteTemplates(): Promise<PgliteTemplates> {
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
  const templates = {
    empty: path.join(cache, `pglite-empty-${key}.tgz`),
    migrated: path.join(cache, `pglite-migrated-${key}.tgz`),
    migratedDataDir: path.join(cache, `pglite-migrated-${key}`),
  }
  if (!existsSync(templates.empty) || !existsSync(templates.migrated)) {
    mkdirSync(cache, { recursive: true })
    const database = openDatabase({ dataDir: 'memory://' })
    try {
      await write(templates.empty, await database.dumpDataDir!())
      await migrateToLatest(database.db)
      await write(templates.migrated, await database.dumpDataDir!())
    } finally {
      await database.close()
    }
  }
  if (!existsSync(templates.migratedDataDir)) await layOutDataDir(templates.migrated, templates.migratedDataDir)
  return templates
}

// the service's own code opens a data directory from the tarball and closes it, leaving what its first
// start would (the database under pglite/, no lock); made beside its final name and renamed, as above
async function layOutDataDir(tarball: string, directory: string): Promise<void> {
  const partial = mkdtempSync(`${directory}.partial-`)
  try {
    const database = openDatabase({ dataDir: partial, pgliteTemplate: new Blob([readFileSync(tarball)]) })
    try {
      await migrateToLatest(database.db)
    } finally {
      await database.close()
    }
    renameSync(partial, directory)
  } catch (error) {
    rmSync(partial, { recursive: true, force: true })
    throw error
  }
}

// written under a temporary name and renamed, so a concurrent run never reads half a tarball
async function write(file: string, tarball: Blob): Promise<void> {
  const partial = `${file}.${process.pid}.partial`
  writeFileSync(partial, Buffer.from(await tarball.arrayBuffer()))
  renameSync(partial, file)
}
