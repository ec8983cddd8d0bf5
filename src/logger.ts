// pino, JSON by default. Every header that carries a secret or a signature is redacted by path, and
// the configured secrets themselves are censored wherever they appear, so a careless log call cannot
// leak one.
//
// Output that nobody reads any more (`npm start | tee log` and the reader went away) must never keep the
// process alive: see exitProcess below.
import { createRequire } from 'node:module'
import pino, { type Logger } from 'pino'
import { loggableError } from './db/database-errors.js'
import { isOutputGone, sayOutputFailed } from './output-gone.js'
import { printableLines } from './printable.js'

export type { Logger }

const REDACTED_PATHS = [
  'req.headers.authorization',
  'req.headers["x-partner-signature"]',
  'req.headers["x-partner-key-id"]',
  'req.headers["x-partner-nonce"]',
  'headers["x-partner-signature"]',
  'headers["X-Partner-Signature"]',
  '*.headers["x-partner-signature"]',
  '*.headers["X-Partner-Signature"]',
  'headers["webhook-signature"]',
  '*.headers["webhook-signature"]',
  'signature',
  '*.signature',
  'secret',
  '*.secret',
  'secrets',
  '*.secrets',
  'rawBody',
  '*.rawBody',
  'req.body',
  'password',
  '*.password',
  'databaseUrl',
  '*.databaseUrl',
]

export interface LoggerOptions {
  level: string
  pretty?: boolean
  /** Values that must never appear in a log line, wherever they occur. */
  secrets?: readonly string[]
  /** Where lines go; defaults to stdout. Tests pass a capture stream. */
  destination?: pino.DestinationStream
  /**
   * LOG_BUFFER_LIMIT: the most stdout holds in memory while its reader is slower than the lines come (a reader
   * that stopped reading, a log shipper stuck); lines past it are dropped and counted (droppedLogLines).
   */
  bufferLimitBytes?: number
}

/** LOG_BUFFER_LIMIT's default. */
export const DEFAULT_LOG_BUFFER_LIMIT = 16 * 1024 * 1024

// Lines dropped because stdout held LOG_BUFFER_LIMIT already. Before the limit, a reader that stopped reading
// (`npm start | less` left on one page, a stuck log shipper) grew the process by every line: 75 MB in a minute
// of duplicate deliveries, without end. /metrics shows the count (log_lines_dropped_total); a warning line says
// how many once stdout takes lines again.
let droppedLines = 0

/** Log lines dropped so far in this process because stdout did not take them (LOG_BUFFER_LIMIT). */
export function droppedLogLines(): number {
  return droppedLines
}

// counts a dropped line, and has `logger` say how many once `stream` has written what it held
function countDrops(stream: NodeJS.EventEmitter, logger: () => Logger | undefined) {
  let unreported = 0
  stream.on('drain', () => {
    if (unreported === 0) return
    const lines = unreported
    unreported = 0
    logger()?.warn({ lines }, 'log lines dropped: stdout did not take them as fast as they came (LOG_BUFFER_LIMIT)')
  })
  return () => {
    droppedLines += 1
    unreported += 1
  }
}

export function createLogger({
  level,
  pretty = false,
  secrets = [],
  destination,
  bufferLimitBytes = DEFAULT_LOG_BUFFER_LIMIT,
}: LoggerOptions): Logger {
  const censorable = secrets.filter((secret) => secret.length > 0)
  const options: pino.LoggerOptions = {
    level,
    base: { service: 'partner-escrow' },
    redact: { paths: REDACTED_PATHS, censor: '[redacted]' },
    // a database's error report can quote what was sent (Postgres's detail and where, PGlite's params):
    // whatever logs an error, only its classification is written. A plain object by then (a classification, a
    // refusal's code and message) is written as it is: pino's serializer gave it a type "Object" and an empty stack.
    serializers: {
      err: (error: unknown) => {
        const loggable = loggableError(error)
        return isPlainObject(loggable) ? loggable : pino.stdSerializers.err(loggable as Error)
      },
    },
  }
  // last line of defence: a secret that slipped into a message or a field is blanked out
  const censor = censorable.length ? (line: string) => censorSecrets(line, censorable) : undefined
  // the logger being made, for the line that reports dropped ones
  const made: { logger?: Logger } = {}
  const human = pretty && !destination ? humanReadableStdout(bufferLimitBytes, () => made.logger) : undefined
  // stdout is written asynchronously: lines logged while a write is under way go out together in the
  // next one (one syscall for many lines under load); flushLogger waits for what is left. What it holds is
  // bounded: past the limit a line is dropped ('drop'). Each line is given to it as bytes (contentMode
  // 'buffer'): given as text, it measured the text it held so far at every line, a copy of all the lines
  // waiting for the write under way each time (about 2.7 kB a delivery under load, the most of any one place
  // on the ingest's path: bench/alloc-profile.ts)
  const stdout =
    destination || human ? undefined : pino.destination({ dest: 1, sync: false, maxLength: bufferLimitBytes, contentMode: 'buffer' })
  const asyncOutput = stdout && asyncStdoutOutput(stdout)
  // a wait for stdout ends at the 'drain' this warning is written on: an exit right then loses it (/metrics has the count)
  if (stdout) stdout.on('drop', countDrops(stdout, () => made.logger))
  if (asyncOutput) {
    options.hooks = {
      // (pino hands on whatever the hook returns; its type says text)
      streamWrite: (line) => {
        asyncOutput.given()
        return Buffer.from(censor ? censor(line) : line) as unknown as string
      },
    }
  } else if (censor) {
    options.hooks = { streamWrite: censor }
  }
  const logger = pino(options, destination ?? human ?? stdout)
  made.logger = logger
  const output = asyncOutput ?? (human ? processStdoutOutput : undefined)
  if (output) outputs.set(logger, output)
  return logger
}

/**
 * A wait until what a logger was given so far is written to stdout: `done` is called once (false: the reader
 * went away and the rest is lost), unless the returned function stops the wait first.
 */
interface StdoutOutput {
  whenWritten: (done: (written: boolean) => void) => () => void
}

// the loggers createLogger made that write to stdout, for flushLogger
const outputs = new WeakMap<Logger, StdoutOutput>()

// pino's asynchronous stdout writer (sonic-boom). Its own flush(callback) calls back at once when it buffers
// nothing on purpose (minLength 0, ours), even while a write is under way and lines wait behind it: an exit
// then lost the last lines, "stopped" among them, whenever stdout was slower than the stop (a loaded
// machine, a reader that fell behind). It emits 'drain' once all it was given is written; the stream-write
// hook marks each line given. A reader that went away (output-gone.ts) ends the wait too, and the writer is made
// to drop every line: pino does so itself on EPIPE, not on a closed terminal's EIO, after which the writer kept
// all that was logged to try it again (and a SIGTERM then did not end the process, still there 14 s later).
function asyncStdoutOutput(stream: ReturnType<typeof pino.destination>) {
  let unwritten = false
  let gone = false
  const waiting = new Set<(written: boolean) => void>()
  const settle = () => {
    unwritten = false
    for (const done of waiting) done(!gone)
    waiting.clear()
  }
  stream.on('drain', settle)
  // the rule main.ts has for process.stdout: a reader that went away is not the service's failure, and neither is an
  // output that cannot be written (its disk full: ENOSPC). Thrown, that error hung the service for good: pino's
  // flush at the exit retried the write without end, and nothing answered, not even /healthz, nor ended it but SIGKILL
  stream.on('error', (error: NodeJS.ErrnoException) => {
    if (gone) return
    if (!isOutputGone(error)) {
      sayOutputFailed(`could not write the log to stdout (${error.code ?? error.message}): no more lines are written until the service is restarted; it goes on`)
    }
    gone = true
    stream.write = () => true
    stream.flushSync = () => {}
    stream.end = () => {}
    settle()
  })
  return {
    given: () => {
      unwritten = !gone
    },
    whenWritten: (done: (written: boolean) => void) => {
      if (!unwritten) {
        done(!gone)
        return () => {}
      }
      waiting.add(done)
      return () => waiting.delete(done)
    },
  }
}

// The human-readable lines go through process.stdout
const processStdoutOutput: StdoutOutput = { whenWritten: (done) => whenStreamWritten(process.stdout, done) }

// process.stdout and stderr hold what a full pipe or socket has not taken yet (an exit then drops it): `done` once
// they hold nothing; as lost on their 'error' (a reader gone, which main.ts and cli.ts ignore) or 'close'
function whenStreamWritten(stream: NodeJS.WriteStream, done: (written: boolean) => void): () => void {
  if (stream.writableLength === 0 || stream.destroyed) {
    done(!stream.destroyed)
    return () => {}
  }
  const written = () => finish(true)
  const lost = () => finish(false)
  const stop = () => {
    stream.off('drain', written).off('error', lost).off('close', lost)
  }
  const finish = (allWritten: boolean) => {
    stop()
    done(allWritten)
  }
  stream.on('drain', written).on('error', lost).on('close', lost)
  return stop
}

// a wait of the whenWritten kind, given up after timeoutMs (false)
function boundedWait(whenWritten: StdoutOutput['whenWritten'], timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      stopWaiting()
      resolve(false)
    }, timeoutMs)
    timer.unref()
    const stopWaiting = whenWritten((written) => {
      clearTimeout(timer)
      resolve(written)
    })
  })
}

/**
 * Waits until process.stdout and stderr have written all they were given, or `timeoutMs` passed: what a command
 * that ends by process.exit calls first. Resolves true when everything was written.
 */
export async function stdioWritten(timeoutMs: number): Promise<boolean> {
  const each = [process.stdout, process.stderr].map((stream) => boundedWait((done) => whenStreamWritten(stream, done), timeoutMs))
  return (await Promise.all(each)).every(Boolean)
}

// One line per event for a person at a terminal, through process.stdout in order with the banner. pino-pretty
// is a development dependency: without it (an install that left those out) the lines stay JSON.
function humanReadableStdout(limitBytes: number, logger: () => Logger | undefined): pino.DestinationStream | undefined {
  let format: (line: string | object) => string
  try {
    const { prettyFactory } = createRequire(import.meta.url)('pino-pretty') as typeof import('pino-pretty')
    format = prettyFactory({
      colorize: process.stdout.isTTY === true,
      singleLine: true,
      translateTime: 'HH:MM:ss',
      ignore: 'pid,hostname,service',
    })
  } catch {
    return undefined
  }
  const dropped = countDrops(process.stdout, logger)
  return {
    write: (line: string) => {
      if (process.stdout.writableLength >= limitBytes) dropped()
      else process.stdout.write(format(withoutControls(line)))
    },
  }
}

// pino-pretty undoes JSON's escapes and prints an error's stack as it is, so a control code in text from
// outside (the platform's error message, a webhook's field) would reach the terminal: each string's controls
// are shown as \uXXXX first (line feeds and tabs kept, for stacks). Only for the readable lines, which a
// person reads on a terminal; JSON lines keep every value exact (a bidirectional control too: they are data
// for a log pipeline, and its viewer is what shows them).
function withoutControls(line: string): Record<string, unknown> | string {
  try {
    return escapeStrings(JSON.parse(line)) as Record<string, unknown>
  } catch {
    return printableLines(line)
  }
}

function escapeStrings(value: unknown): unknown {
  if (typeof value === 'string') return printableLines(value)
  if (Array.isArray(value)) return value.map(escapeStrings)
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([key, inner]) => [printableLines(key), escapeStrings(inner)]))
  }
  return value
}

/**
 * Waits until the lines logged so far are written, or `timeoutMs` passed (a pipe whose reader is slow or
 * gone): never longer. Resolves true when everything was written.
 */
export function flushLogger(logger: Logger, timeoutMs: number): Promise<boolean> {
  const output = outputs.get(logger)
  if (output) return boundedWait(output.whenWritten, timeoutMs)
  // a destination of the caller's (tests): pino's own flush
  return boundedWait((done) => {
    try {
      logger.flush((error) => done(!error))
    } catch {
      done(false)
    }
    return () => {}
  }, timeoutMs)
}

/**
 * Exits now; call flushLogger first to keep the last lines. The asynchronous stdout writer would flush what
 * is left synchronously on exit, and it retries a failed write forever (EPIPE included: a `| tee` that was
 * interrupted), blocking the process in a loop no signal can break. So what is still buffered is given up.
 */
export function exitProcess(logger: Logger, code: number): never {
  const stream = (logger as unknown as Record<symbol, unknown>)[pino.symbols.streamSym] as
    | { flushSync?: () => void }
    | undefined
  if (stream && typeof stream.flushSync === 'function') stream.flushSync = () => {}
  process.exit(code)
}

function censorSecrets(line: string, secrets: readonly string[]): string {
  let censored = line
  for (const secret of secrets) {
    if (censored.includes(secret)) censored = censored.split(secret).join('[redacted]')
  }
  return censored
}

function isPlainObject(value: unknown): boolean {
  return typeof value === 'object' && value !== null && Object.getPrototypeOf(value) === Object.prototype
}
