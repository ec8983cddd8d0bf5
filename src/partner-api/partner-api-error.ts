// Typed failures of a partner API call. PartnerApiError: the platform answered with an error status.
// PartnerNetworkError / PartnerTimeoutError: no answer came (the request may or may not have taken
// effect). PartnerValidationError: refused before anything was sent.

export class PartnerApiError extends Error {
  override name = 'PartnerApiError'
  constructor(
    readonly status: number,
    /** The platform's error code when it sent one, else `http_<status>`. */
    readonly code: string,
    message: string,
    readonly body: unknown,
  ) {
    super(message)
  }
}

export class PartnerNetworkError extends Error {
  override name = 'PartnerNetworkError'
}

export class PartnerTimeoutError extends Error {
  override name = 'PartnerTimeoutError'
  constructor(
    message: string,
    readonly timeoutMs: number,
  ) {
    super(message)
  }
}

export class PartnerValidationError extends Error {
  override name = 'PartnerValidationError'
  constructor(
    /** The request field at fault, e.g. `reason` or `split_buyer_pct`. */
    readonly field: string,
    message: string,
  ) {
    super(`${field}: ${message}`)
  }
}

/** True when the outcome of the call is unknown: it may have reached the platform and taken effect. */
export function isOutcomeUnknown(error: unknown): boolean {
  return error instanceof PartnerNetworkError || error instanceof PartnerTimeoutError
}

/**
 * The platform answered with a success status but a body that is not what the endpoint returns (not JSON,
 * or missing the record's id). The call may well have taken effect, so it counts as an unknown outcome.
 */
export class PartnerInvalidResponseError extends PartnerNetworkError {
  override name = 'PartnerInvalidResponseError'
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message)
  }
}
