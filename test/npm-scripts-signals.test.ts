// The package's npm scripts as the README has them, stopped the two ways they are stopped: a signal to npm
// alone (a supervisor, `kill <pid>`, a tool that runs npm scripts) and a terminal's Ctrl-C, which reaches every
// process of the foreground group, npm's and ours, while npm passes its own copy on too. Either way the command
// stops once, as it does on one signal, and nothing is left listening.
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { childEnv, freePort, waitForLogLine } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')

// the npm that runs this suite (`npm test` sets npm_execpath), else the one on PATH
function spawnNpm(script: string[], env: Record<string, string>, { ownGroup }: { ownGroup: boolean }): ChildProcess {
  const npm = process.env.npm_execpath
  const [command, args] = npm && npm.endsWith('.js') ? [process.execPath, [npm, ...script]] : ['npm', script]
  return spawn(command, args, { cwd: root, env: childEnv(env), stdio: 'pipe', detached: ownGroup })
}

async function startedNpm(name: string, { ownGroup }: { ownGroup: boolean }) {
  const env = {
    DATA_DIR: mkdtempSync(path.join(tmpdir(), `npm-start-${name}-`)),
    PORT: '0',
    ADMIN_PORT: '0',
    SANDBOX_PORT: String(await freePort()),
    POLL_ENABLED: 'false',
  }
  const npm = spawnNpm(['start'], env, { ownGroup })
  let output = ''
  npm.stdout!.on('data', (chunk) => {
    output += chunk
  })
  npm.stderr!.on('data', (chunk) => {
    output += chunk
  })
  const exited = once(npm, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  const { url } = await waitForLogLine(npm, 'service listening', 120_000)
  return { npm, exited, url: new URL(String(url)), output: () => output }
}

// whether anything still accepts connections on the receiver's port
function accepts(url: URL): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(Number(url.port), url.hostname)
    socket.once('connect', () => {
      socket.destroy()
      resolve(true)
    })
    socket.once('error', () => resolve(false))
  })
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

describe('npm start, stopped', () => {
  it('by SIGTERM to npm alone: the service shuts down once, logs "stopped", and leaves nothing running', async () => {
    const { npm, exited, url, output } = await startedNpm('term', { ownGroup: false })
    const below = descendants(npm.pid!)
    try {
      expect(await accepts(url)).toBe(true)
      expect(below.length).toBeGreaterThan(0)
      npm.kill('SIGTERM')
      const [code] = await exited
      const msgs = logLines(output())
      expect(msgs.filter((msg) => msg === 'shutting down')).toHaveLength(1)
      expect(msgs).toContain('stopped')
      expect(code).toBe(0)
      // the service was npm's child: gone with it, not left behind holding its ports
      expect(stillRunning(below)).toEqual([])
    } finally {
      for (const pid of [npm.pid!, ...below]) killQuietly(pid)
    }
  }, 180_000)

  it('by Ctrl-C (SIGINT to the whole process group): one graceful shutdown, not the second signal’s exit', async () => {
    const { npm, exited, url, output } = await startedNpm('int', { ownGroup: true })
    const below = descendants(npm.pid!)
    try {
      expect(await accepts(url)).toBe(true)
      process.kill(-npm.pid!, 'SIGINT')
      const [code] = await exited
      const msgs = logLines(output())
      expect(msgs).not.toContain('second signal: exiting without waiting')
      expect(msgs.filter((msg) => msg === 'shutting down')).toHaveLength(1)
      expect(msgs).toContain('stopped')
      expect(code).toBe(0)
      expect(stillRunning(below)).toEqual([])
    } finally {
      killQuietly(-npm.pid!)
    }
  }, 180_000)
})

describe('npm run cli -- sandbox, stopped', () => {
  async function startedSandbox(name: string, { ownGroup }: { ownGroup: boolean }) {
    const port = await freePort()
    const npm = spawnNpm(['run', 'cli', '--', 'sandbox', '--port', String(port)], { DATA_DIR: mkdtempSync(path.join(tmpdir(), `npm-sandbox-${name}-`)) }, { ownGroup })
    let output = ''
    npm.stdout!.on('data', (chunk) => {
      output += chunk
    })
    npm.stderr!.on('data', (chunk) => {
      output += chunk
    })
    const exited = once(npm, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
    const started = Date.now()
    while (!output.includes('Ctrl-C stops it')) {
      if (npm.exitCode !== null || Date.now() - started > 120_000) throw new Error(`the sandbox did not start:\n${output}`)
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    return { npm, exited, url: new URL(`http://127.0.0.1:${port}`) }
  }

  it('by SIGTERM to npm alone: exits 0 and leaves nothing running', async () => {
    const { npm, exited, url } = await startedSandbox('term', { ownGroup: false })
    const below = descendants(npm.pid!)
    try {
      expect(await accepts(url)).toBe(true)
      expect(below.length).toBeGreaterThan(0)
      npm.kill('SIGTERM')
      const [code] = await exited
      expect(code).toBe(0)
      expect(stillRunning(below)).toEqual([])
    } finally {
      for (const pid of [npm.pid!, ...below]) killQuietly(pid)
    }
  }, 180_000)

  it('by Ctrl-C (SIGINT to the whole process group): exits 0, not killed by npm’s copy of the signal', async () => {
    const { npm, exited, url } = await startedSandbox('int', { ownGroup: true })
    const below = descendants(npm.pid!)
    try {
      expect(await accepts(url)).toBe(true)
      process.kill(-npm.pid!, 'SIGINT')
      const [code, signal] = await exited
      expect({ code, signal }).toEqual({ code: 0, signal: null })
      expect(stillRunning(below)).toEqual([])
    } finally {
      killQuietly(-npm.pid!)
    }
  }, 180_000)
})
