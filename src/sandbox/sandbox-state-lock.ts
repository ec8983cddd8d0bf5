// One process at a time keeps the sandbox's state file. Two local-mode services over one DATA_DIR (allowed with
// DATABASE_URL on Postgres) both ran a sandbox over `sandbox-state.json`: both handed out TRD-000001 to different
// trades, and the second's first snapshot was written over the first's journal, so a restart lost one service's
// trades. A lock file beside the state (`sandbox-state.json.lock`) holds its owner's pid and start time; a second
// process is refused with its pid, a dead owner's lock is taken over. Within one process the lock is shared
// (a test's sandboxes, one restarted in place): the process is the unit that writes.
import { createHash } from 'node:crypto'
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, statSync, writeSync } from 'node:fs'
import path from 'node:path'
import { processIsAlive } from '../process-alive.js'
import { SandboxStateError } from './sandbox-state.js'

/** The lock file of the state kept in `file`. */
export function sandboxStateLockFile(file: string): string {
  return `${file}.lock`
}

// the locks this process holds, and how many of its sandboxes hold each
const heldHere = new Map<string, number>()

// how old a take-over's marker is before it counts as left by a process that died in the middle of one
const ABANDONED_TAKEOVER_MS = 10_000

/**
 * Takes the lock of the state kept in `file` for this process, or throws SandboxStateError `sandbox_state_in_use`
 * naming the process that holds it. Answers the release (once per take).
 */
export function lockSandboxState(file: string): () => void {
  const lockFile = sandboxStateLockFile(file)
  mkdirSync(path.dirname(lockFile), { recursive: true })
  const started = processStartTime(process.pid)
  const mine = started === undefined ? `${process.pid}\n` : `${process.pid} ${started}\n`
  let released = false
  const release = () => {
    if (released) return
    released = true
    const count = (heldHere.get(lockFile) ?? 1) - 1
    if (count > 0) return void heldHere.set(lockFile, count)
    heldHere.delete(lockFile)
    if (readIfThere(lockFile) === mine) rmSync(lockFile, { force: true })
  }
  const holding = heldHere.get(lockFile)
  if (holding !== undefined && readIfThere(lockFile) === mine) {
    heldHere.set(lockFile, holding + 1)
    return release
  }
  for (let attempt = 0; attempt < 200; attempt++) {
    if (createWith(lockFile, mine)) {
      heldHere.set(lockFile, 1)
      return release
    }
    const seen = readIfThere(lockFile)
    if (seen === undefined) continue
    const [pidText = '', ownerStarted] = seen.trim().split(' ')
    const owner = Number(pidText)
    // (one with this process's pid, not taken here, was left by a dead process that had the same pid: a container's)
    if (Number.isSafeInteger(owner) && owner > 0 && owner !== process.pid && ownerRuns(owner, ownerStarted)) {
      throw new SandboxStateError(
        'sandbox_state_in_use',
        `The sandbox state file ${file} is in use by process ${owner} (another service or sandbox over this DATA_DIR): ` +
          'two sandboxes over one state would hand out the same trade references and write over each other’s trades. ' +
          'Stop that process, or give this one a DATA_DIR of its own',
      )
    }
    if (!removeStaleLock(lockFile, seen, mine)) sleepSync(5)
  }
  throw new SandboxStateError(
    'sandbox_state_in_use',
    `Cannot lock the sandbox state file ${file}: its lock ${lockFile} is stale and another process is taking it over; try again`,
  )
}

/** Creates `file` holding `contents` unless something is there already; false when it is. */
function createWith(file: string, contents: string): boolean {
  let descriptor: number
  try {
    descriptor = openSync(file, 'wx', 0o600)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false
    throw new SandboxStateError('sandbox_state_unreadable', `Cannot create the sandbox state lock ${file}`, { cause: error })
  }
  try {
    writeSync(descriptor, contents)
  } finally {
    closeSync(descriptor)
  }
  return true
}

/**
 * Removes the stale lock `seen`, once: of processes that all found it stale, only the one that creates the take-over
 * marker removes it, and only while it still reads `seen` (else a later one removed the lock the first had taken
 * meanwhile). False when another process holds the marker.
 */
function removeStaleLock(lockFile: string, seen: string, mine: string): boolean {
  const marker = `${lockFile}.${createHash('sha256').update(seen).digest('hex').slice(0, 16)}.takeover`
  if (!createWith(marker, mine)) {
    try {
      if (Date.now() - statSync(marker).mtimeMs > ABANDONED_TAKEOVER_MS) rmSync(marker, { force: true })
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error
    }
    return false
  }
  try {
    if (readIfThere(lockFile) === seen) rmSync(lockFile, { force: true })
  } finally {
    rmSync(marker, { force: true })
  }
  return true
}

function readIfThere(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw new SandboxStateError('sandbox_state_unreadable', `Cannot read the sandbox state lock ${file}`, { cause: error })
  }
}

/** When process `pid` started, in clock ticks since boot (Linux), or undefined where that cannot be read. */
function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // after the command name, which may hold spaces and parentheses: the fields from the third on
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
  } catch {
    return undefined
  }
}

/** Whether the lock's owner runs: its pid is alive and, where both are known, started when the lock says. */
function ownerRuns(owner: number, started: string | undefined): boolean {
  if (!processIsAlive(owner)) return false
  const now = started === undefined ? undefined : processStartTime(owner)
  return now === undefined || now === started
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)
}
