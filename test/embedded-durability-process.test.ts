// The compiled `serve` on embedded PGlite on disk answers a delivery 200 only once its commit reached the disk:
// between the delivery's send and its answer, the process called fsync on a write-ahead log segment. Watched from
// outside with strace (the system calls themselves, as a power loss would find them). PGlite starts Postgres with
// fsync off and gives it a file system whose fsync does nothing: before, a commit and a CHECKPOINT made no fsync or
// fdatasync call at all, and an answered delivery lived in the operating system's cache only.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { childEnv, receiverEnv, waitForLogLine } from './helpers/cli-process.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const root = path.resolve(import.meta.dirname, '..')
// strace is a Debian package .ci/run installs; ptrace must be allowed (it is for root on these machines)
const canTrace = spawnSync('strace', ['-f', '-o', '/dev/null', 'true']).status === 0

interface Flush {
  /** Seconds since the epoch, with microseconds (strace -ttt). */
  atS: number
  file: string
}

/** The fsync and fdatasync calls strace wrote (`-y`: each descriptor's path), that returned 0. */
function flushes(traceFile: string): Flush[] {
  const calls: Flush[] = []
  for (const line of readFileSync(traceFile, 'utf8').split('\n')) {
    const call = /^\d+\s+(\d+\.\d+) f(?:data)?sync\(\d+<([^>]*)>\)\s+= 0/.exec(line)
    if (call) calls.push({ atS: Number(call[1]), file: call[2]! })
  }
  return calls
}

describe.skipIf(!canTrace)('the compiled serve on embedded PGlite on disk', () => {
  const directories: string[] = []
  const children: ChildProcess[] = []
  afterAll(() => {
    for (const child of children) child.kill('SIGKILL')
    for (const directory of directories) rmSync(directory, { recursive: true, force: true })
  })

  it('answers a delivery 200 after its commit was flushed to disk (an fsync of the write-ahead log between the send and the answer)', async () => {
    const directory = mkdtempSync(path.join(tmpdir(), 'durability-'))
    directories.push(directory)
    const traceFile = path.join(directory, 'trace')
    const dataDir = path.join(directory, 'data')
    const child = spawn(
      'strace',
      ['-f', '-y', '-ttt', '-e', 'trace=fsync,fdatasync', '-o', traceFile, process.execPath, path.join(root, 'dist/src/cli.js'), 'serve'],
      { cwd: root, env: childEnv(receiverEnv(dataDir)), stdio: 'pipe' },
    )
    children.push(child)
    const { url } = await waitForLogLine(child, 'service listening', 120_000)

    const windows: { sentS: number; answeredS: number }[] = []
    for (const status of ['created', 'funded', 'delivered']) {
      const body = JSON.stringify(tradePayload(`durable-${randomUUID()}`, status))
      const sentS = Date.now() / 1000
      const answer = await fetch(`${String(url)}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': randomUUID(), 'x-partner-signature': signBody(body) },
        body,
      })
      const answeredS = Date.now() / 1000
      expect(answer.status).toBe(200)
      windows.push({ sentS, answeredS })
    }
    // the service stopped as an operator stops it; strace ends with it, its lines written
    const service = Number(spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).stdout.trim().split('\n')[0])
    expect(service).toBeGreaterThan(0)
    const exited = once(child, 'exit')
    process.kill(service, 'SIGTERM')
    await exited

    const calls = flushes(traceFile)
    const walFlushes = calls.filter((call) => /\/pg_wal\/[0-9A-F]{24}$/.test(call.file))
    for (const { sentS, answeredS } of windows) {
      // the clock's milliseconds against strace's microseconds: a millisecond of slack on each side
      expect(walFlushes.filter((call) => call.atS >= sentS - 0.001 && call.atS <= answeredS + 0.001).length).toBeGreaterThanOrEqual(1)
    }
    // and the files written before the file system had its fsync (the new database's) were flushed at the start
    expect(calls.filter((call) => call.file.endsWith(`${path.sep}global${path.sep}pg_control`)).length).toBeGreaterThanOrEqual(1)
    expect(calls.filter((call) => /\/base\/\d+\/\d+$/.test(call.file)).length).toBeGreaterThan(100)
  })
})
