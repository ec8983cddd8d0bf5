// stdout and stderr whose reader went away: a pipe's reader that ended (`| head`, a `| tee` stopped by the same
// Ctrl-C: EPIPE) or a terminal that was closed (EIO: its window gone, the ssh connection dropped). What is
// written after it is lost; it is no failure of the command or of the service, which go on (or stop, on the
// SIGHUP a closed terminal sends: stop-signals.ts).
import { closeSync, openSync, writeSync } from 'node:fs'
import { isatty } from 'node:tty'

const GONE = new Set(['EPIPE', 'EIO'])

/** Whether a write failed because nobody reads the output any more. */
export function isOutputGone(error: NodeJS.ErrnoException): boolean {
  return error.code !== undefined && GONE.has(error.code)
}

// the standard descriptors that were a terminal when ignoreGoneOutput was called; undefined before
let terminals: number[] | undefined

// the first write to stdout or stderr that failed otherwise (a full disk: ENOSPC), once said
let failed = false
// set once the command's change was made (commandTookEffect): then a lost output is no failure of the command
let tookEffect: TookEffect | undefined

/**
 * What a command that made its change says of it when only its output is lost (commandTookEffect): what was done, and
 * where to see it. The change stands, and running the command again is not the way to see it.
 */
export interface TookEffect {
  /** What was done, e.g. `the order was created`. */
  done: string
  /** Where to see it, e.g. `see it with \`orders show\``. */
  see: string
}

/** A trade call's: the platform took it and the order records it. */
export const TRADE_CALL_TOOK_EFFECT: TookEffect = {
  done: 'the platform took it and the order records it',
  see: 'see the order with `orders show`',
}

/** How the lost output is said once the command's change was made. */
function doneButLost({ done, see }: TookEffect): string {
  return `the command was done (${done}); only its output is lost: ${see}, do not run the command again`
}

/**
 * Makes a write to process.stdout or stderr that finds its reader gone no error, and an exit after the terminal was
 * closed an exit like any other (detachFromClosedTerminal). A write that fails otherwise (the file's disk full:
 * ENOSPC, a quota: EDQUOT) loses what follows as well: it threw, a stack trace for a command (`orders list >
 * /dev/full`) and a crash for the service with LOG_PRETTY; now it is said once on the other stream, and the command
 * ends with exit 1 (`failCommand`) unless its change was made already (commandTookEffect), while the service goes on.
 * Once per process.
 */
export function ignoreGoneOutput({ failCommand = false }: { failCommand?: boolean } = {}): void {
  if (terminals) return
  terminals = [0, 1, 2].filter((fd) => isatty(fd))
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (error: NodeJS.ErrnoException) => {
      if (isOutputGone(error) || failed) return
      failed = true
      // (stderr's own failure has nowhere to be said)
      if (stream === process.stdout) {
        lostOn = error.code ?? error.message
        sayOutputFailed(`could not write to stdout (${lostOn}): ${tookEffect ? doneButLost(tookEffect) : 'what follows on it is lost'} [stdout_failed]`)
      }
    })
  }
  process.once('exit', () => {
    if (failed && failCommand && !tookEffect && !process.exitCode) process.exitCode = 1
    detachFromClosedTerminal()
  })
}

// the reason stdout failed, once it did
let lostOn: string | undefined

/**
 * The command's change was made and recorded (a trade call the platform answered, an order created, a pass of prune
 * committed): from here a stdout that cannot be written loses only the report of it, so the command does not end with
 * exit 1 for it. A script that took that exit 1 for a failure ran `trades fund` again after the fund was done. Said
 * at once when stdout had failed already.
 */
export function commandTookEffect(effect: TookEffect = TRADE_CALL_TOOK_EFFECT): void {
  if (tookEffect) return
  tookEffect = effect
  if (lostOn !== undefined) sayOutputFailed(`could not write to stdout (${lostOn}): ${doneButLost(effect)} [stdout_failed]`)
}

/** Whether the command said its change was made (commandTookEffect). */
export function commandHasTakenEffect(): boolean {
  return tookEffect !== undefined
}

/**
 * One line on stderr saying that an output failed: left out where stderr fails too (the same full disk).
 */
export function sayOutputFailed(line: string): void {
  try {
    writeSync(2, `${line}\n`)
  } catch {
    // nowhere left to say it
  }
}

/**
 * Node sets a terminal's modes back as it exits, and Node 20 aborts there (SIGABRT, at times SIGSEGV) when the
 * terminal is gone (22 and 24 do not): a process that stopped cleanly on SIGHUP ended as a crash. A closed
 * terminal no longer answers as one (isatty is false), so each standard descriptor that was a terminal and is no
 * more is opened again on /dev/null, which Node then leaves alone. Nothing could be written to it any more anyway.
 */
function detachFromClosedTerminal(): void {
  for (const fd of terminals ?? []) {
    if (isatty(fd)) continue
    try {
      closeSync(fd)
      // the lowest free descriptor: the one just closed
      const reopened = openSync('/dev/null', fd === 0 ? 'r' : 'w')
      if (reopened !== fd) closeSync(reopened)
    } catch {
      // nothing better to do on the way out
    }
  }
}
