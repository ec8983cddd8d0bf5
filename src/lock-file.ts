// The pieces of a lock file one process at a time holds (the embedded database's, db/open-database.ts; the sandbox
// state's, sandbox/sandbox-state-lock.ts): its content names the owner by pid and, where the system tells it (Linux's
// /proc), the owner's start time, so that a pid given since to another process (a `sleep`, a shell) is not taken for
// the owner; a dead owner's lock is removed once, by whichever process takes the right to.
import { createHash } from 'node:crypto'
import { readFileSync, rmSync, statSync } from 'node:fs'
import { processIsAlive } from './process-alive.js'
import { writeWholeUnlessThere } from './write-whole.js'

// How old a take-over's marker is before it counts as left by a process that died in those microseconds.
export const ABANDONED_TAKEOVER_MS = 10_000

/** When process `pid` started, in clock ticks since boot (Linux), or undefined where that cannot be read. */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // after the command name, which may hold spaces and parentheses: the fields from the third on
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
  } catch {
    return undefined
  }
}

/** This process's lock content: `pid start-time`, or `pid` where the start time cannot be read. */
export function ownLockContent(): string {
  const started = processStartTime(process.pid)
  return started === undefined ? String(process.pid) : `${process.pid} ${started}`
}

/** The owner a lock's content names: its pid (NaN when the content is none) and its start time if given. */
export function lockOwner(content: string): { pid: number; started: string | undefined } {
  const [pidText = '', started] = content.trim().split(' ')
  return { pid: Number(pidText), started }
}

/** Whether the lock's owner runs: its pid is alive and, where both are known, started when the lock says. */
export function lockOwnerRuns(owner: number, started: string | undefined): boolean {
  if (!processIsAlive(owner)) return false
  const now = started === undefined ? undefined : processStartTime(owner)
  return now === undefined || now === started
}

/** A file's content, or undefined when it is not there. */
export function readIfThere(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw error
  }
}

/**
 * Removes the stale lock `seen`, once. Of processes that all found it stale, the later ones removed the lock the
 * first had taken meanwhile, and several went on as its owner. The right to remove it is a marker named after its
 * content, which one process at a time creates: the holder removes the lock if it still reads `seen` (no one else may
 * remove that one, and once removed it never comes back), then the marker. False when another process holds the
 * marker (one older than ABANDONED_TAKEOVER_MS, left by a process that died in the take-over, is removed for the next try).
 */
export function removeStaleLock(lockFile: string, seen: string, mine: string): boolean {
  const marker = `${lockFile}.${createHash('sha256').update(seen).digest('hex').slice(0, 16)}.takeover`
  if (!writeWholeUnlessThere(marker, mine)) {
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

/** Waits `ms` on this thread (a lock's take-over is synchronous, at a start). */
export function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)
}
