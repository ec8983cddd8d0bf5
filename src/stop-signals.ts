// The signals that stop a long-running command: `serve` (main.ts), the demo's console and `sandbox`.
//
// Under `npm start` and `npm run` one Ctrl-C arrives twice: the terminal sends it to every process of the
// foreground group, npm's and ours, and npm passes its own copy on to its child. The package's scripts `exec`
// node, so that npm's child is this process: a signal sent to npm alone (a supervisor, `kill <pid>`) then
// reaches it, where a shell in between died of it and left this process running. The same signal again
// within SAME_SIGNAL_MS of the first is that copy, not a second request to stop.
//
// SIGHUP (the terminal was closed, the ssh connection dropped) stops like SIGTERM. Left to Node, it ended the
// process at once, with no drain; and `nohup` does not keep a Node process alive, since Node sets an ignored
// SIGHUP back to its default when it starts. To keep a service running past its terminal, run it detached from it
// (a supervisor, `setsid`): README.md, "Stopping".

/** How soon the same signal again counts as a copy of the first (npm's) rather than a second one. */
export const SAME_SIGNAL_MS = 1_000

export type StopSignal = 'SIGINT' | 'SIGTERM' | 'SIGHUP'

const STOP_SIGNALS: readonly StopSignal[] = ['SIGINT', 'SIGTERM', 'SIGHUP']

let received: StopSignal | undefined

/**
 * The first stop signal this process received, if any. A command it stopped ends the process with
 * `process.exit` once it is done (cli.ts) rather than by letting the event loop run dry: Node (20, 22 and 24)
 * takes the signal handlers down a few milliseconds before such a process is gone, and npm's copy of a Ctrl-C
 * arriving then ended it by SIGINT after a complete, graceful stop.
 */
export function stopSignalReceived(): StopSignal | undefined {
  return received
}

let starting = false

/**
 * From the CLI's start until a command takes the stop signals (onStopSignals) or its action begins
 * (commandBegins): the first one ends the process at once, exit 130, with `said` on stderr. Node's default ended a
 * command still loading its modules without a word, where the same Ctrl-C a moment later said what it stopped.
 *
 * The listener stays for the process's life. Taken off when the command began, a signal that came in the instant
 * before was lost: Node's handler had caught it, and no listener was left when it was to be dispatched (4 of 75
 * Ctrl-Cs at 0.3 s, the command then ran to its end). So, after the start, it leaves a signal to the command's own
 * listeners, and where there are none, ends the process as Node's default does.
 */
export function stopWhileStarting(said: string): void {
  starting = true
  const handle = (signal: StopSignal) => {
    if (starting) {
      process.stderr.write(said)
      process.exit(130)
    }
    // the command has ended and set its exit code, and its output is written: a signal now ends the process with
    // that code. Output still on its way to a reader that is behind is cut by the signal, which ends the process as
    // it would have (an exit 0 then passed a cut output for the whole of it)
    if (ended && process.stdout.writableLength === 0 && process.stderr.writableLength === 0) process.exit()
    if (process.listenerCount(signal) > 1) return
    for (const each of STOP_SIGNALS) process.off(each, handle)
    process.kill(process.pid, signal)
  }
  for (const signal of STOP_SIGNALS) process.on(signal, handle)
}

/** The command's action begins: from here a stop signal is its own to handle (or Node's default). */
export function commandBegins(): void {
  starting = false
}

let ended = false

/**
 * The command has ended, its exit code set (cli.ts): from here a stop signal ends the process with that code at once
 * once its output is written, where it would have ended a command that had done its work, and printed so, by the
 * signal (130 to a shell). While its output is still being written the signal ends it as before.
 */
export function commandEnded(): void {
  starting = false
  ended = true
}

// how many onStopSignals registrations are on now (finishHoldingSignals leaves the signals to a command that holds them)
let holders = 0

/**
 * Calls `onStop` for the first SIGINT, SIGTERM or SIGHUP, and `onSecond` for any later one that is not the first's
 * copy. Returns what takes the listeners off again.
 */
export function onStopSignals(onStop: (signal: StopSignal) => void, onSecond: (signal: StopSignal) => void): () => void {
  commandBegins()
  holders += 1
  let on = true
  let first: { signal: StopSignal; at: number } | undefined
  const handle = (signal: StopSignal) => {
    if (first === undefined) {
      first = { signal, at: performance.now() }
      received ??= signal
      onStop(signal)
    } else if (signal !== first.signal || performance.now() - first.at >= SAME_SIGNAL_MS) {
      onSecond(signal)
    }
  }
  for (const signal of STOP_SIGNALS) process.on(signal, handle)
  return () => {
    if (on) holders -= 1
    on = false
    for (const signal of STOP_SIGNALS) process.off(signal, handle)
  }
}

/**
 * Calls `onStop` for the first SIGINT, SIGTERM or SIGHUP; a second signal (not the first's copy) calls `beforeEnding`
 * (which may end the process its own way: a line saying what may be left, then exit 130) and ends the process as
 * that signal does by default, whatever the command is still doing. Returns what takes the listeners off.
 */
export function stopOnSignals(onStop: (signal: StopSignal) => void, beforeEnding?: (signal: StopSignal) => void): () => void {
  const off = onStopSignals(onStop, (signal) => {
    beforeEnding?.(signal)
    off()
    process.kill(process.pid, signal)
  })
  return off
}

/**
 * stopOnSignals for the whole of a command's work, beside the handlers a command may add of its own (a prune pass's,
 * a trade call's, onStopSignals): while one of those is on, each signal is left to it, and its rules apply; while none
 * is, the first calls `onStop` and a second (not the first's copy) calls `beforeEnding` (which may end the process its
 * own way) and ends the process as that signal does by default.
 */
export function stopUnlessHeld(onStop: (signal: StopSignal) => void, beforeEnding?: (signal: StopSignal) => void): () => void {
  const off = onStopSignals(
    (signal) => {
      if (holders <= 1) onStop(signal)
    },
    (signal) => {
      if (holders > 1) return
      beforeEnding?.(signal)
      off()
      process.kill(process.pid, signal)
    },
  )
  return off
}

/** Resolves on the first SIGINT, SIGTERM or SIGHUP; a second one ends the process (stopOnSignals). */
export function untilStopSignal(): Promise<StopSignal> {
  return new Promise((resolve) => {
    stopOnSignals(resolve)
  })
}

/**
 * Runs `finish`, work that must not be cut short once a command's own work is done (its database closing), with the
 * stop signals held: the first says `said` (on stderr) and lets it finish, so the command ends with its own exit code
 * (cli.ts exits with it once a signal came); a second ends the process as that signal does by default. A command that
 * holds the signals itself (onStopSignals: a trade call's, a prune pass's) keeps them, and its own rules apply.
 */
export async function finishHoldingSignals<T>(finish: () => Promise<T>, said: string): Promise<T> {
  if (holders > 0) return finish()
  const off = stopOnSignals(() => process.stderr.write(said))
  try {
    return await finish()
  } finally {
    off()
  }
}
