// An output that cannot be written (the log's disk full: ENOSPC, here /dev/full) is not the service's failure. The
// JSON log's writer threw that error, and pino's flush at the exit then retried the write without end: the service
// answered nothing more, not even /healthz, and only SIGKILL ended it. With LOG_PRETTY it crashed with a stack
// trace, and so did a command whose output could not be written (`orders list > /dev/full`).
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { closeSync, existsSync, mkdtempSync, openSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { childEnv, freePort, killLeftovers, receiverEnv } from './helpers/cli-process.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const root = path.resolve(import.meta.dirname, '..')
const scratch = mkdtempSync(path.join(tmpdir(), 'output-full-'))
const children: ChildProcess[] = []
afterAll(() => {
  killLeftovers(children)
  rmSync(scratch, { recursive: true, force: true })
})

/** The compiled CLI with its stdout on /dev/full (every write fails with ENOSPC), its stderr read. */
function runOnFullOutput(args: string[], env: Record<string, string>) {
  const full = openSync('/dev/full', 'w')
  const child = spawn(process.execPath, [path.join(root, 'dist/src/cli.js'), ...args], { cwd: root, env: childEnv(env), stdio: ['ignore', full, 'pipe'] })
  closeSync(full)
  children.push(child)
  let stderr = ''
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  return { child, stderr: () => stderr }
}

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  for (const deadline = Date.now() + 120_000; Date.now() < deadline; ) {
    if (await check().catch(() => false)) return
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error(`timed out: ${what}`)
}

describe.skipIf(!existsSync('/dev/full'))('stdout that cannot be written (ENOSPC)', () => {
  it.each([['JSON lines', 'false'], ['LOG_PRETTY', 'true']])('the service (%s) goes on taking deliveries, says so once on stderr, and stops on SIGTERM with exit 0', async (_, pretty) => {
    const port = await freePort()
    const dataDir = path.join(scratch, `serve-${pretty}`)
    const { child, stderr } = runOnFullOutput(['serve'], { ...receiverEnv(dataDir), PORT: String(port), LOG_PRETTY: pretty })
    const url = `http://127.0.0.1:${port}`
    await until(async () => (await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(5_000) })).status === 200, 'the service is ready')
    // every delivery answered, each a few log lines no one can write
    for (let n = 0; n < 20; n++) {
      const body = JSON.stringify(tradePayload(`full-${n}`, 'funded'))
      const answer = await fetch(`${url}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': randomUUID(), 'x-partner-signature': signBody(body) },
        body,
        signal: AbortSignal.timeout(30_000),
      })
      expect(answer.status).toBe(200)
    }
    expect((await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(30_000) })).status).toBe(200)
    const exited = once(child, 'exit')
    child.kill('SIGTERM')
    // past its 10-s limit it exits on its own, with 1; one that hung is ended here (and fails the check)
    const hung = setTimeout(() => child.kill('SIGKILL'), 30_000)
    const [code, signal] = (await exited) as [number | null, NodeJS.Signals | null]
    clearTimeout(hung)
    expect({ code, signal }).toEqual({ code: 0, signal: null })
    const said = stderr().split('\n').filter((line) => line.startsWith('could not write'))
    expect(said.length).toBeGreaterThanOrEqual(1)
    expect(new Set(said).size).toBe(said.length)
    expect(stderr()).not.toMatch(/\n\s+at /)
  })

  it('a command whose output cannot be written exits 1 with one line saying so, no stack trace', async () => {
    const { child, stderr } = runOnFullOutput(['orders', 'list'], { DATA_DIR: path.join(scratch, 'cli') })
    const [code] = (await once(child, 'exit')) as [number | null]
    expect(code).toBe(1)
    expect(stderr()).toMatch(/(?:^|\n)could not write to stdout \(ENOSPC\): what follows on it is lost\n$/)
    expect(stderr()).not.toMatch(/\n\s+at /)
  })
})
