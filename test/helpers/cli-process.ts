// Runs the CLI as a child process, as an operator would: the compiled dist/ (helpers/build-dist.ts built it from the
// sources under test before the file's first test), as the image runs it. `{ source: true }` runs src/ through tsx
// instead, as `npm start` does: that adds 1.3 s of a core to every start (esbuild's transforms; 2.57 + 0.71 s of CPU
// against 1.52 + 0.47 s for an `orders list`, 2026-12-06), and a run of the suite starts hundreds of processes.
import { type ChildProcess, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe } from 'vitest'

import { rememberSecret } from './log-sink.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './test-config.js'

const root = path.resolve(import.meta.dirname, '../..')

/**
 * CI runs the suite twice (.ci/run): on embedded PGlite and Node 20, then on Postgres and Node 24 with
 * SKIP_DATABASE_FREE_PROCESS_SUITES=1. The second leaves out what a process suite runs the same without the test
 * database, since the first ran it and a process case runs once: whole files (vitest.config.ts), and the cases on
 * embedded PGlite of the files that run a case on both.
 */
export const embeddedRanBefore = process.env.SKIP_DATABASE_FREE_PROCESS_SUITES === '1'

/** A process suite's describe for its cases on embedded PGlite: skipped where they ran before (embeddedRanBefore). */
export const describeEmbedded: typeof describe = embeddedRanBefore ? (describe.skip as typeof describe) : describe

/** `serve` on PGlite in `dataDir`, on ports of its own, as the receiver alone: no poller, no platform there. */
export function receiverEnv(dataDir: string): Record<string, string> {
  return {
    DATA_DIR: dataDir,
    PORT: '0',
    ADMIN_PORT: '0',
    POLL_ENABLED: 'false',
    PARTNER_API_BASE_URL: 'http://127.0.0.1:9',
    PARTNER_API_KEY_ID: TEST_API_KEY_ID,
    PARTNER_API_SECRET: TEST_API_SECRET,
    WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
  }
}

/** The environment of a `serve` in remote mode on `platformUrl`, its database the one in `dataDir` (listeners on free ports). */
export function remoteServeEnv({ dataDir, platformUrl }: { dataDir: string; platformUrl: string }): Record<string, string> {
  return {
    DATA_DIR: dataDir,
    PORT: '0',
    ADMIN_PORT: '0',
    PARTNER_API_BASE_URL: platformUrl,
    PARTNER_API_KEY_ID: TEST_API_KEY_ID,
    PARTNER_API_SECRET: TEST_API_SECRET,
    WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
  }
}

/** The environment of a `serve` on Postgres that polls `platformUrl` every second (listeners on free ports). */
export function pollingServeEnv({ databaseUrl, dataDir, platformUrl }: { databaseUrl: string; dataDir: string; platformUrl: string }): Record<string, string> {
  return { DATABASE_URL: databaseUrl, ...remoteServeEnv({ dataDir, platformUrl }), POLL_INTERVAL_S: '1' }
}

/** The environment of a `serve` on Postgres that does not poll (listeners on free ports): add its reactions' settings. */
export function postgresServeEnv({ databaseUrl, dataDir }: { databaseUrl: string; dataDir: string }): Record<string, string> {
  return { DATABASE_URL: databaseUrl, ...remoteServeEnv({ dataDir, platformUrl: 'http://127.0.0.1:1' }), POLL_ENABLED: 'false' }
}

/**
 * The environment of a `serve` on Postgres that forwards every transition to `forwardUrl` and does not poll, with a
 * forwarder secret made for it (kept from every log line of the file, helpers/log-sink.ts).
 */
export function forwardingServeEnv({ databaseUrl, dataDir, forwardUrl }: { databaseUrl: string; dataDir: string; forwardUrl: string }): Record<string, string> {
  const secret = `whsec_${randomBytes(32).toString('base64')}`
  rememberSecret(secret.slice('whsec_'.length))
  return { ...postgresServeEnv({ databaseUrl, dataDir }), FORWARD_URL: forwardUrl, FORWARD_SECRET: secret }
}

export interface CliResult {
  code: number | null
  stdout: string
  stderr: string
}

let defaultDataDir: string | undefined

/**
 * The DATA_DIR of a child given none: one directory for this test file, where the CLI's own default would be
 * ./data in the checkout, shared by every file at once. (A command run there by one file met the service file
 * of another file's `serve` and refused with wrong_database.) Removed at the file's end (helpers/setup.ts), so the
 * next file its worker runs, with this module shared (isolate: false), gets a new one.
 */
function dataDirOfThisFile(): string {
  defaultDataDir ??= mkdtempSync(path.join(tmpdir(), 'cli-data-dir-'))
  return defaultDataDir
}

/** Removes this test file's default DATA_DIR, if a child used one (helpers/setup.ts, at each test file's end). */
export function removeDefaultDataDir(): void {
  // maxRetries: a child killed at the file's end (killLeftovers) may still be writing there for a moment
  if (defaultDataDir) rmSync(defaultDataDir, { recursive: true, force: true, maxRetries: 5 })
  defaultDataDir = undefined
}

/** Environment for a child: no inherited variable of ours, so tests do not depend on the shell. */
export function childEnv(env: Record<string, string>): NodeJS.ProcessEnv {
  const clean: NodeJS.ProcessEnv = {}
  for (const name of ['PATH', 'HOME', 'TMPDIR', 'LANG'])
    if (process.env[name]) clean[name] = process.env[name]
  return { ...clean, LOG_LEVEL: 'info', ...env }
}

/**
 * The CLI run with `args`: the compiled dist/, src/ through tsx with `source`, or with `cli` another build's compiled
 * CLI (a fork's: helpers/fork-build.ts), run from the directory that holds its dist/.
 */
export function spawnCli(args: string[], env: Record<string, string>, { source = false, cli }: { source?: boolean; cli?: string } = {}): ChildProcess {
  const entry = cli ? [cli] : source ? ['--import', 'tsx', path.join(root, 'src/cli.ts')] : [path.join(root, 'dist/src/cli.js')]
  return spawn(process.execPath, [...entry, ...args], {
    cwd: cli ? path.resolve(path.dirname(cli), '../..') : root,
    env: childEnv({ DATA_DIR: env.DATA_DIR ?? dataDirOfThisFile(), ...env }),
    stdio: 'pipe',
  })
}

/**
 * The CLI run with `args` (spawnCli), noted in `children` for the file's clean-up: its stdout and
 * stderr read as they come, and how it ended once it has (its pipes read to their end), undefined while it runs.
 */
export function startedCli(args: string[], env: Record<string, string>, children: ChildProcess[], options: { cli?: string } = {}) {
  const child = spawnCli(args, env, options)
  children.push(child)
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (chunk) => (stdout += chunk))
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  let closed: { code: number | null; signal: NodeJS.Signals | null } | undefined
  const ended = (once(child, 'close') as Promise<[number | null, NodeJS.Signals | null]>).then(([code, signal]) => (closed = { code, signal }))
  return {
    child,
    stdout: () => stdout,
    stderr: () => stderr,
    closed: () => closed,
    ended: async () => ({ ...(await ended), stdout, stderr }),
  }
}

export async function runCli(args: string[], env: Record<string, string>, options = {}): Promise<CliResult> {
  const child = spawnCli(args, env, options)
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (chunk) => {
    stdout += chunk
  })
  child.stderr!.on('data', (chunk) => {
    stderr += chunk
  })
  const [code] = (await once(child, 'exit')) as [number | null]
  return { code, stdout, stderr }
}

/**
 * Kills, without waiting, what a test file started and may have left running (an afterAll's clean-up): its children,
 * and processes known by pid only (a child's own child: killing strace leaves the service it runs running).
 */
export function killLeftovers(children: ChildProcess[], pids: number[] = []): void {
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL')
    } catch {
      // gone already
    }
  }
  for (const child of children) child.kill('SIGKILL')
}

/**
 * The children a test file starts and the clean-ups it registers, ended after all its tests (afterAll): the children
 * killed first (killLeftovers), then each clean-up in turn.
 */
export function endedAfterAll(): { children: ChildProcess[]; cleanups: (() => Promise<void>)[] } {
  const children: ChildProcess[] = []
  const cleanups: (() => Promise<void>)[] = []
  afterAll(async () => {
    killLeftovers(children)
    for (const cleanup of cleanups) await cleanup()
  })
  return { children, cleanups }
}

/**
 * Signals a child and waits for it to exit, at once if it has exited already: an `afterAll` that waited for the
 * 'exit' of a service that had failed to start hung for the whole hook timeout.
 */
export async function stopChild(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) return child.exitCode
  const exited = once(child, 'exit') as Promise<[number | null]>
  child.kill(signal)
  const [code] = await exited
  return code
}

/** Sends `signal` and resolves once the process has exited and closed its pipes (every line it wrote is read). */
export async function signalAndClose(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const closed = once(child, 'close') as Promise<[number | null, NodeJS.Signals | null]>
  child.kill(signal)
  const [code, by] = await closed
  return { code, signal: by }
}

/** Resolves with the first JSON log line whose msg matches, failing if the process exits first. */
export function waitForLogLine(
  child: ChildProcess,
  msg: string,
  // a bound on a hang, as the tests' own 5 min: a start on a loaded 2-core machine took over a minute
  timeoutMs = 240_000,
): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    let buffer = ''
    let output = ''
    const timer = setTimeout(
      () => reject(new Error(`no "${msg}" log line within ${timeoutMs} ms:\n${output}`)),
      timeoutMs,
    )
    const onData = (chunk: Buffer) => {
      output += chunk
      buffer += chunk
      let newline = buffer.indexOf('\n')
      while (newline >= 0) {
        const line = buffer.slice(0, newline)
        buffer = buffer.slice(newline + 1)
        newline = buffer.indexOf('\n')
        try {
          const entry = JSON.parse(line) as Record<string, unknown>
          if (entry.msg === msg) {
            clearTimeout(timer)
            child.stdout!.off('data', onData)
            resolve(entry)
            return
          }
        } catch {
          // not a JSON line (a banner); keep reading
        }
      }
    }
    child.stdout!.on('data', onData)
    child.stderr!.on('data', (chunk) => {
      output += chunk
    })
    child.once('exit', (code) => {
      clearTimeout(timer)
      reject(new Error(`process exited with ${code} before "${msg}":\n${output}`))
    })
  })
}

/** Every JSON line the child writes to stdout from now on, parsed, in a list that grows as they come. */
export function jsonLogLines(child: ChildProcess): Record<string, unknown>[] {
  const lines: Record<string, unknown>[] = []
  let buffer = ''
  child.stdout!.on('data', (chunk: Buffer) => {
    buffer += chunk
    const parts = buffer.split('\n')
    buffer = parts.pop()!
    for (const line of parts) if (line.startsWith('{')) lines.push(JSON.parse(line) as Record<string, unknown>)
  })
  return lines
}

/**
 * A port nothing listens on right now, for a child that must be told its port in advance. It is drawn below the
 * kernel's ephemeral range: a port from `listen(0)` was handed out again, between a service's stop and its restart,
 * to another test's listener or outgoing connection, and the restart found it taken.
 */
export async function freePort(): Promise<number> {
  const { createServer } = await import('node:net')
  const below = ephemeralRangeStart()
  for (;;) {
    const port = 10_000 + Math.floor(Math.random() * (below - 10_000))
    const server = createServer()
    const bound = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false))
      server.listen(port, '127.0.0.1', () => resolve(true))
    })
    if (!bound) continue
    await new Promise<void>((resolve) => server.close(() => resolve()))
    return port
  }
}

/** The first port the kernel hands out for `listen(0)` and outgoing connections (Linux; 32768 elsewhere). */
function ephemeralRangeStart(): number {
  try {
    const [low] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)
    const start = Number(low)
    if (Number.isInteger(start) && start > 11_000) return start
  } catch {
    // not Linux: the IANA range starts at 49152, and 32768 is below it as well as below Linux's default
  }
  return 32_768
}
