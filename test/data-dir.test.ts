// A DATA_DIR the service cannot write stops `serve` and the CLI before anything starts, with exit 2 and the
// directory's real reason (src/data-dir.ts). A read-only file system used to be reported as "ENOENT: no such
// file or directory, mkdir", Node's recursive mkdir's word for it, after the listener had opened.
import { spawnSync } from 'node:child_process'
import { chownSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { childEnv, receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const scratch = mkdtempSync(path.join(tmpdir(), 'data-dir-'))
// a read-only file system of the test's own: mounting one needs root (CI runs as root; skipped otherwise)
const readOnly = path.join(scratch, 'read-only')
const canMountReadOnly = (() => {
  spawnSync('mkdir', ['-p', readOnly])
  return spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m,ro', 'tmpfs', readOnly]).status === 0
})()

// a user to run as beside root: nobody (running as another user needs root; skipped otherwise), who must be able
// to reach the compiled CLI too: a checkout in a directory only its owner may enter (`mktemp -d` makes them 0700)
// cannot be run by nobody, and the test is skipped there rather than failing on a CLI that never started
const NOBODY = 65534
const asNobodyArgs = [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups']
const nobodyReadsCli = `require('node:fs').accessSync(${JSON.stringify(path.resolve('dist/src/cli.js'))}, require('node:fs').constants.R_OK)`
const canRunAsNobody =
  process.getuid?.() === 0 && spawnSync('setpriv', [...asNobodyArgs, process.execPath, '-e', nobodyReadsCli]).status === 0

afterAll(() => {
  if (canMountReadOnly) spawnSync('umount', ['-l', readOnly])
  rmSync(scratch, { recursive: true, force: true })
})

const localMode = (dataDir: string) => ({ DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', SANDBOX_PORT: '0' })
const refusal = (directory: string, reason: string) =>
  `Invalid configuration [config_invalid]\n  - DATA_DIR: ${directory} cannot be used: ${reason}; set DATA_DIR to a directory this user can write\n`

/** The `start-up failed` line among serve's JSON log lines. */
const startUpFailure = (stdout: string) =>
  stdout
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as { msg: string; err?: { message: string } })
    .find((line) => line.msg === 'start-up failed')

describe('a DATA_DIR the service cannot write', () => {
  it('a file in the way: serve (local mode and embedded database) and a CLI command exit 2 naming it', async () => {
    const file = path.join(scratch, 'a-file')
    writeFileSync(file, 'not a directory')
    const directory = path.join(file, 'data')
    const reason = 'a file is in the way (not a directory) (ENOTDIR)'
    for (const [args, env] of [
      [['serve'], localMode(directory)],
      [['serve'], receiverEnv(directory)],
      [['orders', 'list'], receiverEnv(directory)],
    ] as const) {
      const result = await runCli([...args], env)
      expect({ code: result.code, stderr: result.stderr, stdout: result.stdout }, args.join(' ')).toEqual({
        code: 2,
        stderr: refusal(directory, reason),
        stdout: '',
      })
    }
  })

  it('an embedded database whose files are damaged: serve exits 1 saying so and what to do', async () => {
    // made and migrated (as by a first start), then its control file is lost
    const directory = migratedDataDir('data-dir-damaged-')
    rmSync(path.join(directory, 'pglite', 'global', 'pg_control'))
    const result = await runCli(['serve'], receiverEnv(directory))
    expect(result.code).toBe(1)
    const failed = startUpFailure(result.stdout)
    expect(failed?.err?.message).toMatch(
      new RegExp(
        `^Migration \\(before any migration ran\\) failed: the embedded database could not start from ${path.join(directory, 'pglite')} \\(.+\\): ` +
          'its files may be damaged or written by another version; restore DATA_DIR from a backup, or move it aside to start an empty one$',
      ),
    )
  })

  // found from outside: a `sudo npm start` left files of root's in DATA_DIR, and the user's next start said its files
  // "may be damaged" and advised restoring a backup
  it.skipIf(!canRunAsNobody)("files another user left (a run with sudo): serve says which and how to give them back, not 'damaged'", () => {
    const directory = migratedDataDir('data-dir-other-user-')
    spawnSync('chown', ['-R', `${NOBODY}:${NOBODY}`, directory])
    // the file a run as root wrote last
    chownSync(path.join(directory, 'pglite', 'global', 'pg_control'), 0, 0)
    const asNobody = (args: string[], env: Record<string, string>) =>
      spawnSync('setpriv', [...asNobodyArgs, process.execPath, path.resolve('dist/src/cli.js'), ...args], {
        env: childEnv(env),
        encoding: 'utf8',
        timeout: 60_000,
      })
    const result = asNobody(['serve'], receiverEnv(directory))
    expect(result.status).toBe(1)
    const failed = startUpFailure(result.stdout)
    expect(failed?.err?.message).toBe(
      `Migration (before any migration ran) failed: the embedded database could not start from ${path.join(directory, 'pglite')}: ` +
        `1 of its files cannot be read and written by this user (nobody), e.g. ${path.join('global', 'pg_control')} (owned by root): ` +
        `a run as another user (sudo npm start?) left it. Give it back and start again: sudo chown -R nobody ${directory}`,
    )

    // local mode's secrets, kept in a file of root's
    const secrets = path.join(directory, 'local-secrets.json')
    writeFileSync(secrets, '{}', { mode: 0o600 })
    const command = asNobody(['orders', 'list'], { DATA_DIR: directory })
    expect({ code: command.status, stderr: command.stderr }).toEqual({
      code: 2,
      stderr:
        `Invalid configuration [config_invalid]\n  - DATA_DIR: its local secrets file ${secrets} cannot be read by this user (owned by root): ` +
        `a run as another user (sudo npm start?) left it. Give it back and start again: sudo chown -R nobody ${directory}\n`,
    })
  })

  it.skipIf(!canMountReadOnly)('a read-only file system: exit 2 with that reason, not "no such file or directory"', async () => {
    for (const directory of [readOnly, path.join(readOnly, 'data', 'deeper')]) {
      for (const env of [localMode(directory), receiverEnv(directory)]) {
        const result = await runCli(['serve'], env)
        expect({ code: result.code, stderr: result.stderr }).toEqual({ code: 2, stderr: refusal(directory, 'its file system is read-only (EROFS)') })
      }
    }
  })
})
