// A file written whole under a temporary name (mode 0600) and linked into place, which fails if one is there: no
// other process ever reads it half-written, and of processes writing it at once exactly one does. The embedded
// database's lock and the local-mode secrets are made so.
import { randomBytes } from 'node:crypto'
import { linkSync, unlinkSync, writeFileSync } from 'node:fs'

/** Writes `content` to `file` unless a file is there already; true when this call wrote it. */
export function writeWholeUnlessThere(file: string, content: string): boolean {
  const temporary = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`
  try {
    writeFileSync(temporary, content, { mode: 0o600 })
    linkSync(temporary, file)
    return true
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false
    throw error
  } finally {
    // also when the write failed part way (a full disk): each try left an empty temporary file behind
    removeIfThere(temporary)
  }
}

/** Removes `file`; one that is not there (never created) is no error. */
export function removeIfThere(file: string): void {
  try {
    unlinkSync(file)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error
  }
}
