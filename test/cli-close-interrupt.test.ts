// A Ctrl-C that comes right after a command printed its result, while the command closes its embedded database (the
// compiled CLI on a PGlite DATA_DIR): the close finishes, and the command exits with its own code, 0. Left to Node's
// default, the signal ended the process in the middle of Postgres's shutdown checkpoint (exit by SIGINT, 130 to a
// shell, after a printed success), and the next open of DATA_DIR went through crash recovery.
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { expect, it } from 'vitest'
import { receiverEnv, runCli, spawnCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

// Postgres's control file (global/pg_control) says how the cluster was left: its state, a 4-byte enum after the
// system identifier (8 bytes) and two 4-byte version numbers, the same layout in every version. 1 is "shut down"
// (a clean close); 3, "shutting down", is what a close cut short leaves, and the next start recovers from the log.
const DB_SHUTDOWNED = 1
function clusterState(dataDir: string): number {
  return readFileSync(path.join(dataDir, 'pglite', 'global', 'pg_control')).readUInt32LE(16)
}

it('lets the embedded database close after a command printed its result, and exits 0', async () => {
  const dataDir = migratedDataDir('cli-close-interrupt-')
  const env = receiverEnv(dataDir)
  const child = spawnCli(['orders', 'create', '--external-reference', 'close-1'], env, { built: true })
  let stdout = ''
  let stderr = ''
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  // the first bytes of its result: the order is created, and what is left is the close
  child.stdout!.on('data', (chunk) => {
    if (stdout === '') child.kill('SIGINT')
    stdout += chunk
  })
  const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null]

  expect(stdout).toContain('close-1')
  expect(clusterState(dataDir)).toBe(DB_SHUTDOWNED)
  expect({ code, signal }).toEqual({ code: 0, signal: null })
  expect(stderr).toContain('the command is done: closing its database, then exiting')

  // and it opens as it was left: the order is there
  const shown = await runCli(['orders', 'show', 'close-1'], env, { built: true })
  expect(shown).toMatchObject({ code: 0, stdout: expect.stringContaining('close-1') })
})
