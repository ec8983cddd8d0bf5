// Arguments and environment variables as the operator's terminal sent them. Node decodes the command line as UTF-8
// and puts U+FFFD where the bytes are not UTF-8 (a Latin-1 terminal's `café`), so `orders create caf\xe9-1` made an
// order `caf\ufffd-1`: a reference the operator never typed, and one no later command typed in the same terminal
// could name. On Linux the bytes are read back from /proc/self/cmdline, and such an argument is refused before
// anything runs; the service's variables likewise from /proc/self/environ (DATA_DIR=/tmp/caf\xe9 made a directory
// `caf\ufffd`). Elsewhere (no /proc) the command runs as Node decoded them.
import { readFileSync } from 'node:fs'
import { printable } from './printable.js'
import { shortened } from './shortened.js'
import { withoutPassword } from './without-password.js'

const utf8 = new TextDecoder('utf-8', { fatal: true })

/**
 * The refusal of the first of `args` (process.argv.slice(2)) whose bytes are not UTF-8, or undefined when every one
 * is, or when the bytes cannot be read (no /proc). `cmdline`: the process's command line as the kernel keeps it.
 */
export function argumentNotUtf8(args: readonly string[], cmdline: () => Buffer = () => readFileSync('/proc/self/cmdline')): string | undefined {
  let raw: Buffer
  try {
    raw = cmdline()
  } catch {
    return undefined
  }
  // the command's arguments are the last ones
  const parts = nulSeparated(raw)
  if (parts.length < args.length) return undefined
  const own = parts.slice(parts.length - args.length)
  for (const [index, bytes] of own.entries()) {
    try {
      utf8.decode(bytes)
    } catch {
      // where the bytes were replaced, shown as the escape
      const shown = printable(JSON.stringify(shortened(withoutPassword(args[index]!), 200))).replaceAll('\ufffd', '\\ufffd')
      return (
        `Argument ${index + 1} is not UTF-8 text: Node read it as ${shown}, each byte sequence that is not UTF-8 as \\ufffd. Nothing was ` +
        'done: give it in UTF-8 (set the terminal to UTF-8, e.g. LANG=C.UTF-8) [argument_not_utf8]'
      )
    }
  }
  return undefined
}

/**
 * The names among `names` of the environment variables whose bytes are not UTF-8, as the process was started with
 * them (a value the process set since is its own, and left out); none where they cannot be read (no /proc).
 */
export function variablesNotUtf8(
  names: readonly string[],
  env: NodeJS.ProcessEnv = process.env,
  environ: () => Buffer = () => readFileSync('/proc/self/environ'),
): string[] {
  let raw: Buffer
  try {
    raw = environ()
  } catch {
    return []
  }
  const wanted = new Set(names)
  const found: string[] = []
  for (const entry of nulSeparated(raw)) {
    const equals = entry.indexOf(0x3d)
    if (equals <= 0) continue
    const name = entry.subarray(0, equals).toString('latin1')
    if (!wanted.has(name)) continue
    const value = entry.subarray(equals + 1)
    try {
      utf8.decode(value)
    } catch {
      if (env[name] === value.toString('utf8')) found.push(name)
    }
  }
  return found
}

/** The parts of NUL-separated bytes, each ending with a NUL (the last may not). */
function nulSeparated(raw: Buffer): Buffer[] {
  const parts: Buffer[] = []
  for (let start = 0; start < raw.length; ) {
    const end = raw.indexOf(0, start)
    parts.push(raw.subarray(start, end < 0 ? raw.length : end))
    start = end < 0 ? raw.length : end + 1
  }
  return parts
}
