// pino, JSON by default. Every header that carries a secret or a signature is redacted by path, and
// the configured secrets themselves are censored wherever they appear, so a careless log call cannot
// leak one.
//
// Output that nobody reads any more (`npm start | tee log` and the reader went away) must never keep the
// process alive: see exitProcess below.
import { createRequire } from 'node:module'
import pino, { type Logger } from 'pino'
import { loggableError } from './db/database-errors.js'

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
}

export function createLogger({ level, pretty = false, secrets = [], destination }: LoggerOptions): Logger {
  const censorable = secrets.filter((secret) => secret.length > 0)
  const options: pino.LoggerOptions = {
    level,
    base: { service: 'partner-escrow' },
    redact: { paths: REDACTED_PATHS, censor: '[redacted]' },
    // a database's error report can quote what was sent (Postgres's detail and where, PGlite's params):
    // whatever logs an error, only its classification is written
    serializers: { err: (error: unknown) => pino.stdSerializers.err(loggableError(error) as Error) },
  }
  if (censorable.length) {
    // last line of defence: a secret that slipped into a message or a field is blanked out
    options.hooks = { streamWrite: (line) => censorSecrets(line, censorable) }
  }
  const human = pretty && !destination ? humanReadableStdout() : undefined
  if (human) return pino(options, human)
  // stdout is written asynchronously: lines logged while a write is under way go out together in the
  // next one (one syscall for many lines under load); pino flushes what is left when the process exits
  return pino(options, destination ?? pino.destination({ dest: 1, sync: false }))
}

// One line per event for a person at a terminal, written synchronously in order with the banner. pino-pretty
// is a development dependency: without it (an install that left those out) the lines stay JSON.
function humanReadableStdout(): pino.DestinationStream | undefined {
  let format: (line: string) => string
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
  return { write: (line: string) => process.stdout.write(format(line)) }
}

/**
 * Waits until the lines logged so far are written, or `timeoutMs` passed (a pipe whose reader is slow or
 * gone): never longer. Resolves true when everything was written.
 */
export function flushLogger(logger: Logger, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), timeoutMs)
    timer.unref()
    try {
      logger.flush((error) => {
        clearTimeout(timer)
        resolve(!error)
      })
    } catch {
      clearTimeout(timer)
      resolve(false)
    }
  })
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
