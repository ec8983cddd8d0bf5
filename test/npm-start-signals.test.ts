// `npm start` as the README has it, stopped the two ways it is stopped: a signal to npm alone (a supervisor,
// `kill <pid>`, a tool that runs npm scripts) and a terminal's Ctrl-C, which reaches every process of the
// foreground group, npm's and the service's, while npm passes its own copy on too. Either way the service
// shuts down once, gracefully, and nothing is left listening.
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync } from 'node:fs'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { childEnv, freePort, waitForLogLine } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')

// the npm that runs this suite (`npm test` sets npm_execpath), else the one on PATH
function spawnNpmStart(env: Record<string, string>, { ownGroup }: { ownGroup: boolean }): ChildProcess {
  const npm = process.env.npm_execpath
  const [command, args] = npm && npm.endsWith('.js') ? [process.execPath, [npm, 'start']] : ['npm', ['start']]
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
  const npm = spawnNpmStart(env, { ownGroup })
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

const logLines = (output: string) =>
  output
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => (JSON.parse(line) as { msg: string }).msg)

describe('npm start, stopped', () => {
  it('by SIGTERM to npm alone: the service shuts down once, logs "stopped", and leaves nothing listening', async () => {
    const { npm, exited, url, output } = await startedNpm('term', { ownGroup: false })
    try {
      expect(await accepts(url)).toBe(true)
      npm.kill('SIGTERM')
      const [code] = await exited
      const msgs = logLines(output())
      expect(msgs.filter((msg) => msg === 'shutting down')).toHaveLength(1)
      expect(msgs).toContain('stopped')
      expect(code).toBe(0)
      // the service was npm's child: gone with it, not left behind holding the port
      expect(await accepts(url)).toBe(false)
    } finally {
      npm.kill('SIGKILL')
    }
  }, 180_000)

  it('by Ctrl-C (SIGINT to the whole process group): one graceful shutdown, not the second signal’s exit', async () => {
    const { npm, exited, url, output } = await startedNpm('int', { ownGroup: true })
    try {
      process.kill(-npm.pid!, 'SIGINT')
      const [code] = await exited
      const msgs = logLines(output())
      expect(msgs).not.toContain('second signal: exiting without waiting')
      expect(msgs.filter((msg) => msg === 'shutting down')).toHaveLength(1)
      expect(msgs).toContain('stopped')
      expect(code).toBe(0)
      expect(await accepts(url)).toBe(false)
    } finally {
      try {
        process.kill(-npm.pid!, 'SIGKILL')
      } catch {
        // the group is gone
      }
    }
  }, 180_000)
})
