// Embedded PGlite writes its files through Node's fs: a new database is unpacked with the modes of its
// archive (0666 files), and later files (WAL segments, new relations) get the process umask. Whatever
// umask the process was started with, a directory PGlite owns is made private: the umask is 077 while an
// embedded database is open, so files created meanwhile are 0600 and directories 0700, and what exists
// (unpacked, or left by an earlier run) is tightened the same way.
import { chmodSync, lstatSync, mkdirSync, readdirSync } from 'node:fs'
import path from 'node:path'

// the embedded databases open now, and the umask the process had before the first
let holders = 0
let umaskBefore: number | undefined

/**
 * Makes the umask 077 until the returned function is called (the database's close): the umask the process had
 * comes back once no embedded database is open, for a process that embeds the service (the tests, a tool).
 */
export function holdPrivateUmask(): () => void {
  try {
    const previous = process.umask(0o077)
    if (holders === 0) umaskBefore = previous
  } catch (error) {
    // worker threads cannot change the umask; makeDirectoryPrivate still covers what exists now
    if ((error as NodeJS.ErrnoException).code !== 'ERR_WORKER_UNSUPPORTED_OPERATION') throw error
    return () => {}
  }
  holders += 1
  let held = true
  return () => {
    if (!held) return
    held = false
    holders -= 1
    if (holders === 0 && umaskBefore !== undefined) process.umask(umaskBefore)
  }
}

/** Creates `directory` (0700) if it is missing, and sets it and everything in it to 0700 directories and 0600 files. */
export function makeDirectoryPrivate(directory: string): void {
  mkdirSync(directory, { recursive: true, mode: 0o700 })
  tightenEntry(directory)
}

function tighten(entry: string): void {
  try {
    tightenEntry(entry)
  } catch (error) {
    const { code } = error as NodeJS.ErrnoException
    // removed while we walk; or another user's entry (root's, an operator's) that this process can neither read
    // nor change: the directory above it is private already (0700, ours), so no other user reaches it through
    // here. It is not the database's, or the database's start names it; refusing the start over it stopped a
    // service whose database is intact with a bare "EACCES: permission denied, scandir"
    if (code !== 'ENOENT' && code !== 'EACCES' && code !== 'EPERM') throw error
  }
}

function tightenEntry(entry: string): void {
  const stats = lstatSync(entry)
  if (stats.isSymbolicLink()) return // chmod would change the target, which may lie elsewhere
  if (stats.isDirectory()) {
    if ((stats.mode & 0o777) !== 0o700) chmodSync(entry, 0o700)
    for (const name of readdirSync(entry)) tighten(path.join(entry, name))
  } else if ((stats.mode & 0o777 & ~0o600) !== 0) {
    chmodSync(entry, stats.mode & 0o600)
  }
}
