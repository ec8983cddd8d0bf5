// From the CLI's start until a command's action begins, a stop signal ends the process with a line that says so,
// exit 130: a Ctrl-C while a command still loaded its modules ended it without a word, where the same Ctrl-C a
// moment later said what it stopped. Once the action begins, or a command takes the signals itself, the line is
// no longer the process's to say.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { describe, expect, it } from 'vitest'

const root = path.resolve(import.meta.dirname, '..')

async function signalled(then: string): Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }> {
  const script =
    `import { stopWhileStarting, commandBegins, onStopSignals } from './src/stop-signals.ts';` +
    `stopWhileStarting('stopped while starting\\n'); ${then}; console.log('ready'); setInterval(() => {}, 1000)`
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: root })
  let stderr = ''
  child.stderr.on('data', (chunk) => (stderr += chunk))
  let stdout = ''
  await new Promise<void>((resolve) => child.stdout.on('data', (chunk) => (stdout += chunk).includes('ready') && resolve()))
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  child.kill('SIGINT')
  const [code, signal] = await exited
  return { code, signal, stderr }
}

/** The exit of a process that sends itself SIGINT, then takes the command's listeners off before it is dispatched. */
async function signalledAsListenersGo(): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const script =
    `import { stopWhileStarting, commandBegins, onStopSignals } from './src/stop-signals.ts';` +
    `stopWhileStarting('stopped while starting\\n'); commandBegins();` +
    `const off = onStopSignals(() => {}, () => {}); process.kill(process.pid, 'SIGINT'); off();` +
    `setTimeout(() => process.exit(7), 5_000)`
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: root })
  const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null]
  return { code, signal }
}

describe('a stop signal before the command begins', () => {
  it('ends the process with its line, exit 130', async () => {
    expect(await signalled('')).toEqual({ code: 130, signal: null, stderr: 'stopped while starting\n' })
  })

  it('is the command\'s once its action begins, or once it takes the signals', async () => {
    // Node's default: ended by the signal, nothing said
    expect(await signalled('commandBegins()')).toEqual({ code: null, signal: 'SIGINT', stderr: '' })
    const own = await signalled(`onStopSignals(() => { process.stderr.write('its own\\n'); process.exit(3) }, () => {})`)
    expect(own).toEqual({ code: 3, signal: null, stderr: 'its own\n' })
  })

  // Node's handler had caught it, and no listener was left to dispatch it to: the signal was lost, and the command ran
  // to its end (exit 7 here, after 5 s)
  it('is not lost when it comes in the instant the command takes its listeners off: Node\'s default then', async () => {
    expect(await signalledAsListenersGo()).toEqual({ code: null, signal: 'SIGINT' })
  })
})
