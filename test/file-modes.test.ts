// Embedded PGlite's files under the most permissive umask: the data directory and everything in it
// stay private to the service's user (directories 0700, files 0600), also files written after start.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { chmodSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { childEnv, freePort, runCli, waitForLogLine, stopChild } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')

/** Every entry under `directory` (itself included) whose mode lets anyone but the owner in. */
function looseEntries(directory: string): string[] {
  const loose: string[] = []
  const visit = (entry: string) => {
    const stats = lstatSync(entry)
    if (stats.isSymbolicLink()) return
    const mode = stats.mode & 0o777
    if (stats.isDirectory()) {
      if (mode !== 0o700) loose.push(`${entry} ${mode.toString(8)}`)
      for (const name of readdirSync(entry)) visit(path.join(entry, name))
    } else if ((mode & 0o077) !== 0) loose.push(`${entry} ${mode.toString(8)}`)
  }
  visit(directory)
  return loose
}

function countEntries(directory: string): number {
  return readdirSync(directory, { recursive: true }).length
}

describe('file modes of the embedded database, started with umask 000', () => {
  const dataDir = path.join(mkdtempSync(path.join(tmpdir(), 'file-modes-')), 'data')
  const env: Record<string, string> = { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false' }
  let service: ReturnType<typeof spawn>

  beforeAll(async () => {
    // what an earlier version (or a restore from a backup) left: world-writable
    mkdirSync(path.join(dataDir, 'pglite'), { recursive: true, mode: 0o777 })
    chmodSync(dataDir, 0o777)
    writeFileSync(path.join(dataDir, 'pglite', 'left-over'), 'x', { mode: 0o666 })
    chmodSync(path.join(dataDir, 'pglite', 'left-over'), 0o666)
    env.SANDBOX_PORT = String(await freePort())
    service = spawn('/bin/sh', ['-c', `umask 000; exec "${process.execPath}" dist/src/cli.js serve`], {
      cwd: root,
      env: childEnv(env),
      stdio: 'pipe',
    })
    await waitForLogLine(service, 'service listening')
    service.stdout!.resume()
  })

  afterAll(async () => {
    await stopChild(service)
  })

  it('keeps the data directory 0700 and every file 0600, through writes and a shutdown', async () => {
    expect(looseEntries(dataDir)).toEqual([])
    // writes while it runs (forwarded to the service, which owns the database)
    for (let i = 0; i < 5; i++) {
      const result = await runCli(['orders', 'create', '--external-reference', `modes-${i}`], env)
      expect(result.code, result.stderr).toBe(0)
    }
    expect(looseEntries(dataDir)).toEqual([])
    service.kill('SIGTERM')
    await once(service, 'exit')
    const entries = countEntries(dataDir)
    const loose = looseEntries(dataDir)
    console.warn(`PGlite data directory after a start with umask 000: ${entries} entries, ${loose.length} readable or writable by others`)
    expect(entries).toBeGreaterThan(100)
    expect(loose).toEqual([])
  })

  // a database that is there already is tightened before its start and again once it is ready: its start writes the
  // relation cache's files (pg_internal.init) 0644 under the umask 077 the open holds, which only the second walk
  // tightens (found skipping that walk for a database already there, 2026-12-07)
  it('keeps them so when a command opens the database again under umask 000: a file loosened meanwhile is tightened, what it writes is private', async () => {
    const loosened = path.join(dataDir, 'pglite', 'PG_VERSION')
    chmodSync(loosened, 0o666)
    const umaskBefore = process.umask(0o000)
    let result: Awaited<ReturnType<typeof runCli>>
    try {
      result = await runCli(['orders', 'create', '--external-reference', 'modes-again'], env)
    } finally {
      process.umask(umaskBefore)
    }
    expect(result.code, result.stderr).toBe(0)
    expect(result.stdout).toContain('modes-again')
    expect(looseEntries(dataDir)).toEqual([])
  })
})
