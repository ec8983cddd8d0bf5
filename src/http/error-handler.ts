import type { ErrorRequestHandler, RequestHandler } from 'express'
import { describeDatabaseError, loggableError } from '../db/database-errors.js'
import type { Logger } from '../logger.js'
import { AppError, errorBody } from './app-error.js'

export function notFoundHandler(): RequestHandler {
  return (req, res) => {
    res.status(404).json(errorBody('not_found', `No route for ${req.method} ${req.path}`))
  }
}

/** Turns every error into {"error":{"code","message"}}; never a stack trace in the body. */
export function errorHandler(logger: Logger): ErrorRequestHandler {
  return (error, req, res, next) => {
    if (res.headersSent) return next(error)
    if (error instanceof AppError) {
      res.status(error.status).json(errorBody(error.code, error.message))
      return
    }
    const database = describeDatabaseError(error)
    if (database.kind === 'unavailable' || database.kind === 'conflict' || database.kind === 'overloaded') {
      logger.warn({ err: database, path: req.path }, 'database unavailable')
      res.status(503).json(errorBody('database_unavailable', 'The database is unavailable; retry later'))
      return
    }
    if (database.kind === 'refused_data') {
      logger.warn({ err: database, path: req.path }, 'request data refused by the database')
      res.status(400).json(errorBody('invalid_payload', 'The database refused the request’s data'))
      return
    }
    // errors raised by Express's own body parsers and raw-body carry a status and a type
    const status = (error as { status?: unknown }).status
    if (typeof status === 'number' && status >= 400 && status < 500) {
      const code =
        status === 413 ? 'payload_too_large' : status === 408 ? 'request_timeout' : 'invalid_payload'
      res.status(status).json(errorBody(code, (error as Error).message))
      return
    }
    logger.error({ err: loggableError(error), path: req.path }, 'unhandled error')
    res.status(500).json(errorBody('internal_error', 'Internal error'))
  }
}
