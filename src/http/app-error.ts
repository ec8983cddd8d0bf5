// The one error class the HTTP layer answers with: a status and a code from a closed list. Anything
// else that reaches the error middleware is a logged 500 with no detail in the body.
export type ErrorCode =
  | 'invalid_signature'
  | 'payload_too_large'
  | 'body_incomplete'
  | 'invalid_payload'
  | 'unsupported_media_type'
  | 'unsupported_transfer_coding'
  | 'expectation_failed'
  | 'database_unavailable'
  | 'schema_missing'
  | 'overloaded'
  | 'storage_low'
  | 'not_ready'
  | 'not_found'
  | 'method_not_allowed'
  | 'request_timeout'
  | 'header_too_large'
  | 'duplicate_header'
  | 'http_version_not_supported'
  | 'event_handler_failed'
  | 'invalid_command_token'
  | 'internal_error'

export class AppError extends Error {
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options)
    this.name = 'AppError'
  }
}

export interface ErrorBody {
  error: { code: ErrorCode; message: string }
}

export function errorBody(code: ErrorCode, message: string): ErrorBody {
  return { error: { code, message } }
}
