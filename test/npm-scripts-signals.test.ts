// The package's npm scripts as the README has them, stopped the two ways they are stopped: a signal to npm
// alone (a supervisor, `kill <pid>`, a tool that runs npm scripts) and a terminal's Ctrl-C, which reaches every
// process of the foreground group, npm's and ours, while npm passes its own copy on too. Either way the command
// stops once, as it does on one signal, npm exits 0, and no process of it is left running.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { childEnv, freePort } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')

interface Script {
  /** What follows `npm`. */
  args: (port: number) => string[]
  env: (port: number) => Record<string, string>
  /** Printed once the command is up and waiting for a signal. */
  ready: string
  /** The JSON log lines it writes when it stops once and gracefully (serve's); none for the sandbox. */
  stopLines: string[]
}

const SCRIPTS: Record<string, Script> = {
  'npm start': {
    args: () => ['start'],
    env: (port) => ({ PORT: '0', ADMIN_PORT: '0', SANDBOX_PORT: String(port), POLL_ENABLED: 'false' }),
    ready: '"msg":"service listening"',
    stopLines: ['shutting down', 'stopped'],
  },
  'npm run cli -- sandbox': {
    args: (port) => ['run', 'cli', '--', 'sandbox', '--port', String(port)],
    env: () => ({}),
    ready: 'Ctrl-C stops it',
    stopLines: [],
  },
}

// the npm that runs this suite (`npm test` sets npm_execpath), else the one on PATH; ownGroup: a process group of
// its own, as a terminal gives a foreground command
async function started(script: Script, { ownGroup }: { ownGroup: boolean }) {
  const port = await freePort()
  const env = { DATA_DIR: mkdtempSync(path.join(tmpdir(), 'npm-script-')), ...script.env(port) }
  const npmCli = process.env.npm_execpath
  const [command, args] = npmCli?.endsWith('.js') ? [process.execPath, [npmCli, ...script.args(port)]] : ['npm', script.args(port)]
  const npm = spawn(command, args, { cwd: root, env: childEnv(env), stdio: 'pipe', detached: ownGroup })
  let output = ''
  for (const stream of [npm.stdout, npm.stderr]) {
    stream.on('data', (chunk) => {
      output += chunk
    })
  }
  // 'close', not 'exit': npm can exit before this process has read the last lines from the pipe it shares
  // with the command (which holds its end until it exits too)
  const exited = once(npm, 'close') as Promise<[number | null, NodeJS.Signals | null]>
  const since = Date.now()
  while (!output.includes(script.ready)) {
    if (npm.exitCode !== null || Date.now() - since > 120_000) throw new Error(`it did not start:\n${output}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return { npm, exited, output: () => output }
}

// every process below `pid` now (Linux: /proc/<pid>/task/<pid>/children)
function descendants(pid: number): number[] {
  let children: number[]
  try {
    children = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number)
  } catch {
    return []
  }
  return children.flatMap((child) => [child, ...descendants(child)])
}

// those of `pids` still running (a port could be taken again by another test's process; a pid this soon cannot)
function stillRunning(pids: number[]): number[] {
  return pids.filter((pid) => {
    try {
      process.kill(pid, 0)
      return true
    } catch {
      return false
    }
  })
}

// SIGKILL to a process (or, negative, a group) that may be gone already: a failed test leaves nothing behind
function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL')
  } catch {
    // gone
  }
}

const logLines = (output: string) =>
  output
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => (JSON.parse(line) as { msg: string }).msg)

describe.each(Object.entries(SCRIPTS))('%s, stopped', (_name, script) => {
  const stops = [
    ['by SIGTERM to npm alone', false, (pid: number) => process.kill(pid, 'SIGTERM')],
    ['by Ctrl-C (SIGINT to the whole process group)', true, (pid: number) => process.kill(-pid, 'SIGINT')],
  ] as const

  it.each(stops)('%s: stops once, npm exits 0, and nothing of it is left running', async (_how, ownGroup, send) => {
    const { npm, exited, output } = await started(script, { ownGroup })
    const below = descendants(npm.pid!)
    try {
      expect(below.length).toBeGreaterThan(0)
      send(npm.pid!)
      const [code, signal] = await exited
      const msgs = logLines(output())
      expect(msgs).not.toContain('second signal: exiting without waiting')
      for (const line of script.stopLines) expect(msgs.filter((msg) => msg === line)).toHaveLength(1)
      expect({ code, signal }).toEqual({ code: 0, signal: null })
      expect(stillRunning(below)).toEqual([])
    } finally {
      for (const pid of [ownGroup ? -npm.pid! : npm.pid!, ...below]) killQuietly(pid)
    }
  }, 180_000)
})
