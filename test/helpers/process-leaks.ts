// What a test file can leave in its process for the next file to find: the in-process files, and the process files
// (those that run the CLI or the service as children), share their worker's process and modules (vitest.config.ts,
// `isolate: false`), so a SIGINT listener, an environment variable, a fake clock or a server still listening that one
// file left shows up as a failure of another. setup.ts takes this before each file and compares it after, so a leak
// fails the file that leaked it. A child process a process file started is not counted: it is neither a listener on
// this process nor a server, and it is the file's own clean-up to kill (helpers/cli-process.ts, killLeftovers).
import { Server } from 'node:net'
import { vi } from 'vitest'

declare module 'vitest' {
  export interface ProvidedContext {
    /** Whether this project's files run one after another in one process (`isolate: false`): the check applies. */
    filesShareProcess: boolean
  }
}

// The globals a test might replace (vi.stubGlobal, vi.useFakeTimers, an assignment): each must be the same object after.
const GLOBALS = ['fetch', 'Date', 'setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'setImmediate', 'clearImmediate', 'queueMicrotask', 'performance'] as const

// Environment variables set once per process, on purpose, by a helper's import: each says a skip once per worker.
const ENV_SET_ONCE = new Set(['QUIET_POSTGRES_SKIP', 'QUIET_AMQP_SKIP'])

interface ProcessState {
  listeners: Map<string | symbol, number>
  env: Record<string, string | undefined>
  cwd: string
  umask: number
  exitCode: typeof process.exitCode
  globals: Map<string, unknown>
  servers: number
}

export function processState(): ProcessState {
  return {
    listeners: new Map(process.eventNames().map((event) => [event, process.listenerCount(event)])),
    env: { ...process.env },
    cwd: process.cwd(),
    umask: process.umask(),
    exitCode: process.exitCode,
    globals: new Map(GLOBALS.map((name) => [name, globalThis[name]])),
    servers: listeningServers(),
  }
}

// Node servers (net, http, https) still listening: exact, where a count of handles by kind
// (process.getActiveResourcesInfo) still holds a server closed a moment ago, and a socket or a timer a pool or a
// PGlite thread is still closing: not checked, since those counts would flake.
function listeningServers(): number {
  const handles = (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles()
  return handles.filter((handle) => handle instanceof Server && handle.listening).length
}

/** What differs now from `before`, each as "this file left …"; empty when the file put back all it changed. */
export function processLeaks(before: ProcessState): string[] {
  const after = processState()
  const leaks: string[] = []
  const events = new Set([...before.listeners.keys(), ...after.listeners.keys()])
  for (const event of events) {
    const more = (after.listeners.get(event) ?? 0) - (before.listeners.get(event) ?? 0)
    if (more !== 0) leaks.push(`this file left ${Math.abs(more)} ${more > 0 ? 'more' : 'fewer'} ${String(event)} listener(s) on process`)
  }
  for (const name of new Set([...Object.keys(before.env), ...Object.keys(after.env)])) {
    if (before.env[name] === after.env[name] || (before.env[name] === undefined && ENV_SET_ONCE.has(name))) continue
    leaks.push(`this file left process.env.${name} ${after.env[name] === undefined ? 'unset' : 'changed'} (it was ${before.env[name] === undefined ? 'unset' : 'set'})`)
  }
  if (after.cwd !== before.cwd) leaks.push(`this file left the working directory at ${after.cwd} (it was ${before.cwd})`)
  if (after.umask !== before.umask) leaks.push(`this file left the umask at ${after.umask.toString(8)} (it was ${before.umask.toString(8)})`)
  if (after.exitCode !== before.exitCode) leaks.push(`this file left process.exitCode at ${after.exitCode} (it was ${before.exitCode})`)
  if (vi.isFakeTimers()) leaks.push('this file left fake timers installed (vi.useFakeTimers without vi.useRealTimers)')
  else for (const [name, value] of before.globals) if (globalThis[name as (typeof GLOBALS)[number]] !== value) leaks.push(`this file left the global ${name} replaced`)
  if (after.servers > before.servers) leaks.push(`this file left ${after.servers - before.servers} more server(s) listening`)
  return leaks
}
