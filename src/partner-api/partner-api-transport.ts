// One signed call of the partner API (spec section 5): sign, send, time out, retry, and turn the answer into
// a checked record or a typed error (partner-api-error.ts).
//
// Only GET is retried: on network errors, timeouts, 429 and 5xx, with capped exponential backoff and equal
// jitter, or after the answer's Retry-After when it is longer. A 429 holds the whole client for that wait: a call
// answered 429 while another call's wait runs is not retried (slowDown). A POST carries no idempotency key, so a second send could
// create or move a trade twice; the caller decides (see src/trades/open-trade-for-order.ts). A failure that
// repeats until a setting changes (a refused certificate, a TLS handshake that cannot succeed) is not retried,
// nor is an answer that came but is not the record (too large, not UTF-8, not decodable, not valid).
//
// An answer is read up to `maxAnswerBytes` and no further: past it the connection is closed and the call
// fails with PartnerInvalidResponseError, so an answer without an end (a proxy's stream, a broken gateway)
// cannot fill the process's memory within the timeout.
//
// A success answer is UTF-8 or refused: JSON exchanged between systems is UTF-8 (RFC 8259 §8.1), and a record
// that moves money is acted on only as the platform wrote it, never as a guess. One whose Content-Type names
// another charset, or whose bytes are not UTF-8, fails with PartnerInvalidResponseError; an error answer is
// read as before (bad bytes as U+FFFD), since only its status is acted on. Its Content-Encoding, likewise, is one
// this client undoes (content-coding.ts: gzip, deflate, br, strictly) or the answer is refused.
//
// Every answer's Date header is read against this machine's clock (clock-offset.ts) and handed to
// `onClockOffset` (the metrics' gauge): a drifting clock shows there before the platform's window refuses
// our timestamps, and a 401 past the threshold names the offset in its message.
import tls from 'node:tls'
import { anySignal } from 'any-signal'
import { parse as parseContentType } from 'content-type'
import type { z } from 'zod'
import type { Clock } from '../clock.js'
import { AnswerNotUtf8Error, readAnswer } from '../http/read-answer.js'
import { parseRetryAfter } from '../http/retry-after.js'
import type { Logger } from '../logger.js'
import { printable } from '../printable.js'
import { shortened } from '../shortened.js'
import { answeredWithoutTls, failedHandshakeCode, OWN_CA_HINT, refusedCertificateCode } from '../tls-certificate.js'
import { userAgent } from '../version.js'
import { findDuplicateKey, shownKey } from '../webhooks/find-duplicate-key.js'
import { describeClockOffset, isClockOffsetTooLarge, measureClockOffset } from './clock-offset.js'
import { abortedBeforeSent, connectFailure } from './connect-failure.js'
import { ACCEPT_ENCODING, MAX_CODINGS, tooManyCodings, undecodedCoding } from './content-coding.js'
import {
  PartnerApiError,
  PartnerInvalidResponseError,
  PartnerNetworkError,
  PartnerNotSentError,
  PartnerStoppedBeforeSentError,
  PartnerTimeoutError,
  PROXY_CLOSED_CODE,
} from './partner-api-error.js'
import { directPlatformFetch } from './platform-fetch.js'
import { checkResponse, type CheckedResponse, platformErrorBodySchema } from './responses.js'
import { newNonce, signRequest } from './sign-request.js'

export const PARTNER_API_PREFIX = '/api/partner/v1'

export interface RetryOptions {
  /** Attempts of a GET in all, the first included. */
  maxAttempts: number
  baseDelayMs: number
  maxDelayMs: number
  /** A Retry-After longer than this is not waited out inside the call: the 429/503 is thrown instead. */
  maxRetryAfterMs: number
}

export const DEFAULT_RETRY: RetryOptions = {
  maxAttempts: 4,
  baseDelayMs: 200,
  maxDelayMs: 5_000,
  maxRetryAfterMs: 60_000,
}

/**
 * The longest a GET can take with no Retry-After asked: every attempt runs to the timeout, and the backoff between
 * them is the longest its jitter allows.
 */
export function longestGetMs(timeoutMs: number, retry: RetryOptions = DEFAULT_RETRY): number {
  let backoffs = 0
  for (let attempt = 1; attempt < retry.maxAttempts; attempt++) backoffs += Math.min(retry.maxDelayMs, retry.baseDelayMs * 2 ** (attempt - 1))
  return retry.maxAttempts * timeoutMs + backoffs
}

/** The longest a GET can take at all: as longestGetMs, each wait between attempts the longest Retry-After waited out. */
export function longestGetWithRetryAfterMs(timeoutMs: number, retry: RetryOptions = DEFAULT_RETRY): number {
  return retry.maxAttempts * timeoutMs + (retry.maxAttempts - 1) * Math.max(retry.maxRetryAfterMs, retry.maxDelayMs)
}

export interface TransportOptions {
  /** The platform's {base_url}; a path prefix (https://gw.example/partner) is kept and signed. */
  baseUrl: string
  keyId: string
  secret: string
  /** Per attempt: from sending the request to the last byte of the answer. */
  timeoutMs: number
  /** The most of an answer's body read, decoded; 1 MiB by default. */
  maxAnswerBytes?: number
  clock: Clock
  logger: Logger
  /** By default the client's own (platform-fetch.ts); one given (tests) is trusted to decode what it accepts. */
  fetch?: typeof fetch
  /**
   * The proxy `fetch` goes through, as scheme://host:port (no credentials): named in the errors, where a
   * refused connection or a refused tunnel is the proxy's, not the platform's.
   */
  proxy?: string
  /** Jitter source in [0, 1); tests pass a fixed value. */
  random?: () => number
  /** Nonce source; defaults to 16 random bytes, hex. */
  nonce?: () => string
  retry?: Partial<RetryOptions>
  /**
   * Called with the whole seconds the platform's clock is ahead of this machine's (negative: behind) for each
   * answer with a readable Date header, whatever its status. Date has whole seconds: on two good clocks this
   * reads 0 or ±1.
   */
  onClockOffset?: (offsetS: number) => void
  /**
   * Called before a GET is sent again, with why (`no answer within 10000 ms`, `answered 503 maintenance`, on one line),
   * the wait and the attempt about to be made: a command tells its operator why a read takes 18 s.
   */
  onRetry?: (retry: RetryNotice) => void
}

export interface RetryNotice {
  method: Method
  path: string
  /** Why the last attempt did not do: a failure's message or `answered <status> <code>`, on one line. */
  reason: string
  waitMs: number
  /** The attempt about to be made, counted from 1. */
  attempt: number
  maxAttempts: number
}

export interface CallOptions {
  /** Aborts the call (and any backoff wait); the call rejects with the signal's reason. */
  signal?: AbortSignal
}

export type Method = 'GET' | 'POST'

/** A trade record is a few kB; an answer larger than this is not one. */
export const DEFAULT_MAX_ANSWER_BYTES = 1024 * 1024

interface RawAnswer {
  status: number
  headers: Headers
  text: string
  /** What the request carried that an answer may not echo (ourWordsOut): its signature, nonce, key id and body, and our secret. */
  sent?: readonly string[]
}

export class PartnerApiTransport {
  readonly baseUrl: string
  readonly timeoutMs: number
  readonly maxAnswerBytes: number
  private readonly origin: string
  private readonly pathPrefix: string
  private readonly keyId: string
  private readonly secret: string
  private readonly clock: Clock
  private readonly logger: Logger
  private readonly fetch: typeof fetch
  readonly proxy: string | undefined
  private readonly random: () => number
  private readonly nonce: () => string
  /** The same on every request: read once. */
  private readonly userAgent = userAgent()
  private readonly retry: RetryOptions
  private readonly onClockOffset: ((offsetS: number) => void) | undefined
  private readonly onRetry: ((retry: RetryNotice) => void) | undefined
  /** Until when (the clock's ms) the platform's last 429 asked this client to wait (slowDown). */
  private slowedUntil = 0

  constructor(options: TransportOptions) {
    let base: URL
    try {
      base = new URL(options.baseUrl)
    } catch (error) {
      throw new Error(`Partner API base URL "${options.baseUrl}" is not a URL`, { cause: error })
    }
    if (base.protocol !== 'http:' && base.protocol !== 'https:') {
      throw new Error(`Partner API base URL "${options.baseUrl}" must be http(s)`)
    }
    if (!(options.timeoutMs > 0)) throw new Error('Partner API timeoutMs must be a positive number')
    const maxAnswerBytes = options.maxAnswerBytes ?? DEFAULT_MAX_ANSWER_BYTES
    if (!(maxAnswerBytes > 0)) throw new Error('Partner API maxAnswerBytes must be a positive number')
    this.origin = base.origin
    this.pathPrefix = base.pathname.replace(/\/+$/, '')
    this.baseUrl = `${this.origin}${this.pathPrefix}`
    this.keyId = options.keyId
    this.secret = options.secret
    this.timeoutMs = options.timeoutMs
    this.maxAnswerBytes = maxAnswerBytes
    this.clock = options.clock
    this.logger = options.logger
    this.fetch = options.fetch ?? directPlatformFetch()
    this.proxy = options.proxy
    this.random = options.random ?? Math.random
    this.nonce = options.nonce ?? newNonce
    this.retry = { ...DEFAULT_RETRY, ...options.retry }
    this.onClockOffset = options.onClockOffset
    this.onRetry = options.onRetry
  }

  /**
   * Sends `payload` (JSON) to `apiPath` under the API prefix and answers the 2xx body checked by `schema`, or by a
   * check of its own where the endpoint answers one of two records (responses.ts, checkMilestoneAnswer).
   */
  async call<T>(
    method: Method,
    apiPath: string,
    payload: object | undefined,
    schema: AnswerCheck<T>,
    { signal }: CallOptions = {},
  ): Promise<T> {
    const url = new URL(this.origin)
    url.pathname = `${this.pathPrefix}${PARTNER_API_PREFIX}${apiPath}`
    // the signed path is the path as sent, prefix included
    const path = url.pathname
    // serialized once: these exact bytes are signed and sent
    const body = payload === undefined ? undefined : JSON.stringify(payload)
    const maxAttempts = method === 'GET' ? Math.max(1, this.retry.maxAttempts) : 1

    for (let attempt = 1; ; attempt++) {
      signal?.throwIfAborted()
      let answer: RawAnswer
      try {
        answer = await this.send(method, url, path, body, attempt, signal)
      } catch (error) {
        if (!isTransient(error) || attempt >= maxAttempts) throw error
        const waitMs = this.backoffMs(attempt)
        const reason = printable((error as Error).message.replace(`${method} ${path}`, '').replace(/^:? */, ''))
        this.onRetry?.({ method, path, reason, waitMs, attempt: attempt + 1, maxAttempts })
        await this.clock.sleep(waitMs, signal)
        continue
      }

      const offsetS = this.readClockOffset(answer.headers)
      if (answer.status >= 200 && answer.status < 300) return parseSuccess(method, path, answer, schema)

      const retryAfterMs = parseRetryAfter(answer.headers.get('retry-after'), this.clock.now(), answer.headers.get('date'))
      const error = toApiError(method, path, answer, retryAfterMs, offsetS, attempt)
      const retryable = answer.status === 429 || answer.status >= 500
      if (!retryable) throw error
      // the longer of the Retry-After and the backoff: `Retry-After: 0` (or none) is no leave to ask again at once
      const waitMs = Math.max(retryAfterMs ?? 0, this.backoffMs(attempt))
      if (answer.status === 429 && this.slowDown(waitMs)) throw error
      if (attempt >= maxAttempts) throw error
      if (retryAfterMs !== undefined && retryAfterMs > this.retry.maxRetryAfterMs) throw error
      this.onRetry?.({ method, path, reason: `answered ${answer.status} ${printable(error.code)}`, waitMs, attempt: attempt + 1, maxAttempts })
      await this.clock.sleep(waitMs, signal)
    }
  }

  /** One signed attempt with a fresh timestamp and nonce, bounded by the timeout. */
  private async send(
    method: Method,
    url: URL,
    path: string,
    body: string | undefined,
    attempt: number,
    callerSignal: AbortSignal | undefined,
  ): Promise<RawAnswer> {
    const headers: Record<string, string> = {
      ...signRequest({
        method,
        path,
        timestamp: Math.floor(this.clock.now() / 1000),
        nonce: this.nonce(),
        body: body ?? '',
        keyId: this.keyId,
        secret: this.secret,
      }),
      Accept: 'application/json',
      // what content-coding.ts undoes, on every Node version (Node's fetch asks for zstd where it has it)
      'Accept-Encoding': ACCEPT_ENCODING,
      'User-Agent': this.userAgent,
    }
    if (body !== undefined) headers['Content-Type'] = 'application/json'
    // a header carries bytes: fetch refuses a value with a character past U+00FF, or a line feed, before sending
    // anything ("Cannot convert argument to a ByteString"), which read as a request that may have gone out
    const unsendable = Object.keys(headers).find((name) => !HEADER_VALUE.test(headers[name]!))
    if (unsendable !== undefined) {
      const setting = unsendable === 'X-Partner-Key-Id' ? ' (PARTNER_API_KEY_ID)' : ''
      const reason = `its ${unsendable} header${setting} holds a character a header cannot carry`
      throw new PartnerNotSentError(`${method} ${path} was not sent: ${reason}`, this.baseUrl, reason, { proxy: this.proxy, lasting: true })
    }

    // the timer runs on the injected clock, so a test times a call out by advancing a fake clock
    const timeout = new AbortController()
    const finished = new AbortController()
    this.clock.sleep(this.timeoutMs, finished.signal).then(
      () => timeout.abort(),
      () => {},
    )
    // (anySignal, not AbortSignal.any: see eslint.config.js)
    const signal = anySignal([timeout.signal, callerSignal])
    const startedAt = this.clock.now()
    const log = (fields: Record<string, unknown>) =>
      this.logger.debug(
        { method, path, attempt, durationMs: this.clock.now() - startedAt, ...fields },
        'partner api call',
      )
    // a 401 whose head came: the platform's answer on our credentials, kept if the caller aborts while its body comes
    let refusedHead: Response | undefined
    try {
      // redirect: manual, so a signed body is never re-sent to another address
      const response = await this.fetch(url, { method, headers, body, signal, redirect: 'manual' })
      if (response.status === 401) refusedHead = response
      const succeeded = response.status >= 200 && response.status < 300
      const coding = succeeded ? undecodedCoding(response.headers.get('content-encoding')) : undefined
      if (coding !== undefined) {
        // a coding not asked for: the bytes cannot be read as the record (nor are they read as if plain)
        await response.body?.cancel().catch(() => {})
        log({ status: response.status, error: 'answer encoding unknown' })
        throw invalidRecord(
          method,
          path,
          response.status,
          '(body)',
          `is in the Content-Encoding ${shownHeaderValue(coding)}, which this client does not decode (it accepts ${ACCEPT_ENCODING})`,
        )
      }
      const codings = succeeded ? tooManyCodings(response.headers.get('content-encoding')) : undefined
      if (codings !== undefined) {
        // refused by its header, as fetch refuses it: the body is not read, nor decoded layer by layer
        await response.body?.cancel().catch(() => {})
        log({ status: response.status, error: 'answer in too many encodings' })
        throw invalidRecord(method, path, response.status, '(body)', `is in ${codings} Content-Encodings, more than the ${MAX_CODINGS} this client undoes`)
      }
      const charset = succeeded ? foreignCharset(response.headers.get('content-type')) : undefined
      if (charset !== undefined) {
        // refused by its header: the body is not read
        await response.body?.cancel().catch(() => {})
        log({ status: response.status, error: 'answer not UTF-8' })
        throw invalidRecord(method, path, response.status, '(body)', `is declared in the charset ${shownHeaderValue(charset)}, not UTF-8`)
      }
      let text: string | undefined
      try {
        text = await readAnswer(response, this.maxAnswerBytes, { fatal: succeeded })
      } catch (error) {
        if (error instanceof AnswerNotUtf8Error) {
          log({ status: response.status, error: 'answer not UTF-8' })
          throw invalidRecord(method, path, response.status, '(body)', 'is not valid UTF-8')
        }
        const decoding = undecodableBodyCode(error)
        if (decoding === undefined) throw error
        // the platform did answer, with bytes that are not what its Content-Encoding says: they would be the
        // same at the next attempt. A refusal stands on its status, as one whose body is not JSON does
        log({ status: response.status, error: 'answer not decodable', reason: decoding })
        if (!succeeded) return { status: response.status, headers: response.headers, text: '' }
        const encoding = shownHeaderValue(response.headers.get('content-encoding') ?? '')
        throw invalidRecord(method, path, response.status, '(body)', `could not be decoded as its Content-Encoding ${encoding} says (${decoding})`)
      }
      if (text === undefined && response.status >= 400 && response.status < 500) {
        // read up to the cap, the rest not: a refusal stands on its status, as one whose body cannot be decoded does
        // (a 4xx with a 2 MiB page marked a create unknown, though the platform had said no). A 5xx or 3xx that large
        // fails as below, not retried: it says no more of the outcome than the failure does
        log({ status: response.status, error: 'answer too large: its status alone is read' })
        return { status: response.status, headers: response.headers, text: '' }
      }
      if (text === undefined) {
        log({ status: response.status, error: 'answer too large' })
        throw new PartnerInvalidResponseError(
          `${method} ${path}: the platform answered ${response.status} with a body larger than ` +
            `${this.maxAnswerBytes.toLocaleString('en-US')} bytes, the most this client reads; the rest was not read`,
          response.status,
          '(body)',
        )
      }
      log({ status: response.status })
      if (succeeded) return { status: response.status, headers: response.headers, text }
      // the secret is never sent, but an answer that holds it (a misconfigured gateway's dump) is no better to print
      const sent = [headers['X-Partner-Signature'] ?? '', headers['X-Partner-Nonce'] ?? '', this.keyId, body ?? '', this.secret]
      return { status: response.status, headers: response.headers, text, sent }
    } catch (error) {
      if (error instanceof PartnerInvalidResponseError) throw error
      if (timeout.signal.aborted && abortedBeforeSent(error)) {
        // the connection was never up (a SYN unanswered, a handshake stalled) or the request still queued for one:
        // nothing was written, so nothing can have happened on the platform
        log({ error: 'timeout', reason: 'not sent: no connection' })
        const reason = `no connection within ${this.timeoutMs.toLocaleString('en-US')} ms, so the request was not written`
        throw new PartnerNotSentError(`${method} ${path} was not sent: ${reason}`, this.baseUrl, reason, { cause: error, proxy: this.proxy })
      }
      if (callerSignal?.aborted && abortedBeforeSent(error)) {
        // the caller stopped it (the operator's second stop signal) before its connection was up: nothing was written,
        // so nothing can have happened on the platform. Its abort's reason, a giving up on an answer, read as an
        // outcome unknown and marked a create unknown that had never left
        log({ error: 'aborted', reason: 'not sent: no connection' })
        const reason = 'stopped before the connection to the platform was up, so the request was not written'
        throw new PartnerStoppedBeforeSentError(`${method} ${path} was not sent: ${reason}`, this.baseUrl, reason, {
          cause: callerSignal.reason,
          proxy: this.proxy,
        })
      }
      if (timeout.signal.aborted) {
        log({ error: 'timeout' })
        const through = this.proxy ? ` (through the proxy ${this.proxy})` : ''
        throw new PartnerTimeoutError(
          `${method} ${path}: no answer within ${this.timeoutMs} ms${through}`,
          this.timeoutMs,
        )
      }
      if (callerSignal?.aborted && refusedHead) {
        // the caller stopped (a cycle stopping, a shutdown) as the answer's body came: the 401 stands on its status,
        // as a refusal whose body cannot be read does, and is not reported as a call aborted
        log({ status: refusedHead.status, error: 'body not read: the call was aborted' })
        return { status: refusedHead.status, headers: refusedHead.headers, text: '' }
      }
      if (callerSignal?.aborted) {
        log({ error: 'aborted' })
        throw callerSignal.reason
      }
      const { reason, notSent, lasting, beyondProxy } = this.proxy ? describeProxyError(error, this.proxy, url) : describeNetworkError(error)
      log({ error: 'network', reason })
      if (notSent) {
        throw new PartnerNotSentError(`${method} ${path} was not sent: ${reason}`, this.baseUrl, reason, {
          cause: error,
          proxy: this.proxy,
          lasting,
          beyondProxy,
        })
      }
      throw new PartnerNetworkError(`${method} ${path} failed: ${reason}`, { cause: error })
    } finally {
      finished.abort()
      signal.clear()
    }
  }

  /** The platform's clock against ours by the answer's Date header (undefined without one), reported to the hook. */
  private readClockOffset(headers: Headers): number | undefined {
    const offsetS = measureClockOffset(headers.get('date'), this.clock.now())
    if (offsetS !== undefined) this.onClockOffset?.(offsetS)
    return offsetS
  }

  /**
   * A 429 is the platform's limit on this client, not on one call: it holds the client for `waitMs` (the longer of its
   * Retry-After and the backoff). Answers true when another call's 429 already holds it: this call's 429 is then not
   * retried but thrown (the poller stops its cycle on it), so calls in flight together do not each spend their
   * attempts on a platform that asked them all to slow down; the call that met the 429 first retries after its wait.
   */
  private slowDown(waitMs: number): boolean {
    const now = this.clock.now()
    const held = now < this.slowedUntil
    this.slowedUntil = Math.max(this.slowedUntil, now + waitMs)
    return held
  }

  /** Capped exponential backoff with equal jitter: half the step fixed, half random. */
  private backoffMs(attempt: number): number {
    const step = Math.min(this.retry.maxDelayMs, this.retry.baseDelayMs * 2 ** (attempt - 1))
    return Math.round(step / 2 + (this.random() * step) / 2)
  }
}

/** A success answer that is not the record the endpoint returns: `field` names what is at fault, `problem` how. */
function invalidRecord(method: Method, path: string, status: number, field: string, problem: string): PartnerInvalidResponseError {
  return new PartnerInvalidResponseError(
    `${method} ${path}: the platform answered ${status} with a body that is not the expected record (${field} ${problem})`,
    status,
    field,
  )
}

/** The most of a header value from outside (a charset, a Content-Encoding) shown in an error (its message is logged and printed). */
const MAX_SHOWN_HEADER_VALUE_LENGTH = 40

// the value as the header has it, quoted and on one line: a header value may hold any byte but CR, LF and NUL
const shownHeaderValue = (value: string) => printable(JSON.stringify(shortened(value, MAX_SHOWN_HEADER_VALUE_LENGTH)))

/**
 * The charset a Content-Type names when it is not UTF-8 ("utf-8" or "utf8" in any case, quoted or not), or
 * undefined: no charset, UTF-8, or a header the media-type parser cannot read (the bytes are still checked as
 * UTF-8). Of two charsets, the first counts, as the parser reads it.
 */
function foreignCharset(contentType: string | null): string | undefined {
  if (contentType === null) return undefined
  let charset: string | undefined
  try {
    charset = parseContentType(contentType).parameters.charset
  } catch {
    return undefined
  }
  return charset === undefined || /^utf-?8$/i.test(charset) ? undefined : charset
}

/** How a 2xx body is checked: against one schema, or by a function that picks the record (it never throws). */
export type AnswerCheck<T> = z.ZodType<T> | ((body: unknown) => CheckedResponse<T>)

function parseSuccess<T>(method: Method, path: string, answer: RawAnswer, schema: AnswerCheck<T>): T {
  const invalid = (field: string, problem: string) => invalidRecord(method, path, answer.status, field, problem)
  let json: unknown
  try {
    json = JSON.parse(answer.text)
  } catch {
    throw invalid('(body)', 'is not JSON')
  }
  // JSON.parse keeps the last of a key's values and another reader the first: `"status":"funded","status":
  // "released"` is two answers, and which one the platform meant cannot be told, so neither is acted on
  const duplicateKey = findDuplicateKey(answer.text, json)
  if (duplicateKey !== undefined) throw invalid('(body)', `holds the key ${shownKey(duplicateKey)} twice in one object`)
  // JSON.parse reads any depth, but whatever writes the record out again (JSON.stringify for --json, the
  // database, a log) recurses and runs out of stack: `trades fund --json` printed "Maximum call stack size
  // exceeded" and exited 1 for a fund it had recorded
  if (nestingDepth(json) > MAX_ANSWER_DEPTH) throw invalid('(body)', `nests deeper than ${MAX_ANSWER_DEPTH} levels`)
  const checked = typeof schema === 'function' ? schema(json) : checkResponse(schema, json)
  if (!checked.ok) throw invalid(checked.problem.field, checked.problem.message)
  return checked.value
}

/** A record of the API nests a few levels (trade, milestones, an item, a dispute); far more is not one. */
export const MAX_ANSWER_DEPTH = 64

/** How deep arrays and objects nest in a parsed JSON value, counted without recursion. */
function nestingDepth(value: unknown): number {
  let deepest = 0
  const stack: [unknown, number][] = [[value, 0]]
  while (stack.length > 0) {
    const [current, depth] = stack.pop()!
    if (current === null || typeof current !== 'object') continue
    deepest = Math.max(deepest, depth + 1)
    if (deepest > MAX_ANSWER_DEPTH) return deepest
    for (const inner of Object.values(current)) stack.push([inner, depth + 1])
  }
  return deepest
}

function toApiError(
  method: Method,
  path: string,
  answer: RawAnswer,
  retryAfterMs: number | undefined,
  offsetS: number | undefined,
  attempts: number,
): PartnerApiError {
  // what the request carried is taken out of the answer's text before anything is read of it: the error keeps the
  // body for the CLI, which quotes its message, its fields and, in another shape, the text itself
  const text = ourWordsOut(answer.text, answer.sent ?? [])
  let body: unknown = text
  try {
    const json: unknown = JSON.parse(text)
    // a key twice: which code and message the platform meant cannot be told, so the text is kept, as for no JSON
    if (findDuplicateKey(text, json) === undefined) body = wordsOutOfParsed(json, (value) => ourWordsOut(value, answer.sent ?? []))
  } catch {
    // not JSON (a proxy's HTML page): keep the text
  }
  const parsed = platformErrorBodySchema.safeParse(body)
  const platform = parsed.success ? parsed.data.error : undefined
  // the platform's words, bounded: the message is logged and printed, and the answer may be a megabyte
  const words = (value: string, most: number) => shortened(value, most)
  const code = platform?.code ? words(platform.code, MAX_PLATFORM_CODE_LENGTH) : `http_${answer.status}`
  const detail = platform?.message ? `: ${words(platform.message, MAX_PLATFORM_MESSAGE_LENGTH)}` : ''
  // a refused signature whose answer shows the clocks far apart: the timestamp, not the key, is likely at fault
  const clockOffsetS = answer.status === 401 && isClockOffsetTooLarge(offsetS) ? offsetS : undefined
  const clock = clockOffsetS === undefined ? '' : `; ${describeClockOffset(clockOffsetS)}`
  // a redirect is never followed: where it points is kept for the CLI to show (a base URL that is not the platform's)
  const redirect = answer.status >= 300 && answer.status < 400
  const locationHeader = answer.headers.get('location')
  const location = locationHeader === null ? null : ourWordsOut(locationHeader, answer.sent ?? [])
  return new PartnerApiError(
    answer.status,
    code,
    `${method} ${path} answered ${answer.status} ${code}${detail}${clock}`,
    body,
    retryAfterMs,
    clockOffsetS,
    redirect ? location : undefined,
    attempts,
  )
}

// What the request carried, echoed back in an answer's error code or message (a gateway that quotes the request it
// refused): the message is logged and printed, and no log line may hold a signature or a request body. Each is
// taken out where it appears whole, and so is anything shaped like a signature (64 hex digits).
const ECHO_MIN_LENGTH = 8
const SIGNATURE_SHAPED = /\b(?:sha256=)?[0-9a-f]{64}\b/gi

function ourWordsOut(text: string, sent: readonly string[]): string {
  let words = text
  for (const value of sent) {
    if (value.length < ECHO_MIN_LENGTH) continue
    // as sent, and as a JSON string holds it (the body quoted inside the platform's message: `{\"title\":…}`)
    for (const form of new Set([value, JSON.stringify(value).slice(1, -1)])) words = words.replaceAll(form, '[from our request]')
  }
  return words.replace(SIGNATURE_SHAPED, '[64 hex digits]')
}

/**
 * `json` (fresh from JSON.parse) with `scrub` applied to each of its strings, keys included, in place and without
 * recursion (a refusal may nest 100,000 deep). The text was scrubbed before it was parsed, but a JSON string may
 * spell a character as `\u0061`: only the parsed value shows what a reader of it would see.
 */
function wordsOutOfParsed(json: unknown, scrub: (value: string) => string): unknown {
  if (typeof json === 'string') return scrub(json)
  const stack: unknown[] = [json]
  while (stack.length > 0) {
    const current = stack.pop()
    if (current === null || typeof current !== 'object') continue
    const record = current as Record<string, unknown>
    for (const key of Object.keys(record)) {
      const value = record[key]
      const shown = typeof value === 'string' ? scrub(value) : value
      if (shown !== null && typeof shown === 'object') stack.push(shown)
      const shownKey = Array.isArray(record) ? key : scrub(key)
      if (shownKey !== key) delete record[key]
      // defined, not assigned: an own key "__proto__" (JSON.parse makes one) assigned to would set the prototype
      Object.defineProperty(record, shownKey, { value: shown, writable: true, enumerable: true, configurable: true })
    }
  }
  return json
}

// what a header value may hold as fetch sends it: Latin-1, without CR, LF or NUL
const HEADER_VALUE = /^[^\r\n\0\u0100-\uffff]*$/

/** The most of the platform's error code and message an error keeps (its message is logged and printed). */
export const MAX_PLATFORM_CODE_LENGTH = 100
export const MAX_PLATFORM_MESSAGE_LENGTH = 500

// failures before a connection existed: not one byte of the request went out ('bad port': a port fetch
// refuses to connect to at all)
const NOT_SENT_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'bad port'])

interface NetworkFailure {
  reason: string
  /** True when not one byte of the request left this machine. */
  notSent: boolean
  /** True when the next attempt would fail the same way: a setting must change first. */
  lasting?: boolean
  /** Through a proxy: true when the proxy was reached and the platform's side failed. */
  beyondProxy?: boolean
}

/**
 * Whether a failed attempt of a GET is worth another: a lost connection or a timeout may pass, and a refused
 * connection too (a platform restarting); a refused certificate, a failed handshake, or an answer that came but is
 * not the record (too large, not UTF-8, not decodable) would be the same at the next attempt.
 */
function isTransient(error: unknown): boolean {
  if (error instanceof PartnerTimeoutError) return true
  if (error instanceof PartnerInvalidResponseError) return false
  // the caller stopped it: no attempt follows, a GET's included
  if (error instanceof PartnerStoppedBeforeSentError) return false
  if (error instanceof PartnerNotSentError) return !error.lasting
  return error instanceof PartnerNetworkError
}

// tls.DEFAULT_MIN_VERSION and _MAX_VERSION ("TLSv1.2", "TLSv1.3") as a person writes them
const acceptedTlsVersions = () =>
  `TLS ${tls.DEFAULT_MIN_VERSION.replace('TLSv', '')} to ${tls.DEFAULT_MAX_VERSION.replace('TLSv', '')}`

function describeNetworkError(error: unknown): NetworkFailure {
  if (!(error instanceof Error)) return { reason: String(error), notSent: false }
  // the handshake failed: not one byte of the request went out, and the next attempt would fail the same way
  const certificate = refusedCertificateCode(error)
  if (certificate !== undefined) {
    return { reason: `the platform's TLS certificate was not accepted (${certificate}); ${OWN_CA_HINT}`, notSent: true, lasting: true }
  }
  const handshake = failedHandshakeCode(error)
  if (handshake !== undefined) {
    const reason = answeredWithoutTls(error)
      ? `the platform answered without TLS (${handshake}): its port takes plain HTTP; give the base URL http://, or https:// with the platform's TLS port`
      : `the TLS handshake with the platform failed (${handshake}): it shares no TLS version or cipher with this machine, which speaks ${acceptedTlsVersions()}`
    return { reason, notSent: true, lasting: true }
  }
  const cause = error.cause as { code?: string; message?: string } | undefined
  const reason = cause?.code ?? cause?.message ?? error.message
  if (NOT_SENT_CODES.has(reason)) return { reason, notSent: true }
  // any other failure of a connection not yet up (a reset during the TLS handshake): the request was not
  // written, and the next attempt may well connect
  if (connectFailure(error) !== undefined) return { reason: `the connection could not be set up (${reason})`, notSent: true }
  return { reason, notSent: false }
}

/**
 * The code of the decoder that failed on the answer's body (content-coding.ts undoes its Content-Encoding): zlib's
 * for gzip and deflate (`Z_DATA_ERROR`, `Z_BUF_ERROR` for a body without its end), brotli's
 * (`ERR__ERROR_FORMAT_PADDING_2`); undefined for any other failure, a connection lost mid-body among them
 * (`UND_ERR_SOCKET`), which may pass and is retried.
 */
function undecodableBodyCode(error: unknown): string | undefined {
  for (const cause of causes(error)) {
    const code = (cause as { code?: unknown }).code
    if (typeof code === 'string' && /^(Z_|ERR__ERROR_)/.test(code)) return code
  }
  return undefined
}

// undici's words when the proxy answers CONNECT with anything but 200 (a cause or two below fetch's TypeError)
const TUNNEL_REFUSED = /^Proxy response \((\d+)\) !== 200 when HTTP Tunneling$/

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|localhost|\[::1\])$/i

/**
 * A failure through a proxy. The client connects to the proxy, and the proxy to the platform: a failed connection
 * to the proxy is the proxy's (an https:// proxy's certificate among them), a refusal of the tunnel (407, 403, 502)
 * means the request never left, and a failure inside the tunnel (the TLS handshake with the platform) is the
 * platform's, as without a proxy.
 */
function describeProxyError(error: unknown, proxy: string, target: URL): NetworkFailure {
  const tunnel = causes(error)
    .map((cause) => TUNNEL_REFUSED.exec(cause.message))
    .find((match) => match !== null)
  if (tunnel) {
    const status = Number(tunnel[1])
    const hint =
      status === 407
        ? 'the proxy wants credentials, or refused the ones in the proxy URL (http://user:password@host:port)'
        : LOOPBACK.test(target.hostname)
          ? `${target.hostname} is this machine: add it to NO_PROXY`
          : `the proxy does not reach ${target.host}, or does not allow it`
    return { reason: `the proxy ${proxy} answered ${status} to CONNECT ${target.host} (${hint})`, notSent: true }
  }
  if (causes(error).some((cause) => (cause as { code?: unknown }).code === PROXY_CLOSED_CODE)) {
    const hint = 'is it an https:// proxy, or no proxy at all?'
    return { reason: `the proxy ${proxy} closed the connection without answering CONNECT ${target.host} (${hint})`, notSent: true }
  }
  if (connectFailure(error)?.target === 'proxy') {
    const certificate = refusedCertificateCode(error)
    if (certificate !== undefined) {
      const hint = certificate === 'ERR_TLS_CERT_ALTNAME_INVALID' ? 'give the proxy URL a host its certificate names' : OWN_CA_HINT
      return { reason: `the TLS certificate of the proxy ${proxy} was not accepted (${certificate}); ${hint}`, notSent: true, lasting: true }
    }
    const { reason, lasting } = describeNetworkError(error)
    return { reason: `could not connect to the proxy ${proxy} (${reason})`, notSent: true, lasting }
  }
  const { reason, notSent, lasting } = describeNetworkError(error)
  return { reason: `${reason} (through the proxy ${proxy})`, notSent, lasting, beyondProxy: true }
}

function causes(error: unknown): Error[] {
  const chain: Error[] = []
  for (let at = error; at instanceof Error && chain.length < 8; at = at.cause) chain.push(at)
  return chain
}
