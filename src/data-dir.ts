// DATA_DIR is checked before anything is written to it, so that a directory the service cannot use stops it
// at once with its real reason. Node's recursive mkdir reports a parent on a read-only file system as
// ENOENT ("no such file or directory"), which sent an operator looking for a missing path; the reason is
// found by creating the first missing directory on its own.
import { accessSync, constants, mkdirSync, statSync } from 'node:fs'
import { userInfo } from 'node:os'
import path from 'node:path'
import { ConfigError } from './config-error.js'
import { quoteForShell } from './quote-for-shell.js'

const REASONS: Record<string, string> = {
  EROFS: 'its file system is read-only',
  EACCES: 'permission denied to this user',
  EPERM: 'permission denied to this user',
  ENOTDIR: 'a file is in the way (not a directory)',
  EEXIST: 'a file is in the way (not a directory)',
  ENOSPC: 'no space left on its device',
  EDQUOT: 'the disk quota is used up',
  ELOOP: 'a symbolic link loop is in the way',
  ENAMETOOLONG: 'the path is too long',
}

/** Why a write into `directory` failed, in the words dataDirProblem uses; undefined for an error no such reason covers. */
export function dataDirWriteProblem(directory: string, error: unknown): string | undefined {
  const code = (error as NodeJS.ErrnoException | undefined)?.code
  return code !== undefined && REASONS[code] !== undefined ? `${directory} cannot be written: ${REASONS[code]} (${code})` : undefined
}

/**
 * Runs `write` into DATA_DIR: a failure such as a full disk is said as DATA_DIR's problem (a ConfigError: exit 2)
 * rather than a bare ENOSPC; any other error is thrown as it is.
 */
export function writingIntoDataDir<T>(dataDir: string, write: () => T): T {
  try {
    return write()
  } catch (error) {
    const problem = dataDirWriteProblem(dataDir, error)
    if (problem) throw new ConfigError([`DATA_DIR: ${problem}; free space or set DATA_DIR to a directory this user can write`])
    throw error
  }
}

/**
 * Creates `directory` (mode 0700) if it is missing, and says why it cannot be used when it cannot (it cannot
 * be created, is not a directory, or this user cannot write into it); undefined when it can.
 */
export function dataDirProblem(directory: string): string | undefined {
  try {
    mkdirSync(directory, { recursive: true, mode: 0o700 })
    if (!statSync(directory).isDirectory()) return `${directory} is ${REASONS.ENOTDIR}`
    accessSync(directory, constants.W_OK | constants.X_OK)
    return undefined
  } catch (error) {
    const code = realCause(directory, error)
    return `${directory} cannot be used: ${REASONS[code] ?? code} (${code})`
  }
}

// the code of the first step that fails when each missing directory is created on its own
function realCause(directory: string, error: unknown): string {
  const code = (error as NodeJS.ErrnoException).code ?? 'unknown error'
  if (code !== 'ENOENT') return code
  const missing: string[] = []
  for (let current = path.resolve(directory); ; current = path.dirname(current)) {
    try {
      statSync(current)
      break
    } catch {
      missing.unshift(current)
      if (path.dirname(current) === current) break
    }
  }
  for (const step of missing) {
    try {
      mkdirSync(step, { mode: 0o700 })
    } catch (stepError) {
      return (stepError as NodeJS.ErrnoException).code ?? code
    }
  }
  return code
}

/** Who owns `file`, as a message names them: root, or a uid. */
export function ownerOf(file: string): string {
  try {
    const uid = statSync(file).uid
    return uid === 0 ? 'root' : `uid ${uid}`
  } catch {
    return 'another user'
  }
}

/**
 * What a file of DATA_DIR that this user cannot read or write is, and what to do: a run as another user (a `sudo npm
 * start` once) leaves files of theirs, and the next start as oneself met them as damaged or unreadable.
 */
export function leftByAnotherUser(dataDir: string, files: number): string {
  const me = userInfo().username
  return `a run as another user (sudo npm start?) left ${files === 1 ? 'it' : 'them'}. Give ${files === 1 ? 'it' : 'them'} back and start again: sudo chown -R ${quoteForShell(me)} ${quoteForShell(dataDir)}`
}
