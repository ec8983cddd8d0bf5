// The embedded database's start flushes its files to disk (src/db/pglite-worker.mjs, flushDatabase): one syncfs
// through coreutils' `sync --file-system`, and each file in turn where that command is missing. A file or directory
// in DATA_DIR the service cannot read (an operator's, root's) is passed over by the file-by-file flush: refusing the
// start over it would tell the operator to restore a database that is intact.
//
// The suite runs as root, which reads every file, so the service runs here as `nobody` (setpriv), with a PATH that
// holds no `sync`: the file-by-file flush is the one that runs.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { childEnv, killLeftovers, receiverEnv, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const root = path.resolve(import.meta.dirname, '..')
const NOBODY = '65534'
const asNobody = ['--reuid', NOBODY, '--regid', NOBODY, '--clear-groups', '--']
// root (to hand the directory to nobody and leave root's files in it) and util-linux's setpriv
const setpriv = spawnSync('sh', ['-c', 'command -v setpriv'], { encoding: 'utf8' }).stdout.trim()
// and nobody can run this Node and read the compiled service (a Node under /root, or a clone in a 0700 directory, is
// root's alone: then the test has nothing to run)
const canDropRoot =
  process.getuid?.() === 0 &&
  setpriv !== '' &&
  spawnSync(setpriv, [...asNobody, process.execPath, '-e', `require('node:fs').accessSync(${JSON.stringify(path.join(root, 'dist/src/cli.js'))})`]).status === 0

describe.skipIf(!canDropRoot)('the compiled serve starting on a DATA_DIR holding files it cannot read', () => {
  const directories: string[] = []
  const children: ChildProcess[] = []
  afterAll(() => {
    killLeftovers(children)
    for (const directory of directories) rmSync(directory, { recursive: true, force: true })
  })

  it('flushes the rest file by file where `sync` is missing, starts, and takes a delivery', async () => {
    const dataDir = migratedDataDir('start-flush-')
    spawnSync('chown', ['-R', `${NOBODY}:${NOBODY}`, dataDir])
    // root's, in the database's own directory and in a directory of its own: neither opens for nobody
    const cluster = path.join(dataDir, 'pglite')
    writeFileSync(path.join(cluster, 'root-notes.txt'), 'not the database\'s\n', { mode: 0o600 })
    const closed = path.join(cluster, 'root-only')
    mkdirSync(closed)
    writeFileSync(path.join(closed, 'inside.txt'), 'unseen\n')
    chmodSync(closed, 0o700)
    expect(spawnSync(setpriv, [...asNobody, 'cat', path.join(cluster, 'root-notes.txt')]).status).not.toBe(0)
    // a PATH with no `sync` in it (node is named by its path)
    const emptyPath = mkdtempSync(path.join(tmpdir(), 'no-sync-'))
    directories.push(emptyPath)
    chmodSync(emptyPath, 0o755)

    // (setpriv by its path: the child's PATH is the empty one)
    const child = spawn(setpriv, [...asNobody, process.execPath, path.join(root, 'dist/src/cli.js'), 'serve'], {
      cwd: root,
      env: { ...childEnv(receiverEnv(dataDir)), PATH: emptyPath, HOME: dataDir },
      stdio: 'pipe',
    })
    children.push(child)
    let stderr = ''
    child.stderr!.on('data', (chunk) => (stderr += chunk))
    const { url } = await waitForLogLine(child, 'service listening').catch((error: unknown) => {
      throw new Error(`the service did not start: ${stderr}`, { cause: error })
    })

    const body = JSON.stringify(tradePayload(`start-flush-${randomUUID()}`, 'created'))
    const answer = await fetch(`${String(url)}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': randomUUID(), 'x-partner-signature': signBody(body) },
      body,
    })
    expect(answer.status).toBe(200)
    expect((await fetch(`${String(url)}/readyz`)).status).toBe(200)

    const exited = once(child, 'exit')
    child.kill('SIGTERM')
    expect((await exited)[0]).toBe(0)
  })
})
