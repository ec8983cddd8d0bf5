// An argument whose bytes are not UTF-8 (a Latin-1 terminal's `café`) was taken as Node decoded it, U+FFFD in
// place of the bytes: `orders create` made an order whose reference the operator never typed. The compiled CLI now
// reads the bytes back (/proc/self/cmdline) and refuses such an argument before anything runs: exit 2, nothing done.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { argumentNotUtf8, variablesNotUtf8 } from '../src/not-utf8.js'
import { childEnv, type CliResult } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const root = path.resolve(import.meta.dirname, '..')
const scratch = mkdtempSync(path.join(tmpdir(), 'raw-arguments-'))
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

/**
 * The compiled CLI run by a shell, an argument or a variable (`rawEnv`) with an octal escape written by printf:
 * bytes, not Node's strings.
 */
async function runWithBytes(args: string[], env: Record<string, string>, rawEnv: Record<string, string> = {}): Promise<CliResult> {
  const quoted = args.map((arg) => (arg.includes('\\') ? `"$(printf '${arg}')"` : `'${arg}'`)).join(' ')
  const assigned = Object.entries(rawEnv).map(([name, value]) => `${name}="$(printf '${value}')"`).join(' ')
  const child = spawn('sh', ['-c', `exec env ${assigned} "$0" dist/src/cli.js ${quoted}`, process.execPath], { cwd: root, env: childEnv(env), stdio: 'pipe' })
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
    const result = await runWithBytes(['orders', 'show', 'caf\\303\\251-1'], { DATA_DIR: migratedDataDir('raw-arguments-utf8-') })
    expect(result.stderr).toBe('No order with external reference café-1 [order_not_found]\n')
    expect(result.code).toBe(1)
  })

  it.skipIf(!existsSync('/proc/self/environ'))('a variable of the service whose bytes are not UTF-8 is a bad configuration: exit 2, its value not shown, no DATA_DIR made', async () => {
    const result = await runWithBytes(['orders', 'list'], {}, { DATA_DIR: `${scratch}/caf\\351`, PARTNER_API_SECRET: 's3cr\\377t-0123456789abcdef' })
    expect(result).toEqual({
      code: 2,
      stdout: '',
      stderr:
        'Invalid configuration [config_invalid]\n' +
        '  - DATA_DIR: is not UTF-8 text (Node read its bytes that are not as U+FFFD); give it in UTF-8\n' +
        '  - PARTNER_API_SECRET: is not UTF-8 text (Node read its bytes that are not as U+FFFD); give it in UTF-8\n',
    })
    expect(readdirSync(scratch).filter((name) => name.startsWith('caf'))).toEqual([])
  })

  it('reads the variables as the process started with them: one set since, or not the service’s, is left alone', () => {
    const environ = () => Buffer.concat([Buffer.from('DATA_DIR=/tmp/a'), Buffer.from([0xff, 0]), Buffer.from('OTHER=b'), Buffer.from([0xfe, 0]), Buffer.from('PORT=80\0')])
    expect(variablesNotUtf8(['DATA_DIR', 'PORT'], { DATA_DIR: '/tmp/a\ufffd', PORT: '80' }, environ)).toEqual(['DATA_DIR'])
    // set by the process since it started: its own
    expect(variablesNotUtf8(['DATA_DIR'], { DATA_DIR: '/tmp/b' }, environ)).toEqual([])
    expect(
      variablesNotUtf8(['DATA_DIR'], {}, () => {
        throw new Error('ENOENT')
      }),
    ).toEqual([])
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
