// The embedded database's lock (DATA_DIR/pglite/partner-escrow.lock) names its owner by pid and, where Linux tells
// it, by the time that process started. A pid handed since to another process (pids are reused: a container's
// small ones soon) is not the owner: its lock is taken over, where it used to be blamed on that process for good,
// `in use by process N`, with nothing to say how to clear it.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createHash } from 'node:crypto'
import { existsSync, readFileSync, utimesSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import { afterAll, describe, expect, it } from 'vitest'
import { DatabaseInUseError, openDatabase } from '../src/db/open-database.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const onLinux = existsSync('/proc/self/stat')
const root = path.resolve(import.meta.dirname, '..')

describe.skipIf(!onLinux)('the embedded database’s lock', () => {
  // a live process that is not a service: the pid a stale lock may name after reuse. It lives until it is ended here
  // (or its stdin closes, as the test's process ends): a `sleep 300` had ended by the time a loaded machine reached
  // the tests that read its /proc (ENOENT), and the wait for its exit, long past, never ended
  const bystander = spawn('cat', [], { stdio: ['pipe', 'ignore', 'ignore'] })
  const bystanderExited = once(bystander, 'exit')
  afterAll(async () => {
    bystander.kill()
    await bystanderExited
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

  // Processes that try the lock at the same instant (each blocks reading its stdin, then opens): exactly one may
  // have the database. A lock was made empty and written after, and one read in between was taken for a dead
  // owner's and removed under its owner; two that both found a stale lock each removed it, the later removing the
  // lock the first had taken meanwhile.
  it.each([
    ['no lock', undefined],
    ['a dead owner\'s lock', '999999999 1'],
  ])('gives the database to exactly one of processes opening it at once over %s', async (_, stale) => {
    for (let round = 0; round < 3; round++) {
      const dataDir = migratedDataDir('lock-race-')
      if (stale) writeFileSync(lockFile(dataDir), stale)
      // a blocking read of stdin: the racers wait without a core each, and all wake when the test writes (an error
      // other than the refusal prints its stack on the test's stderr). The script is a file: given with `-e` and
      // `--input-type=module`, the option reached the database's thread, which could not start ("--input-type can
      // only be used with string input"), and a winner that closed before that failure arrived failed its close
      const script = path.join(dataDir, 'racer.mts')
      writeFileSync(
        script,
        `import { readSync } from 'node:fs'; import { openDatabase } from ${JSON.stringify(pathToFileURL(path.join(root, 'src/db/open-database.ts')).href)};` +
          `console.log('ready'); readSync(0, Buffer.alloc(1));` +
          `try { const database = openDatabase({ dataDir: ${JSON.stringify(dataDir)} }); console.log('locked');` +
          ` await new Promise((resolve) => setTimeout(resolve, 1500)); await database.close() }` +
          ` catch (error) { console.log(error.name); if (error.name !== 'DatabaseInUseError') console.error(error.stack) }`,
      )
      const children = Array.from({ length: 6 }, () =>
        spawn(process.execPath, ['--import', 'tsx', script], { cwd: root, stdio: ['pipe', 'pipe', 'inherit'] }),
      )
      const outputs = children.map(() => '')
      const ready = children.map(
        (child, index) =>
          new Promise<void>((resolve) =>
            child.stdout!.on('data', (chunk) => {
              outputs[index] += chunk
              if (outputs[index]!.includes('ready')) resolve()
            }),
          ),
      )
      const exited = children.map((child) => once(child, 'exit'))
      await Promise.all(ready)
      for (const child of children) child.stdin!.write('g')
      await Promise.all(exited)
      const outcomes = outputs.map((output) => output.replace('ready', '').trim())
      expect(outcomes.filter((outcome) => outcome === 'locked'), outcomes.join(', ')).toHaveLength(1)
      expect(outcomes.filter((outcome) => outcome === 'DatabaseInUseError')).toHaveLength(5)
    }
  })

  // a process that died in the microseconds it held a take-over's marker left it: the next ones wait, then say so
  it('names a take-over marked by another process, and takes the lock once that marker is abandoned', async () => {
    const dataDir = migratedDataDir('lock-marker-')
    const stale = '999999999 1'
    writeFileSync(lockFile(dataDir), stale)
    const marker = `${lockFile(dataDir)}.${createHash('sha256').update(stale).digest('hex').slice(0, 16)}.takeover`
    writeFileSync(marker, '999999998 1')
    expect(() => openDatabase({ dataDir })).toThrow(/its lock is stale and another process is taking it over .* \[data_dir_in_use\]$/)
    const abandoned = new Date(Date.now() - 60_000)
    utimesSync(marker, abandoned, abandoned)
    const database = openDatabase({ dataDir })
    await database.close()
  })

  it('refuses while the owner named by pid and start time runs, and a lock of the pid alone as before', () => {
    for (const content of [`${bystander.pid} ${startTime(bystander.pid!)}`, String(bystander.pid)]) {
      const dataDir = migratedDataDir('lock-owner-runs-')
      writeFileSync(lockFile(dataDir), content)
      expect(() => openDatabase({ dataDir }), content).toThrow(DatabaseInUseError)
      expect(() => openDatabase({ dataDir }), content).toThrow(`in use by process ${bystander.pid}`)
    }
  })

  // found from outside: a command typed in a second terminal while `npm start` started (before serve.json) opened the
  // database for a moment, and the service's start met the lock and exited 1
  it('waits, where asked (serve), for a running owner that lets go of the lock, and refuses at once where not', async () => {
    const dataDir = migratedDataDir('lock-waited-')
    // another process holds the lock for a moment, as a command does: written, then removed 1.5 s after the test says
    // (it has seen the refusal by then, however slow the machine: a lock removed 1.5 s after it was written, and looked
    // for during 2 s only, could be gone, or not there yet, when the refusal was checked)
    const holder = spawn(
      process.execPath,
      [
        '-e',
        `const fs = require('node:fs'); fs.writeFileSync(${JSON.stringify(lockFile(dataDir))}, String(process.pid)); console.log('held');` +
          ` process.stdin.once('data', () => setTimeout(() => { fs.rmSync(${JSON.stringify(lockFile(dataDir))}); process.exit() }, 1_500))`,
      ],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    )
    const exited = once(holder, 'exit')
    try {
      let said = ''
      await new Promise<void>((resolve, reject) => {
        holder.stdout!.on('data', (chunk) => {
          said += chunk
          if (said.includes('held')) resolve()
        })
        void exited.then(() => reject(new Error(`the lock's holder exited before it held the lock: ${said}`)))
      })
      expect(() => openDatabase({ dataDir })).toThrow(`in use by process ${holder.pid} (a running \`npm start\`, or a command)`)
      holder.stdin!.write('g')
      // a bound on a hang: the holder lets go 1.5 s after it is told
      const database = openDatabase({ dataDir, lockWaitMs: 120_000 })
      try {
        expect(readFileSync(lockFile(dataDir), 'utf8')).toBe(`${process.pid} ${startTime(process.pid)}`)
      } finally {
        await database.close()
      }
    } finally {
      holder.kill()
      await exited
    }
  })
})
