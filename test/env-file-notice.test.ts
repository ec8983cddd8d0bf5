// A `.env` beside the service is not read (the settings come from the environment only): the start says so,
// naming the variables it sets that the environment does not, never their values.
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { UNREAD_ENV_FILE_MESSAGE, unreadEnvFile } from '../src/env-file-notice.js'
import { childEnv, receiverEnv, signalAndClose, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const root = path.resolve(import.meta.dirname, '..')
const directories: string[] = []
afterAll(() => {
  for (const directory of directories) rmSync(directory, { recursive: true, force: true })
})

function directoryWith(envFile: string | undefined): string {
  const directory = mkdtempSync(path.join(tmpdir(), 'env-file-'))
  directories.push(directory)
  if (envFile !== undefined) writeFileSync(path.join(directory, '.env'), envFile)
  return directory
}

describe('a .env file the service does not read', () => {
  it('names the variables it sets that the environment does not, in its order, once each', () => {
    const directory = directoryWith(
      '# a comment\nPARTNER_API_BASE_URL=https://platform.example\n  export ADMIN_TOKEN="quoted value"\nPORT=3000\n\nnot an assignment\nPARTNER_API_BASE_URL=again\r\nLOG_LEVEL=\r\n',
    )
    expect(unreadEnvFile(directory, { PORT: '3000' })).toEqual({
      file: path.join(directory, '.env'),
      names: ['PARTNER_API_BASE_URL', 'ADMIN_TOKEN', 'LOG_LEVEL'],
    })
  })

  it('says nothing when there is none, or the environment sets all it names', () => {
    expect(unreadEnvFile(directoryWith(undefined), {})).toBeUndefined()
    expect(unreadEnvFile(directoryWith('PORT=3000\nHOST=127.0.0.1\n'), { PORT: '4000', HOST: '0.0.0.0' })).toBeUndefined()
  })

  it('is named in a warning when `serve` starts from its directory, without the values', async () => {
    const directory = directoryWith(`FORWARD_URL=http://127.0.0.1:9/secret-path\nexport REACTION_CONCURRENCY=8\nPORT=3000\n`)
    const child = spawn(process.execPath, [path.join(root, 'dist/src/cli.js'), 'serve'], {
      cwd: directory,
      // a migrated copy: a first start's initdb took over 30 s on a loaded machine
      env: childEnv(receiverEnv(migratedDataDir('env-file-data-'))),
      stdio: 'pipe',
    })
    let output = ''
    child.stdout!.on('data', (chunk) => (output += chunk))
    child.stderr!.on('data', (chunk) => (output += chunk))
    try {
      const warning = await waitForLogLine(child, UNREAD_ENV_FILE_MESSAGE)
      // PORT is set by the environment (0), so it is not among those the file would have set
      expect(warning).toMatchObject({ level: 40, file: path.join(directory, '.env'), notSet: ['FORWARD_URL', 'REACTION_CONCURRENCY'] })
      await waitForLogLine(child, 'service listening')
    } finally {
      await signalAndClose(child)
    }
    expect(output).not.toContain('secret-path')
  })

  // a command run from the directory of a .env took the defaults without a word: `prune` ran on the default retention
  // and, with DATABASE_URL in the file, on an embedded database beside it
  it('is named on stderr when a command runs from its directory, without the values; the command still runs', () => {
    const directory = directoryWith('PRUNE_BATCH_SIZE=50\nADMIN_TOKEN=a-token-not-to-show-000000\n')
    const result = spawnSync(process.execPath, [path.join(root, 'dist/src/cli.js'), 'orders', 'list'], {
      cwd: directory,
      env: childEnv({ DATA_DIR: migratedDataDir('env-file-command-') }),
      encoding: 'utf8',
      timeout: 30_000,
    })
    expect(result.status).toBe(0)
    expect(result.stderr).toBe(
      'Warning: a .env file is in the working directory and is not read (it sets PRUNE_BATCH_SIZE, ADMIN_TOKEN): ' +
        'commands take their settings from the environment only; load it with `set -a; . ./.env; set +a` first\n',
    )
    expect(result.stdout).not.toContain('a-token-not-to-show')
  })

  // found from outside: Node's --env-file keeps a byte-order mark as part of the first name, so a DATABASE_URL on the
  // first line of a file saved with one was not set, and the service started on a new embedded database
  it('stops `serve` loaded with --env-file from a file saved with a byte-order mark, naming the variable it lost', () => {
    const dataDir = migratedDataDir('env-file-bom-')
    const env = receiverEnv(dataDir)
    const directory = directoryWith(`\uFEFFDATABASE_URL=postgres://127.0.0.1:9/unused\n${Object.entries(env).map(([name, value]) => `${name}=${value}`).join('\n')}\n`)
    const result = spawnSync(process.execPath, ['--env-file=.env', path.join(root, 'dist/src/cli.js'), 'serve'], {
      cwd: directory,
      env: childEnv({}),
      encoding: 'utf8',
      timeout: 30_000,
    })
    expect(result.status).toBe(2)
    expect(result.stdout + result.stderr).toContain('DATABASE_URL: is not set: the env file it is in starts with a byte-order mark (BOM)')
  })
})
