// Secrets given in files: `WEBHOOK_SECRETS_FILE=/run/secrets/webhook` in place of WEBHOOK_SECRETS, as Docker secrets,
// Kubernetes secret volumes and systemd credentials hand them over (and as the official Postgres image reads
// POSTGRES_PASSWORD_FILE). The file's content is the value, one line ending removed (a file made with `echo`); the
// value then gets every check the variable's own would (config.ts). What goes wrong is said by the variable, the path
// and the reason, never by what the file holds.
import { closeSync, fstatSync, openSync, readSync, statSync } from 'node:fs'
import { printable } from './printable.js'
import { shortened } from './shortened.js'

/** The suffix of the variable that names a file holding another's value. */
export const FILE_SUFFIX = '_FILE'

/**
 * The most of a secret file read: far more than any secret or URL, and a path given by mistake (a log file,
 * /dev/zero, /dev/urandom) is refused there instead of read into memory without end.
 */
export const MAX_SECRET_FILE_BYTES = 64 * 1024

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })
const BYTE_ORDER_MARK = '\uFEFF'

export type SecretFileRead = { value: string } | { problem: string }

/** A path as a message shows it: on one line, its controls escaped, and not without end. */
export function shownPath(file: string): string {
  return printable(shortened(file, 200))
}

/**
 * The value a secret file holds, or why it cannot be had (the reason alone: the caller names the variable and the
 * path). One trailing line ending (`\n` or `\r\n`) is removed; nothing else is.
 */
export function readSecretFile(file: string): SecretFileRead {
  let descriptor: number
  try {
    descriptor = openSync(file, 'r')
  } catch (error) {
    return { problem: openFailure(error as NodeJS.ErrnoException, file) }
  }
  let bytes: Buffer
  try {
    if (fstatSync(descriptor).isDirectory()) return { problem: 'is a directory, not a file' }
    // read in parts up to one byte past the bound: a pipe or a device says nothing of its size beforehand
    const buffer = Buffer.alloc(MAX_SECRET_FILE_BYTES + 1)
    let length = 0
    for (;;) {
      const read = readSync(descriptor, buffer, length, buffer.length - length, null)
      if (read === 0) break
      length += read
      if (length > MAX_SECRET_FILE_BYTES) return { problem: `is larger than ${MAX_SECRET_FILE_BYTES / 1024} KiB: a secret file holds the value alone` }
    }
    bytes = buffer.subarray(0, length)
  } catch (error) {
    return { problem: `cannot be read (${(error as NodeJS.ErrnoException).code ?? 'error'})` }
  } finally {
    closeSync(descriptor)
  }
  let text: string
  try {
    text = utf8.decode(bytes)
  } catch {
    return { problem: 'is not UTF-8 text: save it in UTF-8' }
  }
  if (text.startsWith(BYTE_ORDER_MARK)) return { problem: 'begins with a byte-order mark (BOM), which would be read as part of the value: save it as UTF-8 without a BOM' }
  const value = text.endsWith('\r\n') ? text.slice(0, -2) : text.endsWith('\n') ? text.slice(0, -1) : text
  if (value === '') return { problem: text === '' ? 'is empty' : 'holds nothing but a line ending' }
  return { value }
}

function openFailure(error: NodeJS.ErrnoException, file: string): string {
  switch (error.code) {
    case 'ENOENT':
      return 'does not exist'
    case 'EACCES':
    case 'EPERM':
      return `cannot be read by this user (uid ${process.getuid?.() ?? '?'}): permission denied${ownerAndMode(file)}`
    case 'ENOTDIR':
      return 'does not exist (a part of its path is a file, not a directory)'
    case 'ELOOP':
      return 'cannot be read: its symbolic links loop'
    case 'EISDIR':
      return 'is a directory, not a file'
    default:
      return `cannot be opened (${error.code ?? 'error'})`
  }
}

// whose the file is, where it can be seen: a secret mounted from the host keeps the host's owner and mode, which the
// container's user (the image's `node`, uid 1000) may not be able to read
function ownerAndMode(file: string): string {
  try {
    const { uid, mode } = statSync(file)
    return ` (owned by uid ${uid}, mode ${(mode & 0o777).toString(8).padStart(4, '0')})`
  } catch {
    return ''
  }
}

export interface SecretsFromFiles {
  /** The environment with each value read from a file set under its variable's name. */
  readonly env: Record<string, string | undefined>
  /** The variables whose value came from a file, with the file's path as given. */
  readonly fromFiles: ReadonlyMap<string, string>
  /** Why a file could not be used, or a variable given both ways: by variable and path, never the content. */
  readonly problems: readonly string[]
}

/**
 * `env` with every `NAME_FILE` among `names` read into NAME. A variable set to the empty string sets nothing, as
 * everywhere in the configuration. NAME and NAME_FILE both set is refused: which one was meant cannot be told.
 */
export function secretsFromFiles(
  env: Record<string, string | undefined>,
  names: readonly string[],
  {
    read = readSecretFile,
    pathProblem = () => undefined,
    bothSetHint = () => '',
  }: {
    read?: (file: string) => SecretFileRead
    /** Why a NAME_FILE's path as set cannot be meant (a carriage return an env file slipped in), or undefined. */
    pathProblem?: (name: string, path: string) => string | undefined
    /** Words added to the refusal of NAME and NAME_FILE both set: where the other may come from. */
    bothSetHint?: (name: string) => string
  } = {},
): SecretsFromFiles {
  const given = (name: string) => env[name] !== undefined && env[name] !== ''
  const resolved: Record<string, string | undefined> = { ...env }
  const fromFiles = new Map<string, string>()
  const problems: string[] = []
  for (const name of names) {
    const fileName = `${name}${FILE_SUFFIX}`
    if (!given(fileName)) continue
    const file = env[fileName]!
    if (given(name)) {
      problems.push(`${name} and ${fileName}: both are set; give the value one way, in ${name} or in the file ${fileName} names, and unset the other${bothSetHint(name)}`)
      continue
    }
    const badPath = pathProblem(fileName, file)
    if (badPath !== undefined) {
      problems.push(badPath)
      continue
    }
    const outcome = read(file)
    if ('problem' in outcome) {
      problems.push(`${fileName}: the file ${shownPath(file)} ${outcome.problem}`)
      continue
    }
    resolved[name] = outcome.value
    fromFiles.set(name, file)
  }
  return { env: resolved, fromFiles, problems }
}

/**
 * A configuration problem about a variable whose value came from a file, said with the file: `WEBHOOK_SECRETS: secret
 * #1 is shorter …` becomes `WEBHOOK_SECRETS (from WEBHOOK_SECRETS_FILE=/run/secrets/webhook): secret #1 is shorter …`.
 */
export function namingTheFile(problem: string, fromFiles: ReadonlyMap<string, string>): string {
  const at = problem.indexOf(':')
  const name = at > 0 ? problem.slice(0, at) : ''
  const file = fromFiles.get(name)
  if (file === undefined) return problem
  return `${name} (from ${name}${FILE_SUFFIX}=${shownPath(file)})${problem.slice(at)}`
}
