// One process at a time keeps the sandbox's state file. Two local-mode services over one DATA_DIR (allowed with
// DATABASE_URL on Postgres) both ran a sandbox over `sandbox-state.json`: both handed out TRD-000001 to different
// trades, and the second's first snapshot was written over the first's journal, so a restart lost one service's
// trades. A lock file beside the state (`sandbox-state.json.lock`) holds its owner's pid and start time; a second
// process is refused with its pid, a dead owner's lock is taken over. Within one process the lock is shared
// (a test's sandboxes, one restarted in place): the process is the unit that writes.
import { mkdirSync, rmSync } from 'node:fs'
import path from 'node:path'
import { lockOwner, lockOwnerRuns, ownLockContent, readIfThere, removeStaleLock, sleepSync } from '../lock-file.js'
import { writeWholeUnlessThere } from '../write-whole.js'
import { SandboxStateError } from './sandbox-state.js'

/** The lock file of the state kept in `file`. */
export function sandboxStateLockFile(file: string): string {
  return `${file}.lock`
}

// the locks this process holds, and how many of its sandboxes hold each
const heldHere = new Map<string, number>()

/**
 * Takes the lock of the state kept in `file` for this process, or throws SandboxStateError `sandbox_state_in_use`
 * naming the process that holds it. Answers the release (once per take).
 */
export function lockSandboxState(file: string): () => void {
  const lockFile = sandboxStateLockFile(file)
  mkdirSync(path.dirname(lockFile), { recursive: true })
  const mine = `${ownLockContent()}\n`
  const read = () => unreadable('read', lockFile, () => readIfThere(lockFile))
  let released = false
  const release = () => {
    if (released) return
    released = true
    const count = (heldHere.get(lockFile) ?? 1) - 1
    if (count > 0) return void heldHere.set(lockFile, count)
    heldHere.delete(lockFile)
    if (read() === mine) rmSync(lockFile, { force: true })
  }
  const holding = heldHere.get(lockFile)
  if (holding !== undefined && read() === mine) {
    heldHere.set(lockFile, holding + 1)
    return release
  }
  for (let attempt = 0; attempt < 200; attempt++) {
    if (unreadable('create', lockFile, () => writeWholeUnlessThere(lockFile, mine))) {
      heldHere.set(lockFile, 1)
      return release
    }
    const seen = read()
    if (seen === undefined) continue
    const { pid: owner, started: ownerStarted } = lockOwner(seen)
    // (one with this process's pid, not taken here, was left by a dead process that had the same pid: a container's)
    if (Number.isSafeInteger(owner) && owner > 0 && owner !== process.pid && lockOwnerRuns(owner, ownerStarted)) {
      throw new SandboxStateError(
        'sandbox_state_in_use',
        `The sandbox state file ${file} is in use by process ${owner} (another service or sandbox over this DATA_DIR): ` +
          'two sandboxes over one state would hand out the same trade references and write over each other’s trades. ' +
          'Stop that process, or give this one a DATA_DIR of its own',
      )
    }
    if (!unreadable('take over', lockFile, () => removeStaleLock(lockFile, seen, mine))) sleepSync(5)
  }
  throw new SandboxStateError(
    'sandbox_state_in_use',
    `Cannot lock the sandbox state file ${file}: its lock ${lockFile} is stale and another process is taking it over; try again`,
  )
}

/** A step of the lock's take: the file system's failure is the state's being unreadable, said with its code. */
function unreadable<T>(what: string, file: string, step: () => T): T {
  try {
    return step()
  } catch (error) {
    throw new SandboxStateError('sandbox_state_unreadable', `Cannot ${what} the sandbox state lock ${file}`, { cause: error })
  }
}
