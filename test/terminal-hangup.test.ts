// The compiled `serve` in a terminal that is closed (its window, a dropped ssh connection), on a pseudo-terminal
// of its own (helpers/on-a-terminal.py):
// - as the terminal's own command, it gets SIGHUP: it stops as on SIGTERM (/readyz answers 503 through the drain
//   delay) and exits 0, although every line it writes from then on fails (EIO);
// - started apart from the terminal's session (`setsid`), it gets no signal, only the failing writes: it goes on
//   serving, and stops cleanly on a later SIGTERM.
// Before, the first ended at once by the signal, with no drain, and the second did not stop on SIGTERM; an exit
// after the terminal was gone aborted in Node's own code (SIGABRT).
import { type ChildProcess, spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { childEnv, freePort, killLeftovers, receiverEnv } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const root = path.resolve(import.meta.dirname, '..')
const onATerminal = path.join(import.meta.dirname, 'helpers/on-a-terminal.py')
const hasPython = spawnSync('python3', ['--version']).status === 0
const DRAIN_DELAY_MS = 1_500

type Mode = 'session' | 'detached'

describe.skipIf(!hasPython)('the compiled serve when its terminal is closed', () => {
  const children: ChildProcess[] = []
  const pids: number[] = []
  afterAll(() => killLeftovers(children, pids))

  async function start(mode: Mode, logPretty: boolean) {
    const port = await freePort()
    const env = {
      ...receiverEnv(migratedDataDir('terminal-hangup-')),
      PORT: String(port),
      LOG_PRETTY: String(logPretty),
      SHUTDOWN_DRAIN_DELAY_MS: String(DRAIN_DELAY_MS),
    }
    const helper = spawn('python3', [onATerminal, mode, process.execPath, path.join(root, 'dist/src/cli.js'), 'serve'], {
      cwd: root,
      env: childEnv(env),
      stdio: 'pipe',
    })
    children.push(helper)
    // what the helper reports ({"pid"} at the start, {"exit"} or {"signal"} at the end), and the terminal's output
    let terminal = ''
    helper.stdout.on('data', (chunk: Buffer) => {
      terminal += chunk.toString()
    })
    const reports: Record<string, number>[] = []
    let partial = ''
    helper.stderr.on('data', (chunk: Buffer) => {
      partial += chunk.toString()
      const lines = partial.split('\n')
      partial = lines.pop()!
      for (const line of lines) reports.push(JSON.parse(line) as Record<string, number>)
    })
    // bounded, so a process that does not stop fails the test rather than holding it to the suite's timeout
    const ended = Promise.race([
      once(helper, 'exit').then(() => reports.at(-1)!),
      new Promise<Record<string, number>>((resolve) => setTimeout(() => resolve({ stillRunningAfterMs: 60_000 }), 60_000).unref()),
    ])
    const url = `http://127.0.0.1:${port}`
    for (const started = Date.now(); ; ) {
      if ((await readyz(url)) === 200) break
      if (Date.now() - started > 120_000 || helper.exitCode !== null) throw new Error(`serve did not start:\n${terminal}`)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const pid = reports[0]!.pid!
    pids.push(pid)
    /** Whether the terminal shows `text` within 30 s; false when it does not (the process's output is lost). */
    async function terminalShows(text: string): Promise<boolean> {
      for (const started = Date.now(); Date.now() - started < 30_000; ) {
        if (terminal.includes(text)) return true
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
      return terminal.includes(text)
    }
    return { url, pid, ended, terminalShows, hangUp: () => helper.stdin.write('hangup\n') }
  }

  it.each([
    ['JSON lines', false],
    ['LOG_PRETTY lines', true],
  ])('on SIGHUP from its terminal it drains and exits 0 (%s)', async (_lines, logPretty) => {
    const serve = await start('session', logPretty)
    // /readyz can answer before the terminal's output has come through the pseudo-terminal to us
    expect(await serve.terminalShows('service listening')).toBe(true)
    expect(await send(serve.url, 'before-hangup')).toBe(200)
    serve.hangUp()
    // the drain delay: still listening, no longer ready
    const answers = new Set<number>()
    for (const started = Date.now(); Date.now() - started < DRAIN_DELAY_MS / 2; ) {
      const status = await readyz(serve.url)
      if (status === 0) break
      answers.add(status)
    }
    expect(answers).toContain(503)
    expect(await serve.ended).toEqual({ exit: 0 })
  })

  it.each([
    ['JSON lines', false],
    ['LOG_PRETTY lines', true],
  ])('started apart from the terminal, it goes on serving after the terminal is closed (%s)', async (_lines, logPretty) => {
    const serve = await start('detached', logPretty)
    serve.hangUp()
    // each delivery is logged: lines written to a terminal that is gone
    for (let index = 0; index < 20; index += 1) expect(await send(serve.url, `after-hangup-${index}`)).toBe(200)
    expect(await readyz(serve.url)).toBe(200)
    process.kill(serve.pid, 'SIGTERM')
    expect(await serve.ended).toEqual({ exit: 0 })
  })
})

/** /readyz's status; 0 when nothing answers. */
async function readyz(url: string): Promise<number> {
  try {
    return (await fetch(`${url}/readyz`)).status
  } catch {
    return 0
  }
}

async function send(url: string, reference: string): Promise<number> {
  const body = JSON.stringify(tradePayload(reference, 'funded'))
  const response = await fetch(`${url}/webhooks/partner`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `hangup-${reference}`, 'x-partner-signature': signBody(body) },
    body,
  })
  await response.arrayBuffer()
  return response.status
}
