// The last lines of a process that ends by exiting: serve's stop and failed start (flushLogger, then exitProcess)
// and a CLI command stopped by a signal (stdioWritten, then process.exit). The wait must last until stdout took
// them, however slowly its reader reads, and not for a reader that went away. Run in a process of its own, on a
// real pipe: an exit drops whatever Node still holds for stdout.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { childEnv } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')
const LINES = 2_000

// stdout is read only once the child waits for its lines to be written and `readAfterMs` more have passed (a
// reader that fell behind: 2 MB is far more than a pipe holds); `read: false`, the reader is gone before a line
function burstThenExit(format: 'json' | 'pretty' | 'stdio', { read = true, readAfterMs = 300 } = {}) {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/log-burst-then-exit.ts', String(LINES), format], {
    cwd: root,
    env: childEnv({}),
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let stdout = ''
  let stderr = ''
  if (read) {
    child.stdout.pause()
    child.stdout.on('data', (chunk) => {
      stdout += chunk
    })
  } else {
    child.stdout.destroy()
  }
  let resuming = false
  child.stderr.on('data', (chunk) => {
    stderr += chunk
    if (read && !resuming && stderr.includes('waiting\n')) {
      resuming = true
      setTimeout(() => child.stdout.resume(), readAfterMs)
    }
  })
  const closed = once(child, 'close') as Promise<[number | null, NodeJS.Signals | null]>
  return closed.then(([code, signal]) => ({ code, signal, stdout, stderr }))
}

const count = (text: string, pattern: RegExp) => text.match(pattern)?.length ?? 0

describe('the last lines before an exit', () => {
  it.each([
    ['JSON lines (pino on stdout)', 'json', /"msg":"burst"/g, /"msg":"the last line"/g],
    ['human-readable lines (LOG_PRETTY)', 'pretty', /INFO: burst/g, /INFO: the last line/g],
    ["a command's own output (process.stdout)", 'stdio', /^burst \d+ x/gm, /^the last line$/gm],
  ] as const)('%s: all of them reach a reader that fell behind', async (_name, format, burst, last) => {
    const { code, signal, stdout, stderr } = await burstThenExit(format)
    expect({ code, signal }, stderr).toEqual({ code: 0, signal: null })
    expect(count(stdout, burst)).toBe(LINES)
    expect(count(stdout, last)).toBe(1)
    expect(stderr).toContain('{"written":true}')
  })

  // the writer is given each line as bytes, and holds them until the write under way ends: each line whole, and in
  // order, however the pipe cut the writes
  it('JSON lines: each one whole and in order, its text of several bytes a character as logged, the secret censored', async () => {
    const { code, stdout, stderr } = await burstThenExit('json')
    expect(code, stderr).toBe(0)
    const lines = stdout.trimEnd().split('\n').map((line) => JSON.parse(line) as Record<string, unknown>)
    const burst = lines.filter((line) => line.msg === 'burst')
    expect(burst.map((line) => line.line)).toEqual(Array.from({ length: LINES }, (_, line) => line))
    expect(new Set(burst.map((line) => line.text))).toEqual(new Set(['Zürich — ✓ 🚀']))
    expect(new Set(burst.map((line) => line.careless))).toEqual(new Set(['[redacted]']))
    expect(stdout).not.toContain('never-shown-0123456789')
    expect(lines.at(-1)).toMatchObject({ msg: 'the last line' })
  })

  it.each(['json', 'pretty', 'stdio'] as const)('%s: a reader that went away ends the wait, as lost', async (format) => {
    // the wait's own bound is 120 s: a wait that missed the broken pipe outlasts the test's timeout
    const { code, signal, stderr } = await burstThenExit(format, { read: false })
    expect({ code, signal }, stderr).toEqual({ code: 0, signal: null })
    expect(stderr).toContain('{"written":false}')
  })
})
