// The embedded database's lock (DATA_DIR/pglite/partner-escrow.lock) names its owner by pid and, where Linux tells
// it, by the time that process started. A pid handed since to another process (pids are reused: a container's
// small ones soon) is not the owner: its lock is taken over, where it used to be blamed on that process for good,
// `in use by process N`, with nothing to say how to clear it.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { DatabaseInUseError, openDatabase } from '../src/db/open-database.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const onLinux = existsSync('/proc/self/stat')

describe.skipIf(!onLinux)('the embedded database’s lock', () => {
  // a live process that is not a service: the pid a stale lock may name after reuse
  const bystander = spawn('sleep', ['300'], { stdio: 'ignore' })
  afterAll(async () => {
    bystander.kill()
    await once(bystander, 'exit').catch(() => {})
  })
  const startTime = (pid: number) => {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
  }
  const lockFile = (dataDir: string) => path.join(dataDir, 'pglite', 'partner-escrow.lock')

  it('takes over a lock whose pid now belongs to a process that started later than the owner', async () => {
    const dataDir = migratedDataDir('lock-reused-pid-')
    writeFileSync(lockFile(dataDir), `${bystander.pid} 1`)
    const database = openDatabase({ dataDir })
    try {
      expect(readFileSync(lockFile(dataDir), 'utf8')).toBe(`${process.pid} ${startTime(process.pid)}`)
    } finally {
      await database.close()
    }
  })

  it('refuses while the owner named by pid and start time runs, and a lock of the pid alone as before', () => {
    for (const content of [`${bystander.pid} ${startTime(bystander.pid!)}`, String(bystander.pid)]) {
      const dataDir = migratedDataDir('lock-owner-runs-')
      writeFileSync(lockFile(dataDir), content)
      expect(() => openDatabase({ dataDir }), content).toThrow(DatabaseInUseError)
      expect(() => openDatabase({ dataDir }), content).toThrow(`in use by process ${bystander.pid}`)
    }
  })
})
