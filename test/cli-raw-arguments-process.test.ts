// An argument whose bytes are not UTF-8 (a Latin-1 terminal's `café`) was taken as Node decoded it, U+FFFD in
// place of the bytes: `orders create` made an order whose reference the operator never typed. The compiled CLI now
// reads the bytes back (/proc/self/cmdline) and refuses such an argument before anything runs: exit 2, nothing done.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { argumentNotUtf8 } from '../src/cli/raw-arguments.js'
import { childEnv, type CliResult } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')
const scratch = mkdtempSync(path.join(tmpdir(), 'raw-arguments-'))
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

/** The compiled CLI run by a shell, an argument with an octal escape written by printf: bytes, not Node's strings. */
async function runWithBytes(args: string[], env: Record<string, string>): Promise<CliResult> {
  const quoted = args.map((arg) => (arg.includes('\\') ? `"$(printf '${arg}')"` : `'${arg}'`)).join(' ')
  const child = spawn('sh', ['-c', `exec "$0" dist/src/cli.js ${quoted}`, process.execPath], { cwd: root, env: childEnv(env), stdio: 'pipe' })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  child.stderr.on('data', (chunk) => (stderr += chunk))
  const [code] = (await once(child, 'exit')) as [number | null]
  return { code, stdout, stderr }
}

describe('arguments whose bytes are not UTF-8', () => {
  it.skipIf(!existsSync('/proc/self/cmdline'))('are refused before anything runs: exit 2, the argument shown with the escape, no DATA_DIR made', async () => {
    const dataDir = path.join(scratch, 'latin1')
    const result = await runWithBytes(['orders', 'create', '--external-reference', 'caf\\351-1'], { DATA_DIR: dataDir })
    expect(result).toEqual({
      code: 2,
      stdout: '',
      stderr:
        'Argument 4 is not UTF-8 text: Node read it as "caf\\ufffd-1", each byte sequence that is not UTF-8 as \\ufffd. ' +
        'Nothing was done: give it in UTF-8 (set the terminal to UTF-8, e.g. LANG=C.UTF-8) [argument_not_utf8]\n',
    })
    expect(existsSync(dataDir)).toBe(false)
  })

  it.skipIf(!existsSync('/proc/self/cmdline'))('the same text in UTF-8 runs: the command says what it says of that reference', async () => {
    const dataDir = path.join(scratch, 'utf8')
    const result = await runWithBytes(['orders', 'show', 'caf\\303\\251-1'], { DATA_DIR: dataDir })
    // (after the note that a new embedded database is made in DATA_DIR)
    expect(result.stderr).toMatch(/\nNo order with external reference café-1 \[order_not_found\]\n$/)
    expect(result.code).toBe(1)
  })

  it('names the first such argument, hides a URL password, and says nothing where the bytes cannot be read', () => {
    const cmdline = (...parts: (string | Buffer)[]) => () => Buffer.concat(parts.flatMap((part) => [Buffer.from(part), Buffer.from([0])]))
    const url = 'postgres://app:s3cr\ufffdt@db/escrow'
    const raw = cmdline('node', '/app/dist/src/cli.js', 'migrate', '--database-url', Buffer.from([...Buffer.from('postgres://app:s3cr'), 0xff, ...Buffer.from('t@db/escrow')]))
    expect(argumentNotUtf8(['migrate', '--database-url', url], raw)).toMatch(/^Argument 3 is not UTF-8 text: Node read it as "postgres:\/\/app:\*\*\*@db\/escrow",/)
    // a genuine U+FFFD, typed in UTF-8, is the operator's own
    expect(argumentNotUtf8(['orders', 'show', 'a\ufffd'], cmdline('node', 'cli.js', 'orders', 'show', 'a\ufffd'))).toBeUndefined()
    expect(
      argumentNotUtf8(['show'], () => {
        throw Object.assign(new Error('ENOENT'), { code: 'ENOENT' })
      }),
    ).toBeUndefined()
    // the node binary's own path is not an argument of the command
    expect(argumentNotUtf8(['orders'], cmdline(Buffer.from([0x2f, 0xff]), 'cli.js', 'orders'))).toBeUndefined()
  })
})
