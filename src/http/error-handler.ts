import type { ErrorRequestHandler, RequestHandler } from 'express'
import { type DatabaseErrorDescription, describeDatabaseError, isColumnMissing, loggableError, UNDEFINED_COLUMN } from '../db/database-errors.js'
import { limitLines } from '../limit-lines.js'
import type { Logger } from '../logger.js'
import { AppError, type ErrorBody, type ErrorCode, errorBody } from './app-error.js'

export function notFoundHandler(): RequestHandler {
  return (req, res) => {
    res.status(404).json(errorBody('not_found', `No route for ${req.method} ${req.path}`))
  }
}

// the codes of the 4xx statuses that Express's body parsers and raw-body answer with; any other is invalid_payload
const BODY_ERROR_CODES: Partial<Record<number, ErrorCode>> = {
  408: 'request_timeout',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
}

/**
 * raw-body's refusal of a body whose client's end came before the body did (`request.aborted`: the listener says so
 * at that end, server.ts) as 400 `body_incomplete`, saying how much came; undefined for any other error. It was
 * answered 400 "The request is not valid HTTP", though the request was only unfinished.
 */
export function incompleteBody(error: unknown): AppError | undefined {
  const { type, received, expected } = (error ?? {}) as { type?: unknown; received?: unknown; expected?: unknown }
  if (type !== 'request.aborted' || typeof received !== 'number') return undefined
  const came = typeof expected === 'number' ? `${received} of ${expected} bytes` : `${received} bytes of a chunked body, and not its last chunk`
  return new AppError(400, 'body_incomplete', `The request ended before its body did: ${came}`)
}

/**
 * How long a client is asked to wait (Retry-After, in seconds) while the service's tables are missing: a restore
 * under way takes minutes, and a load balancer has taken the replica out meanwhile (/readyz).
 */
export const SCHEMA_MISSING_RETRY_AFTER_S = 30

/** The 503 answered while the service's tables are missing (database-errors.ts, schema_missing). */
export const SCHEMA_MISSING_ANSWER =
  "The service's tables are missing (the database was replaced or is being restored); retry later"

/** The 503 answered while a column of the service's tables is missing (42703: schema_missing too). */
export const SCHEMA_BEHIND_ANSWER =
  "The database's schema is behind this build: a column of the service's tables is missing (restored from an older dump, or in part); retry later"

/** The message of the 503 `schema_missing` answered for `error`: a table's words or a column's. */
export function schemaMissingAnswer(error: unknown): string {
  return isColumnMissing(error) ? SCHEMA_BEHIND_ANSWER : SCHEMA_MISSING_ANSWER
}

/** What a log line says of a request refused for a schema_missing error of SQLSTATE `code`: a table's words or a column's. */
export function schemaMissingWords(code: string | undefined): string {
  return code === UNDEFINED_COLUMN ? "the database's schema is behind this build (a column is missing)" : "the service's tables are missing"
}

export interface ErrorAnswer {
  status: number
  body: ErrorBody
  /** Headers to send with it (a Retry-After). */
  headers?: Record<string, string>
}

// the line a request met by missing tables writes: one a second at most per logger, as every request of a busy
// listener meets them until the restore ends (limit-lines.ts)
const schemaMissingLines = new WeakMap<Logger, (fields: { err: DatabaseErrorDescription; path: string }) => void>()
function logSchemaMissing(logger: Logger, fields: { err: DatabaseErrorDescription; path: string }): void {
  let write = schemaMissingLines.get(logger)
  if (!write) {
    write = limitLines((limited: { err: DatabaseErrorDescription; path: string }) =>
      logger.error(limited, `request refused: ${schemaMissingWords(limited.err.code)}`),
    )
    schemaMissingLines.set(logger, write)
  }
  write(fields)
}

/**
 * What an error is answered with: {"error":{"code","message"}}, never a stack trace in the body. Logs the
 * errors an operator must see (the database's, and anything unexpected: a 500).
 */
export function errorAnswer(error: unknown, logger: Logger, path: string): ErrorAnswer {
  if (error instanceof AppError) {
    const answer = { status: error.status, body: errorBody(error.code, error.message) }
    return error.code === 'schema_missing' ? { ...answer, headers: { 'Retry-After': String(SCHEMA_MISSING_RETRY_AFTER_S) } } : answer
  }
  // a body parser's refusal first: a client that went away mid-body is raw-body's `request.aborted`, whose code
  // (ECONNABORTED) also names a lost database connection, and a form abandoned on the operator listener was logged
  // as a database outage (an outside attack)
  const bodyRefusal = bodyParserRefusal(error)
  if (bodyRefusal) return bodyRefusal
  const database = describeDatabaseError(error)
  if (database.kind === 'schema_missing') {
    logSchemaMissing(logger, { err: database, path })
    return {
      status: 503,
      body: errorBody('schema_missing', schemaMissingAnswer(error)),
      headers: { 'Retry-After': String(SCHEMA_MISSING_RETRY_AFTER_S) },
    }
  }
  if (database.kind === 'unavailable' || database.kind === 'conflict' || database.kind === 'overloaded') {
    logger.warn({ err: database, path }, 'database unavailable')
    return { status: 503, body: errorBody('database_unavailable', 'The database is unavailable; retry later') }
  }
  if (database.kind === 'refused_data') {
    logger.warn({ err: database, path }, 'request data refused by the database')
    return { status: 400, body: errorBody('invalid_payload', 'The database refused the request’s data') }
  }
  const { status } = error as { status?: unknown }
  if (typeof status === 'number' && status >= 400 && status < 500) {
    const code = BODY_ERROR_CODES[status] ?? 'invalid_payload'
    return { status, body: errorBody(code, (error as Error).message) }
  }
  logger.error({ err: loggableError(error), path }, 'unhandled error')
  return { status: 500, body: errorBody('internal_error', 'Internal error') }
}

// errors raised by Express's own body parsers and raw-body carry a status and a type
function bodyParserRefusal(error: unknown): { status: number; body: ErrorBody } | undefined {
  const { status, type } = (error ?? {}) as { status?: unknown; type?: unknown }
  if (typeof type !== 'string' || typeof status !== 'number' || status < 400 || status >= 500) return undefined
  // a form of more fields than its parser's parameterLimit: body-parser's 413, though the form may be small
  if (type === 'parameters.too.many') return { status: 400, body: errorBody('invalid_payload', 'The form has too many fields') }
  const incomplete = incompleteBody(error)
  if (incomplete) return { status: incomplete.status, body: errorBody(incomplete.code, incomplete.message) }
  return { status, body: errorBody(BODY_ERROR_CODES[status] ?? 'invalid_payload', (error as Error).message) }
}

/** Express's last middleware: every error in the one shape (errorAnswer). */
export function errorHandler(logger: Logger): ErrorRequestHandler {
  return (error, req, res, next) => {
    if (res.headersSent) return next(error)
    const { status, body, headers } = errorAnswer(error, logger, req.path)
    if (headers) res.set(headers)
    res.status(status).json(body)
  }
}
