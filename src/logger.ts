// pino, JSON by default. Every header that carries a secret or a signature is redacted by path, and
// the configured secrets themselves are censored wherever they appear, so a careless log call cannot
// leak one.
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
  if (pretty && !destination) {
    return pino(options, pino.transport({ target: 'pino-pretty', options: { colorize: true } }))
  }
  // stdout is written asynchronously: lines logged while a write is under way go out together in the
  // next one (one syscall for many lines under load); pino flushes what is left when the process exits
  return pino(options, destination ?? pino.destination({ dest: 1, sync: false }))
}

function censorSecrets(line: string, secrets: readonly string[]): string {
  let censored = line
  for (const secret of secrets) {
    if (censored.includes(secret)) censored = censored.split(secret).join('[redacted]')
  }
  return censored
}
