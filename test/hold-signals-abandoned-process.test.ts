// A trade call's signals (src/cli/hold-signals-for-call.ts) in a process of their own: a third signal after a second
// abandoned the wait for the platform's answer, before the call is marked settled. It ended the process at once, killed
// by the signal and without a word; now it says the call's outcome is not known and nothing of it recorded (and a local
// write in flight, if one is), exit 130.
//
// Through the compiled module rather than a command: in a command the call rejects in the same turn as the abort (the
// abort's reason, in microtasks run before the next signal's handler), so no signal can be sent into that window from
// outside. Here the call is sent (guard.sending) and never ends, so the window stays open for the test's signals.
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import { afterAll, describe, expect, it } from 'vitest'
import { killLeftovers } from './helpers/cli-process.js'
import { eventually } from './helpers/reconcile-poller.js'

const module = pathToFileURL(path.join(import.meta.dirname, '..', 'dist', 'src', 'cli', 'hold-signals-for-call.js')).href
const children: ChildProcess[] = []
afterAll(() => killLeftovers(children))

/** A process that sends a call (guard.sending) which never ends, saying on stdout when its wait is abandoned. */
function heldCall(write?: { change: string; see: string }) {
  const script =
    `const { holdSignalsForCall } = await import(${JSON.stringify(module)})\n` +
    'const held = holdSignalsForCall()\n' +
    (write ? `held.guard.writing(${JSON.stringify(write)})\n` : '') +
    "const signal = held.guard.sending()\n" +
    "signal.addEventListener('abort', () => process.stdout.write('abandoned\\n'))\n" +
    "process.stdout.write('in flight\\n')\n" +
    'setInterval(() => {}, 60_000)\n'
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: 'pipe' })
  children.push(child)
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  child.stderr.on('data', (chunk) => (stderr += chunk))
  let closed: { code: number | null; signal: NodeJS.Signals | null } | undefined
  const ended = (once(child, 'close') as Promise<[number | null, NodeJS.Signals | null]>).then(([code, signal]) => (closed = { code, signal }))
  const shows = (what: () => string, text: string) =>
    eventually(() => {
      if (closed) throw new Error(`the process ended before "${text}": ${stderr}`)
      return what().includes(text)
    }, `the process shows "${text}"`, 60_000)
  return { child, stdout: () => stdout, stderr: () => stderr, shows, ended: async () => ({ ...(await ended), stdout, stderr }) }
}

const FIRST = 'waiting for the platform’s answer to the call in flight, to record it and say what was recorded (a second Ctrl-C stops waiting: what the platform did is then not known)\n'
const STOPPED =
  'Stopped by a third signal after the wait for the platform’s answer was abandoned, before the call had ended: its ' +
  'outcome is not known (the platform may or may not have done it, unless its connection was not up yet), and ' +
  'nothing of it was recorded here (no mark of an unknown outcome, no poll brought forward): check the platform ' +
  'before sending the call again'

async function stopThreeTimes(run: ReturnType<typeof heldCall>) {
  await run.shows(run.stdout, 'in flight\n')
  // three different signals (the same one within a second is taken as npm's copy of the first)
  run.child.kill('SIGINT')
  await run.shows(run.stderr, FIRST)
  run.child.kill('SIGTERM')
  await run.shows(run.stdout, 'abandoned\n')
  run.child.kill('SIGHUP')
  return run.ended()
}

describe('a third stop signal after the wait for the answer was abandoned, before the call has ended', () => {
  it('says the outcome is not known and nothing of it recorded, exit 130 [stopped]', async () => {
    const ended = await stopThreeTimes(heldCall())
    expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
    expect(ended.stderr).toBe(`${FIRST}${STOPPED} [stopped]\n`)
  })

  it('with a local write in flight, says it may or may not have been made and where to look', async () => {
    const write = { change: "the poll of order o_1 brought forward", see: "`orders show 'o_1'` gives its next poll" }
    const ended = await stopThreeTimes(heldCall(write))
    expect({ code: ended.code, signal: ended.signal }, ended.stderr).toEqual({ code: 130, signal: null })
    expect(ended.stderr).toBe(
      `${FIRST}${STOPPED}; the poll of order o_1 brought forward was in flight, and may or may not have been made (on ` +
        "Postgres a statement sent runs on without this process); `orders show 'o_1'` gives its next poll [stopped]\n",
    )
  })
})
