// Every refusal of the command line ends in a code in brackets, as a failed command's does: commander's own
// (`error: unknown option '--colour'`), a bad value the project's own checks refuse (`Invalid request: …`), options
// that do not go together (`Give exactly one of …`), a --file that cannot be read, and a stdout that cannot be
// written ended with no code at all, and a script could not tell them from one another. `help orders list` showed the
// help of `orders`, and `help bogus` the program's help with no refusal. Run through the compiled CLI, as an
// operator runs it.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, openSync, closeSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { childEnv, type CliResult, receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const root = path.resolve(import.meta.dirname, '..')
const scratch = mkdtempSync(path.join(tmpdir(), 'refusal-codes-'))
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

const HINT = '(run with --help for usage)\n'
const cli = (args: string[], env: Record<string, string> = { DATA_DIR: path.join(scratch, 'data') }) => runCli(args, env)

/** `args` with stdout on /dev/full, where every write fails with ENOSPC. */
async function onFullStdout(args: string[]): Promise<CliResult> {
  const full = openSync('/dev/full', 'w')
  try {
    const child = spawn(process.execPath, [path.join(root, 'dist/src/cli.js'), ...args], {
      cwd: root,
      env: childEnv({ DATA_DIR: path.join(scratch, 'data') }),
      stdio: ['ignore', full, 'pipe'],
    })
    let stderr = ''
    child.stderr!.on('data', (chunk) => (stderr += chunk))
    const [code] = (await once(child, 'exit')) as [number | null]
    return { code, stdout: '', stderr }
  } finally {
    closeSync(full)
  }
}

describe('a refusal of the command line ends in its code', () => {
  it.each([
    ['an unknown option', ['orders', 'list', '--colour'], "error: unknown option '--colour'"],
    ['a missing argument', ['orders', 'show'], "error: missing required argument 'external-reference'"],
    ['a missing required option', ['orders', 'create'], "error: required option '--external-reference <ref>' not specified"],
    ['an excess argument', ['orders', 'list', 'extra'], "error: too many arguments for 'list'. Expected 0 arguments but got 1."],
    [
      'a value out of its choices',
      ['sandbox', '--milestone-answer', 'both'],
      "error: option '--milestone-answer <record>' argument 'both' is invalid. Allowed choices are trade, milestone.",
    ],
    ['a bad value', ['orders', 'list', '--limit', 'x'], "error: option '--limit <n>' argument 'x' is invalid. must be a whole number from 1 to 10000"],
  ])('commander’s refusal of %s: [invalid_arguments], exit 2', async (_, args, line) => {
    expect(await cli(args)).toEqual({ code: 2, stdout: '', stderr: `${line} [invalid_arguments]\n${HINT}` })
  })

  it('an unknown command: [unknown_command], exit 2, its suggestion on a line of its own', async () => {
    expect(await cli(['frobnicate'])).toEqual({ code: 2, stdout: '', stderr: `error: unknown command 'frobnicate' [unknown_command]\n${HINT}` })
    expect(await cli(['order'])).toEqual({
      code: 2,
      stdout: '',
      stderr: `error: unknown command 'order' [unknown_command]\n(Did you mean orders?)\n${HINT}`,
    })
  })

  it('options that do not go together: [invalid_arguments], exit 2', async () => {
    expect(await cli(['proposals', 'respond', 'order-1', 'prp_1', '--party', 'buyer'])).toEqual({
      code: 2,
      stdout: '',
      stderr: 'Give exactly one of --accept or --reject [invalid_arguments]\n',
    })
  })

  it('a --file that cannot be read: [file_unreadable], exit 2', async () => {
    const file = path.join(scratch, 'nope.json')
    expect(await cli(['webhook', 'sign', '--file', file, '--secret', 'whsec_test'])).toEqual({
      code: 2,
      stdout: '',
      stderr: `Cannot read --file ${file}: ENOENT: no such file or directory, open '${file}' [file_unreadable]\n`,
    })
  })

  it('a request the platform client refuses before sending it: [invalid_arguments], exit 2', async () => {
    const dataDir = migratedDataDir('refusal-codes-request-')
    const result = await cli(['trades', 'open', 'order-1', '--title', 'Lamp', '--amount', '-1', '--currency', 'EUR', '--seller', 's_1'], receiverEnv(dataDir))
    expect(result).toEqual({ code: 2, stdout: '', stderr: 'Invalid request: amount: must be a decimal amount such as "12.50" [invalid_arguments]\n' })
  })

  it('a stdout that cannot be written: [stdout_failed], exit 1', async () => {
    expect(await onFullStdout(['orders', '--help'])).toEqual({
      code: 1,
      stdout: '',
      stderr: 'could not write to stdout (ENOSPC): what follows on it is lost [stdout_failed]\n',
    })
  })
})

describe('help for a command', () => {
  it('of a group’s subcommand: `help orders list` prints the help of `orders list`, exit 0', async () => {
    const result = await cli(['help', 'orders', 'list'])
    expect({ code: result.code, stderr: result.stderr }).toEqual({ code: 0, stderr: '' })
    expect(result.stdout).toMatch(/^Usage: partner-escrow orders list \[options\]\n/)
    // and as the group's own help command
    expect((await cli(['orders', 'help', 'list'])).stdout).toBe(result.stdout)
  })

  it('of no command: [unknown_command], exit 2, and no help printed', async () => {
    expect(await cli(['help', 'bogus'])).toEqual({ code: 2, stdout: '', stderr: `error: unknown command 'bogus' [unknown_command]\n${HINT}` })
    expect(await cli(['help', 'orders', 'bogus'])).toEqual({
      code: 2,
      stdout: '',
      stderr: `error: unknown command 'orders bogus' [unknown_command]\n${HINT}`,
    })
    expect(await cli(['orders', 'help', 'bogus'])).toEqual({
      code: 2,
      stdout: '',
      stderr: `error: unknown command 'orders bogus' [unknown_command]\n${HINT}`,
    })
  })

  // commander's refusal of a mistyped command suggests the closest; the help command's gave none
  it('of a mistyped command: its suggestion, as a mistyped command line gets', async () => {
    expect(await cli(['help', 'ordrs'])).toEqual({
      code: 2,
      stdout: '',
      stderr: `error: unknown command 'ordrs' [unknown_command]\n(Did you mean orders?)\n${HINT}`,
    })
    expect((await cli(['help', 'reactions', 'relase-stream'])).stderr).toBe(
      `error: unknown command 'reactions relase-stream' [unknown_command]\n(Did you mean release-stream?)\n${HINT}`,
    )
  })
})

describe('a group of commands named alone', () => {
  // `orders` printed the group's help to stderr, exit 2, and nothing said what was wrong, nor with a code
  it('prints its help to stderr, then the refusal with its code, exit 2', async () => {
    const result = await cli(['orders'])
    expect({ code: result.code, stdout: result.stdout }).toEqual({ code: 2, stdout: '' })
    expect(result.stderr).toMatch(/^Usage: partner-escrow orders \[options\] \[command\]\n/)
    expect(result.stderr.endsWith("\nerror: missing command: 'orders' takes one of create, show, list [invalid_arguments]\n")).toBe(true)
    // asked for, the help is no refusal
    expect(await cli(['orders', '--help'])).toMatchObject({ code: 0, stderr: '' })
    expect((await cli(['help', 'orders'])).stdout).not.toContain('missing command')
  })
})
