// Node prints a process warning (`process.emitWarning`: node-postgres's SECURITY WARNING for sslmode=require, a
// library's deprecation, MaxListenersExceededWarning) to stderr as lines of plain text, in among the JSON lines
// a log shipper parses. Once a logger exists, each is one log line at warn level instead, with the warning's
// name and code as fields; nothing else reaches stderr.
import type { Logger } from './logger.js'

/** Sends every later process warning to `logger` instead of Node's plain-text printer on stderr. */
export function logProcessWarnings(logger: Logger): void {
  // Node's printer is a 'warning' listener of its own (absent under --no-warnings); the event stays
  process.removeAllListeners('warning')
  process.on('warning', (warning: Error & { code?: string }) => {
    logger.warn({ warning: { name: warning.name, ...(warning.code ? { code: warning.code } : {}) } }, warning.message)
  })
}
