// The compiled `serve` on embedded PGlite on disk answers a delivery 200 only once its commit reached the disk:
// between the delivery's send and its answer, the process called fsync on a write-ahead log segment. Watched from
// outside with strace (the system calls themselves, as a power loss would find them). PGlite starts Postgres with
// fsync off and gives it a file system whose fsync does nothing: before, a commit and a CHECKPOINT made no fsync or
// fdatasync call at all, and an answered delivery lived in the operating system's cache only.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it, vi } from 'vitest'
import { childEnv, jsonLogLines, killLeftovers, receiverEnv, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const root = path.resolve(import.meta.dirname, '..')
// strace is a Debian package .ci/run installs; ptrace must be allowed (it is for root on these machines)
const canTrace = spawnSync('strace', ['-f', '-o', '/dev/null', 'true']).status === 0

interface Flush {
  /** When the call began, in seconds since the epoch, with microseconds (strace -ttt). */
  atS: number
  /** When it returned, where strace timed it (-T): a return strace delayed (inject delay_exit) comes that much later. */
  endS?: number
  /** strace delayed its return. */
  delayed: boolean
  file: string
}

/**
 * The fsync and fdatasync calls strace wrote (`-y`: each descriptor's path), that returned 0. A call another thread's
 * traced call interrupted is written in two lines (`<unfinished ...>`, then `<... fsync resumed>`): joined here.
 */
function flushes(traceFile: string): Flush[] {
  const calls: Flush[] = []
  const unfinished = new Map<string, { atS: number; file: string }>()
  const returned = (atS: number, file: string, rest: string) => {
    if (!/^\s+= 0(?:\s|$)/.test(rest)) return
    const took = /<(\d+\.\d+)>\s*$/.exec(rest)
    calls.push({ atS, file, delayed: rest.includes('(DELAYED)'), ...(took ? { endS: atS + Number(took[1]) } : {}) })
  }
  for (const line of readFileSync(traceFile, 'utf8').split('\n')) {
    const call = /^(\d+)\s+(\d+\.\d+) (?:f(?:data)?sync|syncfs)\(\d+<([^>]*)>(.*)$/.exec(line)
    if (call) {
      const [, pid, at, file, rest] = call
      if (rest!.includes('<unfinished ...>')) unfinished.set(pid!, { atS: Number(at), file: file! })
      else returned(Number(at), file!, rest!.replace(/^\)/, ''))
      continue
    }
    const resumed = /^(\d+)\s+\d+\.\d+ <\.\.\. (?:f(?:data)?sync|syncfs) resumed>\)(.*)$/.exec(line)
    const begun = resumed && unfinished.get(resumed[1]!)
    if (begun) {
      unfinished.delete(resumed[1]!)
      returned(begun.atS, begun.file, resumed[2]!)
    }
  }
  return calls
}

describe.skipIf(!canTrace)('the compiled serve on embedded PGlite on disk', () => {
  const directories: string[] = []
  const children: ChildProcess[] = []
  // the services strace runs: killing strace leaves its child running, so a test that failed kills both
  const services: number[] = []
  afterAll(() => {
    killLeftovers(children, services)
    for (const directory of directories) rmSync(directory, { recursive: true, force: true })
  })

  /** The pid of the service strace started (its child), remembered for the clean-up. */
  const serviceOf = (child: ChildProcess) => {
    const pid = Number(spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).stdout.trim().split('\n')[0])
    expect(pid).toBeGreaterThan(0)
    services.push(pid)
    return pid
  }

  /**
   * Sends three deliveries, one after another, to the service strace runs as `child`, then stops it as an operator
   * does (strace ends with it, its lines written): when each was sent and answered (200), in seconds.
   */
  const deliverThreeAndStop = async (child: ChildProcess, prefix: string) => {
    const { url } = await waitForLogLine(child, 'service listening')
    const service = serviceOf(child)
    const windows: { sentS: number; answeredS: number }[] = []
    for (const status of ['created', 'funded', 'delivered']) {
      const body = JSON.stringify(tradePayload(`${prefix}-${randomUUID()}`, status))
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
    const exited = once(child, 'exit')
    process.kill(service, 'SIGTERM')
    await exited
    return windows
  }

  it('answers a delivery 200 after its commit was flushed to disk (an fsync of the write-ahead log between the send and the answer)', async () => {
    const directory = mkdtempSync(path.join(tmpdir(), 'durability-'))
    directories.push(directory)
    const traceFile = path.join(directory, 'trace')
    const dataDir = path.join(directory, 'data')
    const child = spawn(
      'strace',
      ['-f', '-y', '-ttt', '-T', '-e', 'trace=fsync,fdatasync,syncfs', '-o', traceFile, process.execPath, path.join(root, 'dist/src/cli.js'), 'serve'],
      { cwd: root, env: childEnv(receiverEnv(dataDir)), stdio: 'pipe' },
    )
    children.push(child)
    const windows = await deliverThreeAndStop(child, 'durable')

    const calls = flushes(traceFile)
    const walFlushes = calls.filter((call) => /\/pg_wal\/[0-9A-F]{24}$/.test(call.file))
    for (const { sentS, answeredS } of windows) {
      // begun after the send and returned before the answer; the clock's milliseconds against strace's
      // microseconds: a millisecond of slack on each side
      expect(walFlushes.filter((call) => call.atS >= sentS - 0.001 && call.endS! <= answeredS + 0.001).length).toBeGreaterThanOrEqual(1)
    }
    // and the files written before the file system had its fsync (the new database's) were flushed at the start: one
    // syncfs of the file system holding them
    expect(calls.filter((call) => call.file === path.join(dataDir, 'pglite'))).toHaveLength(1)
  })
  // An answer waits for the flush of its commit, however long the disk takes: each log fsync's return is delayed by
  // 300 ms here (strace's delay_exit, not in its -T time). An answer that did not wait (a commit acknowledged before
  // its flush returned) would come back long before it
  it('answers a delivery only once the flush of its commit returned, however long the disk takes', async () => {
    const directory = mkdtempSync(path.join(tmpdir(), 'durability-slow-'))
    directories.push(directory)
    const traceFile = path.join(directory, 'trace')
    const dataDir = migratedDataDir('durability-slow-data-')
    const wal = path.join(dataDir, 'pglite', 'pg_wal')
    const [segment] = readdirSync(wal).filter((name) => /^[0-9A-F]{24}$/.test(name))
    const child = spawn(
      'strace',
      ['-f', '-y', '-ttt', '-T', '-P', path.join(wal, segment!), '-e', 'trace=fsync', '-e', 'inject=fsync:delay_exit=300000', '-o', traceFile,
        process.execPath, path.join(root, 'dist/src/cli.js'), 'serve'],
      { cwd: root, env: childEnv(receiverEnv(dataDir)), stdio: 'pipe' },
    )
    children.push(child)
    const windows = await deliverThreeAndStop(child, 'slow')
    const walFlushes = flushes(traceFile)
    expect(walFlushes.length).toBeGreaterThanOrEqual(3)
    expect(walFlushes.every((call) => call.delayed)).toBe(true)
    for (const { sentS, answeredS } of windows) {
      expect(walFlushes.filter((call) => call.atS >= sentS - 0.001 && call.endS! + 0.3 <= answeredS + 0.001).length).toBeGreaterThanOrEqual(1)
    }
  })

  // A disk that fails a flush (EIO, injected by strace into the write-ahead log's fsync once the service is ready):
  // Postgres would stop there, as what it wrote may not be on disk. PGlite, given the error, answered neither that
  // statement nor any after it and spun a core, with nothing logged, and /healthz still said ok
  it('stops the embedded database when a flush to disk fails: the delivery is not answered 200, /readyz and one error line name the file', async () => {
    const directory = mkdtempSync(path.join(tmpdir(), 'durability-eio-'))
    directories.push(directory)
    const dataDir = migratedDataDir('durability-eio-data-')
    const wal = path.join(dataDir, 'pglite', 'pg_wal')
    const [segment] = readdirSync(wal).filter((name) => /^[0-9A-F]{24}$/.test(name))
    // -P: only the calls on that segment are traced and counted (the start's flush is one syncfs of the file system)
    const child = spawn(
      'strace',
      ['-f', '-P', path.join(wal, segment!), '-e', 'trace=fsync', '-e', 'inject=fsync:error=EIO:when=1+', '-o', path.join(directory, 'trace'),
        process.execPath, path.join(root, 'dist/src/cli.js'), 'serve'],
      { cwd: root, env: childEnv(receiverEnv(dataDir)), stdio: 'pipe' },
    )
    children.push(child)
    const lines = jsonLogLines(child)
    const { url } = await waitForLogLine(child, 'service listening')
    const service = serviceOf(child)
    const body = JSON.stringify(tradePayload(`eio-${randomUUID()}`, 'funded'))
    const answer = await fetch(`${String(url)}/webhooks/partner`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-partner-delivery-id': randomUUID(), 'x-partner-signature': signBody(body) },
      body,
      // a delivery with no answer in this long is taken as one that never gets one (the fault this test is about)
      signal: AbortSignal.timeout(60_000),
    })
    expect(answer.status).toBe(503)
    const ready = await fetch(`${String(url)}/readyz`)
    expect(ready.status).toBe(503)
    expect(await ready.text()).toContain(`could not flush pg_wal/${segment} to disk (EIO)`)
    // (the line is read from the service's stdout, which may come after the answers)
    await vi.waitFor(() => expect(lines.some((line) => line.msg === 'the embedded database stopped')).toBe(true), { timeout: 30_000, interval: 50 })
    expect(lines.filter((line) => line.msg === 'the embedded database stopped')).toEqual([
      expect.objectContaining({ reason: `could not flush pg_wal/${segment} to disk (EIO); check the disk, then restart the service` }),
    ])
    const exited = once(child, 'exit')
    process.kill(service, 'SIGTERM')
    await exited
  })
})
