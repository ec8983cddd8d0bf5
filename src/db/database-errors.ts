// The one place that decides what a database error means for whoever asked:
// - unavailable: the database is not there right now (connection refused, reset or cut, a timeout,
//   SQLSTATE class 08 connection exception, 53 insufficient resources, 57P operator intervention such as
//   a shutdown or pg_terminate_backend, 57014 a statement cancelled by its timeout, 25006 a write refused
//   because the database is read-only: a standby, a failover under way, or default_transaction_read_only,
//   which some hosted Postgres services set when its disk fills, 55000 refusing a new session because a DBA closed
//   the database to connections, ALTER DATABASE … ALLOW_CONNECTIONS false, for maintenance). Try again later:
//   HTTP 503.
// - conflict: class 40, the database rolled the transaction back to break a deadlock or a serialization
//   conflict with another replica. Written again it succeeds (group-commit.ts does so); if it still
//   fails, "try again later" is the truth: HTTP 503.
// - overloaded: our own ingest queue is full. Also "try again later": HTTP 503 `overloaded`.
// - schema_missing: a table is not there (42P01 undefined_table; also what a statement meets when the schema itself
//   was dropped), or a column of one (42703 undefined_column). The service's own statements name only the tables and
//   columns its migrations made, so in a running service this is a database replaced under it or being restored
//   (between createdb and the end of pg_restore), one restored from an older build's dump (before the migration that
//   added the column) or in part, or one changed by hand: an operator's to fix (finish the restore, or run `migrate`),
//   and then it passes. HTTP 503 `schema_missing` with a Retry-After, and /readyz not ready, never a 500; the service
//   does not migrate a database it finds empty or behind while it runs (the restore under way would then fail on
//   tables it made).
// - refused_data: the database refused the input as data (class 22 data exception, e.g. 22P02 for a
//   lone surrogate in a JSON string or 22P05 for \u0000; 23 integrity constraint; 54 program limit such
//   as a value too large to index). The sender's fault: retrying cannot help, so never a 503.
// - failure: anything else (our SQL or code is wrong): HTTP 500, logged.
//
// Postgres errors carry `detail`, `where`, `internalQuery` and sometimes a message quoting the value it
// refused: for a refused delivery those hold the delivery's fields. Log lines use describeDatabaseError(),
// which keeps only the code, its class and a fixed message.
//
// A connection refused or reset is the database's only where no other system's error holds it: a call to the
// platform that could not connect (to it or to a proxy) is a partner API error with Node's ECONNREFUSED among its
// causes, and is the platform's (fromPlatform below).

import { isPlatformFailure, PartnerValidationError } from '../partner-api/partner-api-error.js'
import { isRefusedCertificateCode } from '../tls-certificate.js'
import { AnswerBoundError } from './answer-bound.js'

export type DatabaseErrorKind = 'unavailable' | 'conflict' | 'overloaded' | 'schema_missing' | 'refused_data' | 'failure'

/** The ingest queue is full: the caller is asked to retry later. */
export class IngestOverloadedError extends Error {
  override name = 'IngestOverloadedError'
}

const UNAVAILABLE_NODE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENETDOWN',
])

// a server certificate the TLS layer refused: the driver cannot tell the database apart from an impostor
const TLS_NOT_OFFERED =
  'the database server does not take TLS, which DATABASE_URL asks for (sslmode): turn TLS on at the server, or leave sslmode out where the network between is trusted'
const TLS_CERTIFICATE_REFUSED =
  "the database's TLS certificate was not accepted: give DATABASE_URL the CA that signed it " +
  '(sslmode=verify-full&sslrootcert=/path/to/ca.pem, the CA bundle your provider publishes) and the host name on the certificate; ' +
  "node-postgres verifies under sslmode=require too"

// pg and PGlite report a lost or missing connection with these messages and no code
const UNAVAILABLE_MESSAGES =
  /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Query read timeout|PGlite is closed|PGlite instance is already closed|Connection ended|Cannot use a pool after calling end|Client was closed and is not queryable/i

/** How long a new connection to Postgres may take to be made and answered (every pool of open-database.ts). */
export const CONNECT_TIMEOUT_MS = 5_000

// pg-pool's words when its connect timeout ended a connection made but never answered (the server took the TCP
// connection and sent nothing back); the driver's own inner words for it are "Connection terminated unexpectedly"
const CONNECT_TIMED_OUT = 'Connection terminated due to connection timeout'

// pg.Client's own words when its connectionTimeoutMillis ended a connect: a client outside a pool (the lock's of a
// prune pass, open-database.ts holdLock), whose error reached the operator as a bare `timeout expired`
const CLIENT_CONNECT_TIMED_OUT = 'timeout expired'

/**
 * A client's connect given up on at its connect timeout, in pg-pool's words (isConnectTimeout), the client's own as
 * its cause, so that it is said as every other connection's is; any other error as it is.
 */
export function asConnectTimeout(error: unknown): unknown {
  return error instanceof Error && error.message === CLIENT_CONNECT_TIMED_OUT ? new Error(CONNECT_TIMED_OUT, { cause: error }) : error
}

/**
 * Whether a connection was given up on at the connect timeout: taken by something at the database's address that
 * never answered (a server stopped with SIGSTOP, a host gone under a firewall that keeps the port open, another
 * program on that port). Told apart from a connection cut, which the same inner words name.
 */
export function isConnectTimeout(error: unknown): boolean {
  let current = error
  for (let depth = 0; depth < 8 && current instanceof Error; depth++) {
    if (current.message === CONNECT_TIMED_OUT) return true
    current = current.cause
  }
  return false
}

// pg-pool's words when its wait for a connection to be given back or made ended at its connect timeout
// (connectionTimeoutMillis): none came in time
const POOL_WAIT_TIMED_OUT = 'timeout exceeded when trying to connect'

/**
 * Whether a pool's wait for a connection ended at its connect timeout: no connection given back in time, or a new one
 * made and never answered (isConnectTimeout).
 */
export function isPoolWaitTimeout(error: unknown): boolean {
  return (error instanceof Error && error.message === POOL_WAIT_TIMED_OUT) || isConnectTimeout(error)
}

/** What each SQLSTATE class means, in a fixed message: the log shows this, never Postgres's own text. */
const SQLSTATE_CLASSES: Record<string, { kind: DatabaseErrorKind; message: string }> = {
  '08': { kind: 'unavailable', message: 'connection exception' },
  '53': { kind: 'unavailable', message: 'insufficient resources' },
  '57': { kind: 'failure', message: 'operator intervention' },
  '40': { kind: 'conflict', message: 'transaction rolled back (deadlock or serialization conflict)' },
  '22': { kind: 'refused_data', message: 'data exception: the database refused a value' },
  '23': { kind: 'refused_data', message: 'integrity constraint violation' },
  '54': { kind: 'refused_data', message: 'program limit exceeded: a value is too large' },
  // what an operator's DATABASE_URL gets wrong: said so, rather than "refused the statement"
  '28': { kind: 'failure', message: 'the database refused the login: check the user and password of DATABASE_URL' },
  '3D': {
    kind: 'failure',
    message:
      "the database named in DATABASE_URL does not exist: create it (createdb NAME, or CREATE DATABASE NAME ENCODING 'UTF8' " +
      'TEMPLATE template0), or correct the path of DATABASE_URL',
  },
}

export interface DatabaseErrorDescription {
  kind: DatabaseErrorKind
  /** SQLSTATE (e.g. 22P02) or Node's error code (e.g. ECONNREFUSED), when there is one. */
  code?: string
  /** The SQLSTATE class (its first two characters). */
  sqlstateClass?: string
  /** A fixed message: never text from the database that could quote the input. */
  message: string
}

const SQLSTATE = /^[0-9A-Z]{5}$/

/** 25006 read_only_sql_transaction: the database takes no writes now (the rest of class 25 is our bug). */
export const READ_ONLY = '25006'

/** The SQLSTATE (or Node's code) of the error itself, not of what it wraps; undefined when it has none. */
export function errorCode(error: unknown): unknown {
  return (error as { code?: unknown } | null | undefined)?.code
}
/**
 * 55P03 lock_not_available: a lock wait ended at the role's or the database's lock_timeout (a DBA's setting),
 * another session holding what the statement needed; like a statement timeout, it passes (the rest of class 55
 * is our bug).
 */
const LOCK_TIMEOUT = '55P03'

/**
 * 55000 object_not_in_prerequisite_state in the FATAL report that ends a new session: the database is closed to
 * connections (ALTER DATABASE … ALLOW_CONNECTIONS false), which a DBA does for maintenance and undoes after. On a
 * statement, 55000 is our bug (currval before nextval, say). The report's severity is in the server's language;
 * the routine that refuses (CheckMyDatabase) names it in any.
 */
const CLOSED_TO_CONNECTIONS = '55000'
const closedToConnections = (code: string, error: Error) => {
  const { severity, routine } = error as { severity?: unknown; routine?: unknown }
  return code === CLOSED_TO_CONNECTIONS && (severity === 'FATAL' || routine === 'CheckMyDatabase')
}

/**
 * 42P01 undefined_table: one of the service's tables is not there. (3F000 invalid_schema_name is not among them: the
 * service's statements meet 42P01 when the schema is gone, and 3F000 comes from creating tables where the search_path
 * names no schema, which a start's migrations report with their own advice, migrate.ts.)
 */
const UNDEFINED_TABLE = '42P01'
/**
 * 42703 undefined_column: one of the service's tables lacks a column this build's statements name. It was answered 500
 * `internal_error` (found from outside: a database restored from a dump taken before migration 0019, which added
 * webhook_deliveries.order_version, refused every delivery so).
 */
export const UNDEFINED_COLUMN = '42703'
const SCHEMA_MISSING_CODES = new Set([UNDEFINED_TABLE, UNDEFINED_COLUMN])

/** The fixed words of a schema_missing error for a table (42P01): what the log line and the 503's message say. */
export const SCHEMA_MISSING_MESSAGE =
  "the service's tables are missing: the database was replaced or is being restored; finish the restore, or run `migrate` on an empty database"

/** The fixed words of a schema_missing error for a column (42703). */
export const SCHEMA_BEHIND_MESSAGE =
  "a column of the service's tables is missing: the database's schema is behind this build (restored from an older build's dump, or in part); finish the restore, or run `migrate`"

/** Whether a schema_missing error is a column's (42703) rather than a table's: the words differ, the answer does not. */
export function isColumnMissing(error: unknown): boolean {
  return describeDatabaseError(error).code === UNDEFINED_COLUMN
}

function sqlstateKind(code: string): DatabaseErrorKind {
  if (SCHEMA_MISSING_CODES.has(code)) return 'schema_missing'
  // 57P01 admin shutdown (pg_terminate_backend), 57P02 crash shutdown, 57P03 starting up, 57014 a
  // statement timeout; 57000 and the rest of class 57 are not an outage
  if (code.startsWith('57P') || code === '57014' || code === READ_ONLY || code === LOCK_TIMEOUT) return 'unavailable'
  return SQLSTATE_CLASSES[code.slice(0, 2)]?.kind ?? 'failure'
}

function sqlstateMessage(code: string, kind: DatabaseErrorKind): string {
  if (code === READ_ONLY) return 'the database is read-only (a standby, a failover under way, or default_transaction_read_only)'
  if (code === LOCK_TIMEOUT) return "a lock wait ended at the database's lock_timeout: another session held what the statement needed"
  if (kind === 'schema_missing') return code === UNDEFINED_COLUMN ? SCHEMA_BEHIND_MESSAGE : SCHEMA_MISSING_MESSAGE
  if (code === '42501') return 'permission denied: the user of DATABASE_URL lacks a privilege this statement needs (it creates and uses the tables of its schema)'
  const sqlstateClass = code.slice(0, 2)
  if (kind === 'unavailable' && sqlstateClass === '57')
    return 'the database ended or cancelled the statement (shutdown, terminated backend or timeout)'
  return SQLSTATE_CLASSES[sqlstateClass]?.message ?? 'the database refused the statement'
}

/** Classifies an error from the database layer (walking `cause` and an AggregateError's errors). */
export function describeDatabaseError(error: unknown): DatabaseErrorDescription {
  for (const current of errorChain(error)) {
    if (current instanceof IngestOverloadedError) {
      return { kind: 'overloaded', message: 'the ingest queue is full' }
    }
    // the bound asked for around the statement (answer-bound.ts: a console page's), not the pool's own wait
    if (current instanceof AnswerBoundError) {
      return { kind: 'unavailable', message: `the database did not answer within the ${current.boundMs} ms asked for` }
    }
    const code = (current as { code?: unknown }).code
    if (typeof code === 'string' && UNAVAILABLE_NODE_CODES.has(code)) {
      return { kind: 'unavailable', code, message: 'the database cannot be reached' }
    }
    if (isRefusedCertificateCode(code)) {
      return { kind: 'failure', code, message: TLS_CERTIFICATE_REFUSED }
    }
    // node-postgres's own words, and no code, when the server answers its SSLRequest with no
    if (current.message === 'The server does not support SSL connections') {
      return { kind: 'failure', code: 'tls_not_offered', message: TLS_NOT_OFFERED }
    }
    if (typeof code === 'string' && SQLSTATE.test(code) && isDatabaseReport(current)) {
      const sqlstateClass = code.slice(0, 2)
      if (closedToConnections(code, current)) {
        return { kind: 'unavailable', code, sqlstateClass, message: 'the database is closed to new connections (ALTER DATABASE … ALLOW_CONNECTIONS false: maintenance?)' }
      }
      const kind = sqlstateKind(code)
      return { kind, code, sqlstateClass, message: sqlstateMessage(code, kind) }
    }
    if (UNAVAILABLE_MESSAGES.test(current.message)) {
      return { kind: 'unavailable', message: 'the database connection was lost or timed out' }
    }
  }
  return { kind: 'failure', message: 'the statement failed' }
}

/**
 * describeDatabaseError for a connection made from another setting than DATABASE_URL (the listener's
 * DATABASE_LISTEN_URL): its advice names that setting, where the operator's mistake is.
 */
export function describeDatabaseErrorOf(error: unknown, setting: string): DatabaseErrorDescription {
  const description = describeDatabaseError(error)
  return { ...description, message: description.message.replaceAll('DATABASE_URL', setting) }
}

// A connection lost while a statement was on it (reset, closed under it, its answer not come in time): the statement
// may have run to its commit all the same, and only its answer was lost. (A refused or timed-out connect, a closed
// pool, a database's own report: nothing ran.)
const LOST_WITH_STATEMENT_MESSAGES = /Connection terminated unexpectedly|Query read timeout/i
const LOST_WITH_STATEMENT_CODES = new Set(['ECONNRESET', 'EPIPE', 'ETIMEDOUT'])

/** Whether `error` leaves a statement's outcome unknown: it may have committed, its answer lost on the way. */
export function outcomeUnknown(error: unknown): boolean {
  for (const current of errorChain(error)) {
    if (isDatabaseReport(current)) return false
    const code = (current as { code?: unknown }).code
    if (typeof code === 'string' && LOST_WITH_STATEMENT_CODES.has(code)) return true
    if (LOST_WITH_STATEMENT_MESSAGES.test(current.message)) return true
  }
  return false
}

export function isDatabaseUnavailable(error: unknown): boolean {
  return describeDatabaseError(error).kind === 'unavailable'
}

/** Whether a statement failed for a table of the service's, or a column of one, that is not there (describeDatabaseError). */
export function isSchemaMissing(error: unknown): boolean {
  return describeDatabaseError(error).kind === 'schema_missing'
}

export function isRefusedData(error: unknown): boolean {
  return describeDatabaseError(error).kind === 'refused_data'
}

/**
 * What a log line may say about an error: for a database's report, only its classification (the report
 * may quote the delivery), with the message of our own error that wrapped it; for anything else (a bug),
 * the error itself, stack included. The logger applies this to every `err` it is given.
 */
export function loggableError(error: unknown): unknown {
  if (!(error instanceof Error)) return error
  const fromDatabase = [...errorChain(error)].some((current) => {
    const code = (current as { code?: unknown }).code
    return isDatabaseReport(current) || (typeof code === 'string' && UNAVAILABLE_NODE_CODES.has(code))
  })
  const description = describeDatabaseError(error)
  if (!fromDatabase && description.kind === 'failure') return error
  const wrapped = !isDatabaseReport(error) && !UNAVAILABLE_MESSAGES.test(error.message)
  return { ...description, ...(wrapped && fromDatabase ? { context: error.message } : {}) }
}

/** The database's own report in `error`'s chain (its SQLSTATE and its words), or undefined when there is none. */
export function databaseReport(error: unknown): { code: string; message: string } | undefined {
  for (const current of errorChain(error)) {
    if (isDatabaseReport(current)) return { code: String((current as { code?: unknown }).code), message: current.message }
  }
  return undefined
}

// pg's DatabaseError and PGlite's error both carry the server's `severity` beside the SQLSTATE
function isDatabaseReport(error: Error): boolean {
  const fields = error as { severity?: unknown; code?: unknown }
  return typeof fields.code === 'string' && SQLSTATE.test(fields.code) && typeof fields.severity === 'string'
}

// the partner API client's errors (src/partner-api/): what they wrap is the platform's or its proxy's, never the database's
function fromPlatform(error: unknown): boolean {
  return isPlatformFailure(error) || error instanceof PartnerValidationError
}

/** The error and its causes, down to where another system's error begins (that one and what it wraps left out). */
function* errorChain(error: unknown, depth = 0): Generator<Error> {
  if (!(error instanceof Error) || depth > 8 || fromPlatform(error)) return
  yield error
  if (error instanceof AggregateError) for (const inner of error.errors) yield* errorChain(inner, depth + 1)
  yield* errorChain(error.cause, depth + 1)
}
