// Two compiled `serve` processes in local mode over one DATA_DIR, allowed on a shared Postgres (DATABASE_URL): both
// ran a sandbox over DATA_DIR/sandbox-state.json, handed out TRD-000001 to different trades, and the second's first
// snapshot was written over the first's journal, so a restart lost one service's trades. The second is refused at
// start: one line naming the file and the process that keeps it, ending in its code, exit 1. A lock left by a
// killed process does not refuse the next start, and a stop gives the lock back.
import { once } from 'node:events'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { tmpdir } from 'node:os'
import path from 'node:path'
import type { ChildProcess } from 'node:child_process'
import { afterAll, expect, it } from 'vitest'
import { killLeftovers, runCli, signalAndClose, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'

/** What a `serve` wrote until it exited, or until it said it listens (then stopped): a start that was not refused. */
async function exitOrListening(child: ChildProcess): Promise<{ code: number | null | 'listening'; stdout: string; stderr: string }> {
  let stdout = ''
  let stderr = ''
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  const outcome = await new Promise<number | null | 'listening'>((resolve) => {
    child.stdout!.on('data', (chunk) => {
      stdout += chunk
      if (stdout.includes('"msg":"service listening"')) resolve('listening')
    })
    child.once('exit', (code) => resolve(code))
  })
  if (outcome === 'listening') await signalAndClose(child)
  else if (child.stdout!.readable) await once(child, 'close')
  return { code: outcome, stdout, stderr }
}
import { describePostgres, postgresUrl, withPostgresClient } from './helpers/test-database.js'

describePostgres('two local-mode services over one DATA_DIR (Postgres)', () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), 'sandbox-state-in-use-'))
  const schema = `sandbox_lock_${randomBytes(4).toString('hex')}`
  const children: ChildProcess[] = []
  afterAll(async () => {
    killLeftovers(children)
    rmSync(dataDir, { recursive: true, force: true })
    await withPostgresClient((client) => client.query(`drop schema if exists ${schema} cascade`))
  })

  const databaseUrl = () => {
    const url = new URL(postgresUrl!)
    url.searchParams.set('options', `-c search_path=${schema}`)
    return url.toString()
  }
  // local mode (no PARTNER_API_BASE_URL): each runs the sandbox, on a port of its own
  const env = () => ({ DATA_DIR: dataDir, DATABASE_URL: databaseUrl(), PORT: '0', ADMIN_PORT: '0', SANDBOX_PORT: '0', POLL_ENABLED: 'false' })
  const serve = async () => {
    const child = spawnCli(['serve'], env())
    children.push(child)
    await waitForLogLine(child, 'service listening')
    return child
  }

  it('refuses the second at start, naming the process that keeps the state; a killed one’s lock is taken over', async () => {
    await withPostgresClient((client) => client.query(`create schema ${schema}`))
    expect((await runCli(['migrate'], env())).code).toBe(0)
    const stateFile = path.join(dataDir, 'sandbox-state.json')

    const first = await serve()
    const starting = spawnCli(['serve'], env())
    children.push(starting)
    const second = await exitOrListening(starting)
    expect({ code: second.code, stderr: second.stderr }).toEqual({
      code: 1,
      stderr:
        `The sandbox state file ${stateFile} is in use by process ${first.pid} (another service or sandbox over this DATA_DIR): ` +
        'two sandboxes over one state would hand out the same trade references and write over each other’s trades. ' +
        'Stop that process, or give this one a DATA_DIR of its own [sandbox_state_in_use]\n',
    })
    expect(second.stdout).not.toContain('sandbox platform listening')

    // killed with no chance to give the lock back: the next start takes it over
    await stopChild(first, 'SIGKILL')
    expect(existsSync(`${stateFile}.lock`)).toBe(true)
    const third = await serve()
    expect((await signalAndClose(third)).code).toBe(0)
    expect(existsSync(`${stateFile}.lock`)).toBe(false)
  })
})
