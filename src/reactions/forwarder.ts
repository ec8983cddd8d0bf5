// The built-in forwarder: a reaction handler that POSTs each event to the partner's own system
// (FORWARD_URL), signed per the Standard Webhooks specification (https://www.standardwebhooks.com), so
// the receiver verifies it with any Standard Webhooks library and deduplicates by `webhook-id`.
//
// - webhook-id: the event id, the same on every retry of the event;
// - webhook-timestamp: unix seconds when this attempt is sent (a retry is signed afresh);
// - webhook-signature: `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, the key being the
//   base64-decoded part of FORWARD_SECRET (`whsec_<base64>`).
// A 2xx answer is success; any other answer, a redirect, a timeout, no connection or an answer that is not
// HTTP throws a ForwardError, and the dispatcher retries the job. Except a 410 Gone: the specification's word
// for "this endpoint is gone, stop sending", so its error is `permanent` and the job is failed at once
// (plan-retry.ts). A failed answer's Retry-After (whole seconds or an
// HTTP-date, read as the partner API client reads the platform's: http/retry-after.ts) goes with its error as
// `retryAfterMs`: the retry comes no earlier than the receiver asked, up to the backoff's cap (plan-retry.ts).
// A receiver that was reached but answered with something undici cannot read as HTTP (a bad status line,
// headers past undici's limit, no HTTP at all) is forward_bad_answer, not forward_unreachable: the network
// is fine, the receiver is what to look at.
// The answer's status is its outcome, as the specification has it: its body is drained, not read, and a body
// that passes MAX_DRAINED_BYTES or is still coming at the attempt's deadline has its connection closed, the
// status standing. No error or log line holds the body, the secret or the signature.
import { createHmac, createSecretKey, type KeyObject } from 'node:crypto'
import { isClockOffsetTooLarge, measureClockOffset } from '../partner-api/clock-offset.js'
import { type Clock, MAX_TIMER_MS, monotonicNow, systemClock } from '../clock.js'
import { createAbortWatch } from './abort-watch.js'
import { createDeadlines } from './deadlines.js'
import { parseRetryAfter } from '../http/retry-after.js'
import type { Logger } from '../logger.js'
import { printable } from '../printable.js'
import { OWN_CA_HINT, refusedCertificateCode } from '../tls-certificate.js'
import { undici } from '../lazy-packages.js'
import { userAgent } from '../version.js'
import { forwardedPayload, type ReactionHandler } from './reaction-event.js'
import { ReactionSetupError } from './reaction-setup-error.js'

export const WEBHOOK_SECRET_PREFIX = 'whsec_'
/** The specification asks for secrets of 24 to 64 bytes; fewer is refused. */
export const MIN_WEBHOOK_SECRET_BYTES = 24

const SECRET_FORM = `${WEBHOOK_SECRET_PREFIX}<base64 of ${MIN_WEBHOOK_SECRET_BYTES}+ bytes>`

// standard base64 with its padding, as the specification's libraries decode it
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/

/** The key bytes of a `whsec_<base64>` secret; undefined when it is not one or is shorter than 24 bytes (webhookSecretFault says which). */
export function decodeWebhookSecret(secret: string): Buffer | undefined {
  return webhookSecretFault(secret) === undefined ? Buffer.from(secret.slice(WEBHOOK_SECRET_PREFIX.length), 'base64') : undefined
}

/**
 * What is wrong with a secret, told by its form and never its value (for the start-up refusal, which said the same of
 * each, and for decodeWebhookSecret); undefined when it is a good one.
 */
export function webhookSecretFault(secret: string): string | undefined {
  if (!secret.startsWith(WEBHOOK_SECRET_PREFIX)) return `does not start with ${WEBHOOK_SECRET_PREFIX}`
  const encoded = secret.slice(WEBHOOK_SECRET_PREFIX.length)
  if (!BASE64.test(encoded)) {
    if (/^[A-Za-z0-9_-]+=*$/.test(encoded) && /[_-]/.test(encoded)) {
      return `is URL-safe base64 after ${WEBHOOK_SECRET_PREFIX} (- or _): write it in standard base64 (+ and /)`
    }
    if (/^[A-Za-z0-9+/]+$/.test(encoded) && encoded.length % 4 !== 1) return `lacks its base64 padding after ${WEBHOOK_SECRET_PREFIX} (= or ==)`
    return `is not base64 after ${WEBHOOK_SECRET_PREFIX} (standard base64: A-Z a-z 0-9 + /, = padded)`
  }
  const bytes = Buffer.from(encoded, 'base64').length
  if (bytes < MIN_WEBHOOK_SECRET_BYTES) return `is too short: its base64 holds ${bytes} bytes, and at least ${MIN_WEBHOOK_SECRET_BYTES} are needed`
  return undefined
}

/**
 * The secrets of FORWARD_SECRET: one `whsec_…`, or several separated by spaces or commas while the receiver moves
 * from one to the next (each attempt is signed with every one, as the specification's rotation has it).
 */
export function forwardSecrets(value: string): string[] {
  return value.split(/[\s,]+/).filter((secret) => secret !== '')
}

/**
 * The `webhook-signature` value for one attempt: `v1,<base64>`. Pure; `secret` is the `whsec_...` form.
 * Throws when the secret is not a valid one (config.ts refuses such a secret at start-up).
 */
export function signStandardWebhook(secret: string, id: string, timestamp: number, body: string): string {
  const key = decodeWebhookSecret(secret)
  if (!key) throw new Error(`the secret is not ${SECRET_FORM}`)
  return signWithKey(createSecretKey(key), id, timestamp, Buffer.from(body))
}

// the body's bytes as they are sent, after the id and timestamp: the same bytes as `${id}.${timestamp}.${body}`
// without building that string and encoding the body a second time
const signWithKey = (key: KeyObject, id: string, timestamp: number, body: Buffer) =>
  `v1,${createHmac('sha256', key).update(`${id}.${timestamp}.`).update(body).digest('base64')}`

// the reasons a request is stopped with (an abort without one builds a DOMException each time): the attempt timed
// out, or its answer's body is longer than worth draining
const TIMED_OUT = new Error('the forward attempt timed out')
const BODY_TOO_LONG = new Error('the forward answer has a body longer than it is worth draining')

/** The most of an answer's body drained to keep its connection (an error page is tens of kB); past it the connection is closed. */
export const MAX_DRAINED_BYTES = 1024 * 1024

// forward_gone: the receiver answered 410 Gone, and the job is failed without another attempt;
// forward_bad_answer: the receiver was reached, but what it sent back is not HTTP that undici reads
export type ForwardErrorCode =
  | 'forward_failed'
  | 'forward_gone'
  | 'forward_timeout'
  | 'forward_unreachable'
  | 'forward_bad_answer'
  | 'forward_aborted'

export class ForwardError extends Error {
  override name = 'ForwardError'
  constructor(
    readonly code: ForwardErrorCode,
    message: string,
    /** The receiver's answer, for forward_failed and forward_gone. */
    readonly status?: number,
    options?: ErrorOptions & {
      /** How long the receiver asked us to wait (its Retry-After), in ms from its answer: the dispatcher's retry waits for it. */
      retryAfterMs?: number | undefined
      /** No later attempt can succeed: the dispatcher fails the job at once, whatever attempts are left (plan-retry.ts). */
      permanent?: boolean | undefined
    },
  ) {
    super(message, options)
    this.retryAfterMs = options?.retryAfterMs
    this.permanent = options?.permanent ?? false
  }

  readonly retryAfterMs: number | undefined
  readonly permanent: boolean
}

export interface ForwarderOptions {
  /** FORWARD_URL */
  url: string
  /** FORWARD_SECRET, `whsec_<base64>`, or several of them separated by spaces or commas */
  secret: string
  /**
   * Per attempt: from sending the request to the end of its answer. An answer whose status came in time stands
   * even if its body is still coming then (its connection is closed).
   */
  timeoutMs: number
  /** Sends through this fetch instead of undici's connection pool (whose requests cost a fraction of fetch's CPU). */
  fetch?: typeof fetch
  clock?: Clock
  /**
   * The service's logger: when it does not log debug lines, an attempt makes no logger of its own (the
   * handler context's is made on first use). Without it, every attempt logs through its context's.
   */
  logger?: Logger
}

export function createForwarder({
  url,
  secret,
  timeoutMs,
  fetch: fetchImplementation,
  clock = systemClock,
  logger: serviceLogger,
}: ForwarderOptions): ReactionHandler {
  // Checked here as config.ts checks FORWARD_URL and FORWARD_SECRET: a fork's second target (createForwarder in
  // partner-handlers.ts) is set up in code, past those checks. Neither value is quoted: either may hold a secret.
  const target = typeof url === 'string' && URL.canParse(url) ? new URL(url) : undefined
  if (!target || (target.protocol !== 'http:' && target.protocol !== 'https:')) {
    throw new ReactionSetupError('forward_url_invalid', 'the forward URL must be an http:// or https:// URL')
  }
  const keysBytes = typeof secret === 'string' ? forwardSecrets(secret).map(decodeWebhookSecret) : []
  if (keysBytes.length === 0 || keysBytes.some((keyBytes) => !keyBytes)) {
    throw new ReactionSetupError(
      'forward_secret_invalid',
      `the forward secret is not ${SECRET_FORM} (or several, separated by spaces or commas): make one with \`echo "whsec_$(openssl rand -base64 32)"\``,
    )
  }
  // made once: an HMAC made from a key object does not take the key's bytes in again for every event
  const keys = keysBytes.map((keyBytes) => createSecretKey(keyBytes!))
  if (!(typeof timeoutMs === 'number' && Number.isFinite(timeoutMs) && timeoutMs > 0 && timeoutMs <= MAX_TIMER_MS)) {
    throw new ReactionSetupError('forward_timeout_invalid', `the forward timeout must be a number of milliseconds above 0 and at most ${MAX_TIMER_MS}`)
  }
  // errors and logs name the receiver by origin only: a path or query may carry a token of its own
  const receiver = target.origin
  // a user and password in the URL are sent as Basic authorization, as curl does: neither the origin the pool
  // connects to nor the path it sends holds them, so they would be dropped and every event answered 401
  const authorization = basicAuthorization(target)
  const agent = userAgent()
  const post = fetchImplementation ? postWithFetch(fetchImplementation, target) : postWithPool(target)
  const deadlines = createDeadlines(clock, timeoutMs)
  const aborts = createAbortWatch<PostRequest>()
  const logsAttempts = serviceLogger?.isLevelEnabled('debug') ?? true

  const forward: ReactionHandler = async function forward(event, context) {
    const { signal } = context
    // serialised and encoded once: the signature and the request take the same bytes
    const body = Buffer.from(JSON.stringify(forwardedPayload(event)))
    const timestamp = Math.floor(clock.now() / 1000)
    // name, value, name, value ...: undici's own form, which it takes without making an object of it
    const headers = [
      'content-type',
      'application/json',
      'webhook-id',
      event.eventId,
      'webhook-timestamp',
      String(timestamp),
      'webhook-signature',
      // several secrets (a rotation): one signature each, space-separated, any of which the receiver may check
      keys.length === 1 ? signWithKey(keys[0]!, event.eventId, timestamp, body) : keys.map((key) => signWithKey(key, event.eventId, timestamp, body)).join(' '),
      'user-agent',
      agent,
    ]
    if (authorization) headers.push('authorization', authorization)

    const startedAt = monotonicNow(clock)
    // (the handler's logger names the job, its event id and attempt: said again here, each key came twice in the line).
    // Forwarded is a 2xx answer; a 500 or no answer was logged "reaction forwarded" too
    const log = (fields: { status?: number; error?: string; reason?: string }) =>
      context.logger.debug(
        { type: event.type, receiver, durationMs: monotonicNow(clock) - startedAt, ...fields },
        fields.status !== undefined && fields.status >= 200 && fields.status <= 299 ? 'reaction forwarded' : 'reaction forward failed',
      )
    // the request ends at its answer, or when the handler's signal is aborted (lease ended, shutdown), or at
    // its deadline. The deadlines share one timer on the injected clock, so a test can time an attempt out
    // without waiting; they are timed by its monotonic time, so a wall clock stepped back does not stretch them
    // without waiting. (A timer and an AbortController per attempt, and the pool's promise API with its answer
    // stream, cost 23 µs of CPU per forwarded event: a median 133 µs against 110 in bench/results/forward-drain.md)
    const request = post(headers, body)
    aborts.add(signal, request)
    let timedOut = false
    const deadline = deadlines.add(() => {
      timedOut = true
      request.abort(TIMED_OUT)
    })
    try {
      const status = await request.answer
      if (logsAttempts) log({ status })
      if (status < 200 || status > 299) {
        const failure = failedAnswer(receiver, status, request, clock.now())
        // (the job's failure is logged too, as every failed job's is; this line says what to fix)
        if (failure.permanent) context.logger.warn({ receiver, status }, 'forward receiver answered 410 Gone: the job is failed without retrying; fix FORWARD_URL or the receiver, then retry the failed jobs')
        throw failure
      }
    } catch (error) {
      if (error instanceof ForwardError) throw error
      if (timedOut) {
        if (logsAttempts) log({ error: 'timeout' })
        const message = `the forward receiver ${receiver} did not answer within ${timeoutMs} ms`
        throw new ForwardError('forward_timeout', message)
      }
      if (signal.aborted) {
        if (logsAttempts) log({ error: 'aborted' })
        const message = `forwarding to ${receiver} was stopped (lease ended or shutting down)`
        throw new ForwardError('forward_aborted', message, undefined, { cause: signal.reason })
      }
      const notHttp = describeNotHttp(error)
      if (notHttp !== undefined) {
        if (logsAttempts) log({ error: 'bad_answer', reason: notHttp })
        const message = `the forward receiver ${receiver} answered with something that is not HTTP: ${notHttp}`
        throw new ForwardError('forward_bad_answer', message, undefined, { cause: error })
      }
      const reason = describeNetworkError(error)
      if (logsAttempts) log({ error: 'unreachable', reason })
      const certificate = refusedCertificateCode(error)
      const message =
        certificate === undefined
          ? `the forward receiver ${receiver} is unreachable: ${reason}`
          : `the forward receiver ${receiver} is unreachable: its TLS certificate was not accepted (${certificate}); ${OWN_CA_HINT}`
      throw new ForwardError('forward_unreachable', message, undefined, { cause: error })
    } finally {
      aborts.delete(signal, request)
      deadlines.delete(deadline)
    }
  }
  // it times its attempts out itself (forward_timeout): the dispatcher sets no deadline of its own at the same time
  return Object.assign(forward, { ownTimeoutMs: timeoutMs })
}

const GONE = 410
// past a day a wait in seconds is hard to read, and far past any wait between attempts (the backoff's cap)
const LONGEST_WAIT_SHOWN_MS = 24 * 60 * 60 * 1000

/**
 * forward_failed for an answer that is not a 2xx, with the wait its Retry-After asks for (on any status: the
 * answer is retried whatever it is, and a receiver that asks for a wait wants no call before it). The message
 * says until when, for the operator who reads it on the job; a Retry-After that is neither whole seconds nor an
 * HTTP-date is said to be ignored, without its value (it is the receiver's text). A 410 is forward_gone, and
 * permanent: the receiver said it is gone, and no wait makes it come back.
 */
function failedAnswer(receiver: string, status: number, { retryAfter, date }: Pick<PostRequest, 'retryAfter' | 'date'>, nowMs: number): ForwardError {
  if (status === GONE) {
    const message = `the forward receiver ${receiver} answered 410 Gone: it asks for no more events, so the job is failed without retrying`
    return new ForwardError('forward_gone', message, status, { permanent: true })
  }
  const redirect = status >= 300 && status <= 399 ? ' (redirects are not followed)' : ''
  let message = `the forward receiver ${receiver} answered ${status}${redirect}`
  const retryAfterMs = parseRetryAfter(retryAfter, nowMs)
  if (retryAfterMs !== undefined) {
    const until = new Date(nowMs + retryAfterMs)
    // (a wait past the year 275760 is no date)
    const when = Number.isNaN(until.getTime()) ? '' : `, until ${until.toISOString()}`
    // (99999999999999999999999 seconds would read "1e+23 s")
    const wait = retryAfterMs > LONGEST_WAIT_SHOWN_MS ? 'longer than a day' : `${Math.ceil(retryAfterMs / 1000)} s`
    message += ` and asked to wait ${wait} (Retry-After)${when}`
  } else if (retryAfter !== undefined) {
    message += '; its Retry-After is neither whole seconds nor an HTTP-date, and is ignored'
  }
  message += receiverClockNote(status, date, nowMs)
  return new ForwardError('forward_failed', message, status, { retryAfterMs })
}

// what a receiver answers a signature or timestamp it refuses (the Standard Webhooks libraries throw, and the
// receiver's code answers 400, 401 or 403)
const TIMESTAMP_REFUSALS = new Set([400, 401, 403])

/**
 * A refusal (400, 401, 403) from a receiver whose clock (its answer's Date) is more than a minute from this machine's: each event
 * is signed with this machine's time (webhook-timestamp), and Standard Webhooks receivers refuse one more than 5
 * minutes off, so every forward failed "answered 400" with nothing pointing at the clock (an outside review, a replica
 * 600 s ahead). Said on the job's error, where the operator reads why it failed; the offset alone, never the Date's text.
 */
function receiverClockNote(status: number, date: string | undefined, nowMs: number): string {
  if (!TIMESTAMP_REFUSALS.has(status) || date === undefined) return ''
  const offsetS = measureClockOffset(date, nowMs)
  if (!isClockOffsetTooLarge(offsetS)) return ''
  const direction = offsetS > 0 ? 'ahead of' : 'behind'
  return (
    `; the receiver's clock is ${Math.abs(offsetS)} s ${direction} this machine's (its Date header): each event's ` +
    "webhook-timestamp is this machine's time, which receivers refuse when it is more than 5 minutes off: check this machine's clock (NTP), or the receiver's"
  )
}

/** `Basic <base64 of user:password>` from the URL's user and password (percent-decoded); undefined without them. */
function basicAuthorization(target: URL): string | undefined {
  if (!target.username && !target.password) return undefined
  const decode = (part: string) => {
    try {
      return decodeURIComponent(part)
    } catch {
      // a malformed escape: sent as written
      return part
    }
  }
  return `Basic ${Buffer.from(`${decode(target.username)}:${decode(target.password)}`).toString('base64')}`
}

/**
 * One POST on its way: `answer` resolves to the answer's status once its body is drained, and rejects when
 * the request fails or `abort` is called before the answer's head came (the attempt timed out, or the
 * handler's signal was aborted). Once the head came, its status is the answer however the body ends: drained
 * to its end, cut past MAX_DRAINED_BYTES, aborted, or its connection lost. Never follows a redirect.
 * `retryAfter`: the answer's Retry-After as sent, once `answer` resolved to a status that is not a 2xx (a
 * 2xx's is not looked for).
 */
interface PostRequest {
  answer: Promise<number>
  readonly retryAfter: string | undefined
  /** The answer's Date as sent, looked for as Retry-After is: on an answer that is not a 2xx. */
  readonly date: string | undefined
  abort: (reason: unknown) => void
}
/** headers: name, value, name, value ... */
type Post = (headers: string[], body: Buffer) => PostRequest

// undici's connection pool to the receiver's origin, one per forwarder, its connections kept alive, driven
// through its dispatch interface: no answer stream, promise wrapper or async resource per request. A forwarded
// event costs about 68 µs of CPU through the pool's request(), against 90 µs through node:http's keep-alive
// agent (bench/results/latest.md). A redirect is an answer like any other, never followed. The answer's body is
// not ours to read: it is let through and dropped, which returns the connection to the pool
function postWithPool(target: URL): Post {
  const pool = new (undici().Pool)(target.origin)
  const path = `${target.pathname}${target.search}`
  return (headers, body) => {
    const request = new PoolRequest()
    pool.dispatch({ path, method: 'POST', headers, body }, request)
    return request
  }
}

/**
 * One request through the pool: both undici's handler of its progress and the attempt's PostRequest, one
 * object with its methods on the prototype rather than a handler and a request made of closures each time.
 */
class PoolRequest implements PostRequest {
  readonly answer: Promise<number>
  private resolve!: (status: number) => void
  private reject!: (error: unknown) => void
  // the answer came, the request failed, or the attempt was aborted: a promise settles once
  private ended = false
  // the answer's status, once its head came (0 before)
  private status = 0
  // the answer's Retry-After and Date, looked for once its head came with a status that is not a 2xx
  retryAfter: string | undefined
  date: string | undefined
  private drained = 0
  // undici's abort of the request on its connection, from the moment it is on one
  private abortRequest: ((reason: Error) => void) | undefined
  private abortedWith: Error | undefined

  constructor() {
    this.answer = new Promise<number>((resolve, reject) => {
      this.resolve = resolve
      this.reject = reject
    })
  }

  // the attempt ends at once; the request, once on a connection, is stopped there (its connection closed)
  abort(reason: unknown): void {
    if (this.ended) return
    this.abortedWith = reason instanceof Error ? reason : new Error(String(reason))
    this.end(reason)
    this.abortRequest?.(this.abortedWith)
  }

  onConnect(abort: (reason: Error) => void): void {
    if (this.abortedWith) abort(this.abortedWith)
    else this.abortRequest = abort
  }

  onHeaders(statusCode: number, headers: Buffer[]): boolean {
    // an interim answer (103 Early Hints, 102 Processing): undici hands it over too, and the final one follows on
    // the same request. Taken as the status, a receiver that sent a 103 and then closed or never answered had
    // its attempt failed as "answered 103" (forward_failed) instead of unreachable or timed out
    if (statusCode < 200) return true
    this.status = statusCode
    if (statusCode > 299) {
      this.retryAfter = findHeader(headers, RETRY_AFTER)
      this.date = findHeader(headers, DATE)
    }
    return true
  }

  onData(chunk: Buffer): boolean {
    this.drained += chunk.length
    if (this.drained > MAX_DRAINED_BYTES) this.abortRequest?.(BODY_TOO_LONG)
    return true
  }

  onComplete(): void {
    this.end(undefined)
  }

  onError(error: Error): void {
    this.end(error)
  }

  private end(error: unknown): void {
    if (this.ended) return
    this.ended = true
    if (this.status === 0) this.reject(error)
    else this.resolve(this.status)
  }
}

const RETRY_AFTER = 'retry-after'
const DATE = 'date'

/**
 * The header `name` (lower case) in undici's raw headers (name, value, name, value ...): its values joined by
 * ", ", as fetch's `headers.get` gives them (two Retry-After values are no wait to honour, on either path).
 */
function findHeader(headers: Buffer[], name: string): string | undefined {
  let value: string | undefined
  for (let i = 0; i + 1 < headers.length; i += 2) {
    const header = headers[i]!
    if (header.length !== name.length || header.toString('latin1').toLowerCase() !== name) continue
    const each = headers[i + 1]!.toString('latin1')
    value = value === undefined ? each : `${value}, ${each}`
  }
  return value
}

function postWithFetch(fetchImplementation: typeof fetch, target: URL): Post {
  return (headers, body) => {
    const controller = new AbortController()
    let retryAfter: string | undefined
    let date: string | undefined
    const send = async () => {
      // redirect: manual, so a signed event is never sent on to an address nobody configured
      const pairs: [string, string][] = []
      for (let i = 0; i < headers.length; i += 2) pairs.push([headers[i]!, headers[i + 1]!])
      const response = await fetchImplementation(target, { method: 'POST', headers: pairs, body, redirect: 'manual', signal: controller.signal })
      // the answer's body is not ours to read; dropping it frees the connection
      await response.body?.cancel().catch(() => {})
      if (!response.ok) {
        retryAfter = response.headers.get(RETRY_AFTER) ?? undefined
        date = response.headers.get(DATE) ?? undefined
      }
      return response.status
    }
    return {
      answer: send(),
      get retryAfter() {
        return retryAfter
      },
      get date() {
        return date
      },
      abort: (reason) => controller.abort(reason),
    }
  }
}

/**
 * What undici could not read as an answer, when that is why the request failed (its own pool's error, or the
 * cause of fetch's TypeError('fetch failed')): a status line, header or framing llhttp refused
 * (HTTPParserError: "Response does not match the HTTP/1.1 protocol (Invalid status code)"), or headers past
 * its limit (http.maxHeaderSize, 16 KiB by default). Undefined for any other failure. The parser's reason is
 * llhttp's own words, never the receiver's bytes (those are on the error's `data`, left out); printable() all
 * the same, as it goes on the job and into the log.
 */
function describeNotHttp(error: unknown): string | undefined {
  for (const each of [error, (error as { cause?: unknown } | undefined)?.cause]) {
    const { name, code, message } = (each ?? {}) as { name?: unknown; code?: unknown; message?: unknown }
    if (code === 'UND_ERR_HEADERS_OVERFLOW') return 'its headers are longer than undici takes (UND_ERR_HEADERS_OVERFLOW)'
    // (a Content-Length beside Transfer-Encoding: chunked, or a body of another length: framing, not the network)
    if (code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH') return 'its body does not match its Content-Length (UND_ERR_RES_CONTENT_LENGTH_MISMATCH)'
    if (name === 'HTTPParserError') {
      const reason = typeof message === 'string' && message !== '' ? message : 'an answer undici could not parse'
      // (undici names the llhttp error as HPE_<name> when it knows it)
      return printable(typeof code === 'string' && !reason.includes(code) ? `${reason} (${code})` : reason)
    }
  }
  return undefined
}

// undici's errors carry a code: the socket's (ECONNREFUSED, ENOTFOUND ...) or its own (UND_ERR_SOCKET: the
// connection closed before the answer);
// fetch wraps the socket's error (ECONNREFUSED, ENOTFOUND ...) in a TypeError('fetch failed'); its code
// is what an operator needs
function describeNetworkError(error: unknown): string {
  const code = (error as { code?: unknown } | undefined)?.code
  if (typeof code === 'string' && code !== 'ABORT_ERR') return code
  const cause = (error as { cause?: { code?: unknown; message?: unknown } } | undefined)?.cause
  if (typeof cause?.code === 'string') return cause.code
  if (typeof cause?.message === 'string') return cause.message
  return error instanceof Error ? error.message : String(error)
}
