// A Postgres server of a test's own, for a setting the machine's shared server does not have and a test must not
// change there (max_prepared_transactions is 0 by default, and changing it needs a restart). The cluster is made
// with the installed server's initdb in a temporary directory and run as the `postgres` user (the server refuses
// root), on a free port of 127.0.0.1, trust authentication, its superuser named `root`. Undefined where it cannot be
// made (no server installed, not root, no `postgres` user): the caller skips.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'

export interface OwnPostgres {
  /** The `postgres` database as its superuser. */
  url: string
  stop: () => Promise<void>
}

const SERVER_VERSIONS = '/usr/lib/postgresql'

/** The newest installed server's bin directory, or undefined. */
function serverBin(): string | undefined {
  if (!existsSync(SERVER_VERSIONS)) return undefined
  const versions = readdirSync(SERVER_VERSIONS)
    .filter((version) => existsSync(path.join(SERVER_VERSIONS, version, 'bin', 'initdb')))
    .sort((a, b) => Number(b) - Number(a))
  return versions[0] === undefined ? undefined : path.join(SERVER_VERSIONS, versions[0], 'bin')
}

const setpriv = spawnSync('sh', ['-c', 'command -v setpriv'], { encoding: 'utf8' }).stdout.trim()
const asPostgres = ['--reuid', 'postgres', '--regid', 'postgres', '--init-groups', '--']

/** Whether this machine can run a server of a test's own. */
export const canRunOwnPostgres =
  process.getuid?.() === 0 && setpriv !== '' && serverBin() !== undefined && spawnSync(setpriv, [...asPostgres, 'true']).status === 0

async function freePort(): Promise<number> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const { port } = server.address() as { port: number }
  server.close()
  await once(server, 'close')
  return port
}

/** Starts a server with `settings` (name → value, as `-c name=value`); resolves once it takes connections. */
export async function startOwnPostgres(settings: Record<string, string>): Promise<OwnPostgres> {
  const bin = serverBin()
  if (!canRunOwnPostgres || bin === undefined) throw new Error('no Postgres server of its own can be run here')
  const directory = mkdtempSync(path.join(tmpdir(), 'own-postgres-'))
  spawnSync('chown', ['postgres:postgres', directory])
  const cluster = path.join(directory, 'data')
  const init = spawnSync(setpriv, [...asPostgres, path.join(bin, 'initdb'), '-D', cluster, '-U', 'root', '-A', 'trust', '--no-sync'], {
    encoding: 'utf8',
  })
  if (init.status !== 0) throw new Error(`initdb failed: ${init.stderr}`)
  const port = await freePort()
  const options = Object.entries({ listen_addresses: '127.0.0.1', unix_socket_directories: directory, fsync: 'off', ...settings })
  const server: ChildProcess = spawn(
    setpriv,
    [...asPostgres, path.join(bin, 'postgres'), '-D', cluster, '-p', String(port), ...options.flatMap(([name, value]) => ['-c', `${name}=${value}`])],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  )
  let output = ''
  server.stderr!.on('data', (chunk) => (output += chunk))
  const exited = once(server, 'exit')
  const url = `postgres://root@127.0.0.1:${port}/postgres`
  const stop = async () => {
    if (server.exitCode === null && server.signalCode === null) {
      server.kill('SIGINT') // fast shutdown
      await exited
    }
    rmSync(directory, { recursive: true, force: true })
  }
  // until it takes a connection (initdb's cluster starts in about a second), or gives up after 60 s
  for (const startedAt = Date.now(); ; ) {
    const client = new pg.Client({ connectionString: url })
    try {
      await client.connect()
      await client.end()
      return { url, stop }
    } catch (error) {
      await client.end().catch(() => {})
      if (server.exitCode !== null || Date.now() - startedAt > 60_000) {
        await stop()
        throw new Error(`the server of the test's own did not start: ${output}`, { cause: error })
      }
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
}
