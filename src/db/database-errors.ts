// Which errors mean "the database is not there right now" (answer 503, the sender retries) rather than
// a bug in our SQL.
const UNAVAILABLE_NODE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'ENOTFOUND',
  'EHOSTUNREACH',
])

export function isDatabaseUnavailable(error: unknown): boolean {
  for (let current = error; current instanceof Error; current = current.cause) {
    const code = (current as { code?: unknown }).code
    if (typeof code === 'string') {
      if (UNAVAILABLE_NODE_CODES.has(code)) return true
      // SQLSTATE class 08 (connection exception), 57P0x (shutdown), 53xxx (insufficient resources)
      if (/^(08|57P0|53)/.test(code)) return true
    }
    if (
      /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Query read timeout|PGlite is closed|Connection ended/i.test(
        current.message,
      )
    ) {
      return true
    }
  }
  return false
}
