// Typed failures of a partner API call. PartnerApiError: the platform answered with an error status.
// PartnerNetworkError / PartnerTimeoutError: no answer came (the request may or may not have taken
// effect). PartnerAnswerAbandonedError: the caller stopped waiting for it (as unknown as a timeout).
// PartnerValidationError: refused before anything was sent.

export class PartnerApiError extends Error {
  override name = 'PartnerApiError'
  /**
   * The answer's body, parsed when it was JSON (else its text): for a caller to read (the CLI shows a
   * refusal's `fields`). Not enumerable, so a logged error never carries it: the platform's body is up to
   * PARTNER_API_ANSWER_LIMIT of text from outside, and no log line may hold a raw body.
   */
  declare readonly body: unknown
  constructor(
    readonly status: number,
    /** The platform's error code when it sent one, else `http_<status>`. */
    readonly code: string,
    message: string,
    body: unknown,
    /** The answer's Retry-After, in ms from when it came: how long the platform asked us to wait. */
    readonly retryAfterMs?: number,
    /**
     * A 401 only: seconds the platform's clock is ahead of this machine's (negative: behind) by the answer's
     * Date header, set when that is more than CLOCK_OFFSET_THRESHOLD_S (clock-offset.ts): the likely reason
     * the request was refused, and named in the message.
     */
    readonly clockOffsetS?: number,
    /** A 3xx only: its Location header as it came (null: it had none), what the request carried taken out. Never followed. */
    readonly location?: string | null,
    /** How many times the call was sent, this answer's the last: more than 1 for a GET retried on 429 and 5xx. */
    readonly attempts = 1,
  ) {
    super(message)
    Object.defineProperty(this, 'body', { value: body, enumerable: false })
  }
}

export class PartnerNetworkError extends Error {
  override name = 'PartnerNetworkError'
}

/** The code of the error a proxy's closing the connection without answering CONNECT fails a call with. */
export const PROXY_CLOSED_CODE = 'PROXY_CLOSED_WITHOUT_ANSWER'

/**
 * No connection could be made (refused, the host name did not resolve, the TLS handshake failed), or the proxy
 * refused the tunnel: the request never left, so its outcome is known: nothing happened on the platform.
 */
export class PartnerNotSentError extends PartnerNetworkError {
  override name = 'PartnerNotSentError'
  /** The proxy the call went to (scheme://host:port), when it went through one. */
  readonly proxy: string | undefined
  /**
   * The failure repeats at every attempt until someone changes a setting (a refused certificate, a handshake
   * with no TLS version in common, a plain HTTP port): a GET is not sent again within the call.
   */
  readonly lasting: boolean
  /** Through a proxy: the proxy was reached and the failure was the platform's side of the tunnel (its TLS handshake). */
  readonly beyondProxy: boolean
  constructor(
    message: string,
    readonly url: string,
    readonly reason: string,
    {
      proxy,
      lasting = false,
      beyondProxy = false,
      ...options
    }: ErrorOptions & { proxy?: string | undefined; lasting?: boolean | undefined; beyondProxy?: boolean | undefined } = {},
  ) {
    super(message, options)
    this.proxy = proxy
    this.lasting = lasting
    this.beyondProxy = beyondProxy
  }
}

/**
 * The caller stopped the call (the operator's second stop signal, its abort's reason, which is this error's cause)
 * while its connection to the platform was still being set up (a SYN unanswered, a handshake under way) or the request
 * still queued for one: not one byte of it was written. Unlike a caller's giving up on an answer to a request sent
 * (PartnerAnswerAbandonedError), its outcome is known: nothing happened on the platform.
 */
export class PartnerStoppedBeforeSentError extends PartnerNotSentError {
  override name = 'PartnerStoppedBeforeSentError'
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

/**
 * The caller stopped waiting for the answer to a request already sent (an operator's second Ctrl-C, see
 * src/cli/hold-signals-for-call.ts), given as the reason of the call's abort signal. Like a timeout: the
 * request may have reached the platform and taken effect.
 */
export class PartnerAnswerAbandonedError extends Error {
  override name = 'PartnerAnswerAbandonedError'
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

/**
 * True when the outcome of a call that changes something is unknown: it may have reached the platform and taken
 * effect. No answer came (a timeout, a lost connection, the caller stopped waiting), the answer could not be read,
 * or it was a 5xx: the spec's base URL is a gateway in front of the platform, and its 502 or 504, or a server
 * that failed part-way, says nothing of whether the call was done behind it. Nor does an answer that is neither a
 * success nor a 4xx refusal: a 3xx (redirects are not followed, and a 303 says "done, see there"; it was taken as
 * a refusal, and the same create run again opened a second trade) or a 1xx left as the final answer.
 */
export function isOutcomeUnknown(error: unknown): boolean {
  if (error instanceof PartnerNotSentError) return false
  return (
    error instanceof PartnerNetworkError ||
    error instanceof PartnerTimeoutError ||
    error instanceof PartnerAnswerAbandonedError ||
    isServerError(error) ||
    (error instanceof PartnerApiError && error.status < 400)
  )
}

/**
 * A call to the platform that failed there or on the way: an error answer, no answer (a timeout, a lost connection,
 * one never set up, the caller stopped waiting) or one not read. What it wraps is the platform's or its proxy's,
 * never the database's (database-errors.ts).
 */
export function isPlatformFailure(
  error: unknown,
): error is PartnerApiError | PartnerNetworkError | PartnerTimeoutError | PartnerAnswerAbandonedError {
  return (
    error instanceof PartnerApiError ||
    error instanceof PartnerNetworkError ||
    error instanceof PartnerTimeoutError ||
    error instanceof PartnerAnswerAbandonedError
  )
}

/** A 5xx answer: the platform, or a gateway in front of it, failed while the call was at it. */
export function isServerError(error: unknown): error is PartnerApiError {
  return error instanceof PartnerApiError && error.status >= 500
}

/**
 * The platform answered with a success status but a body that is not what the endpoint returns: not JSON,
 * JSON with a key twice in one object (two answers in one: the key is named, cut at 100 characters), or a
 * field we rely on missing or mistyped (`field` names it, e.g. `trade.status`). The body is never copied into
 * the error, so no log line carries it. The call may well have taken effect, so it counts as an unknown
 * outcome, not as a refusal.
 */
export class PartnerInvalidResponseError extends PartnerNetworkError {
  override name = 'PartnerInvalidResponseError'
  readonly code = 'invalid_response'
  constructor(
    message: string,
    readonly status: number,
    /** Path of the first field at fault, or `(body)` when the body is not a JSON object. */
    readonly field: string,
  ) {
    super(message)
  }
}
