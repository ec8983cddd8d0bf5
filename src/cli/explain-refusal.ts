// How a command tells a person that the platform refused its call: one failure line ending in a code of ours in
// brackets, as every failed command's does, with the platform's status, code and message before it as detail,
// then the platform's fields, one a line. Exit code 1 (run-cli.ts): the command was well formed and the platform
// said no; 2 is for what the command line or the configuration got wrong before anything was sent.
//
// Our code comes from the status alone: the spec lists none of the platform's codes, so a script can rely on
// ours whatever the platform sends, and the platform's own code is its words, from outside, shown as detail.
import { isJsonObject } from '../json-object.js'
import { describeClockOffset } from '../partner-api/clock-offset.js'
import type { PartnerApiError } from '../partner-api/partner-api-error.js'
import { printable } from '../printable.js'
import { shortened } from '../shortened.js'
import { withoutPassword } from '../without-password.js'
import { CommandFailedError } from './cli-context.js'

// 401 and 429 in the words `reconcile --once` stops with
const REFUSAL_CODES: Readonly<Record<number, string>> = {
  400: 'invalid_request',
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  409: 'conflict',
  422: 'invalid_request',
  429: 'throttled',
}

/** Our code for a refusal with this status: `not_found` for a 404, `platform_error` for any 5xx, `refused` else. */
export function refusalCode(status: number): string {
  return REFUSAL_CODES[status] ?? (status >= 500 ? 'platform_error' : 'refused')
}

/** The most characters of the platform's message, and of each field's name and message, printed for a person. */
const MAX_REFUSAL_TEXT_LENGTH = 500
/** The most of a refusal's fields printed, one a line; the rest are counted. */
const MAX_REFUSAL_FIELDS = 20

/**
 * A refusal for a person to read: `The platform refused (404 trade_not_found): No trade tr_1 [not_found]`, then
 * the first of its fields (`  currency: unknown currency`) and `advice`, lines of their own. Each value from the
 * answer is shortened (the answer may be a megabyte of text from outside) and shown on one line (printable()): a
 * line feed in it cannot forge a line of the output. With --json too: --json is the form of a result on stdout,
 * and a refusal is no result but this text on stderr.
 */
export function explainRefusal(error: PartnerApiError, advice = ''): CommandFailedError {
  const { message, detail } = describeAnswer(error)
  if (isRedirect(error)) {
    return new CommandFailedError(
      refusalCode(error.status),
      `The platform answered ${error.status} ${printable(error.code)}${message}: ${describeRedirect(error)}`,
      `${detail}\n  ${REDIRECT_ADVICE}${advice}`,
    )
  }
  return new CommandFailedError(refusalCode(error.status), `The platform refused (${error.status} ${printable(error.code)})${message}`, `${detail}${advice}`)
}

const isRedirect = (error: PartnerApiError) => error.status >= 300 && error.status < 400

/** The most of a redirect's Location shown. */
const MAX_LOCATION_LENGTH = 200

/** `a redirect to https://other.example/x, not followed`: the Location as it came, its password hidden, on one line. */
function describeRedirect(error: PartnerApiError): string {
  const to = typeof error.location === 'string' ? ` to ${printable(shortened(withoutPassword(error.location), MAX_LOCATION_LENGTH))}` : ' with no Location'
  return `a redirect${to}, not followed`
}

// a gateway in front of the platform that moved, http:// where https:// is served, a path missing its last part
const REDIRECT_ADVICE =
  "Check PARTNER_API_BASE_URL: it should be the platform's base URL itself, which answers without redirecting " +
  '(a signed call is never sent on to another address)'

/**
 * A 5xx (or a 3xx: nothing says it was not done) answer to a call that changes something, for a person to read: `The platform answered 504 gateway_timeout:
 * Upstream timed out, so the call may or may not have taken effect [outcome_unknown]`, then the platform's fields
 * and `advice` as explainRefusal() prints them. The spec's base URL is a gateway in front of the platform, and a
 * gateway's 502 or 504, or a server that failed part-way, says nothing of whether the call was done behind it.
 */
export function explainServerError(error: PartnerApiError, advice: string): CommandFailedError {
  const { message, detail } = describeAnswer(error)
  // a 303 may say "done, see there": as unknown as a 5xx
  const redirect = isRedirect(error) ? `, ${describeRedirect(error)}` : ''
  const check = isRedirect(error) ? `\n  ${REDIRECT_ADVICE}` : ''
  return new CommandFailedError(
    'outcome_unknown',
    `The platform answered ${error.status} ${printable(error.code)}${message}${redirect}, so the call may or may not have taken effect`,
    `${detail}${check}${advice}`,
  )
}

/** The platform's message (`: …`, or nothing) and the lines after it: the clock's offset and the fields. */
function describeAnswer(error: PartnerApiError): { message: string; detail: string } {
  const enveloped = isJsonObject(error.body) && isJsonObject(error.body.error)
  const platform = enveloped ? (error.body as { error: Record<string, unknown> }).error : {}
  const text = (value: unknown) =>
    value === undefined || value === null
      ? '?'
      : printable(typeof value === 'string' ? shortened(value, MAX_REFUSAL_TEXT_LENGTH) : boundedJson(value, MAX_REFUSAL_TEXT_LENGTH))
  const message = typeof platform.message === 'string' && platform.message !== '' ? `: ${text(platform.message)}` : ''
  const clock = error.clockOffsetS === undefined ? '' : `\n  ${describeClockOffset(error.clockOffsetS)}`
  // (a Retry-After on another answer, a redirect's or a 409's, asks for no wait before the next call)
  // `Retry-After: 0` (or a date past) asks for no wait: `asks to wait 0 s` said nothing
  const asksToWait = error.retryAfterMs !== undefined && error.retryAfterMs > 0 && (error.status === 429 || error.status === 503)
  // a read retried on 429 and 5xx: the wait before the answer (4 attempts, 18 s) is not left unexplained
  const tried = error.attempts > 1 ? `\n  Sent ${error.attempts} times, each answered with an error; this is the last answer` : ''
  const wait = `${tried}${asksToWait ? `\n  ${describeWait(error.retryAfterMs!)}` : ''}`
  if (!enveloped) return { message, detail: `${clock}${wait}${describeOtherBody(error.body, text)}` }
  // the fields as a list of {field, message}, or as an object of each field's messages
  const fields: [unknown, unknown][] = Array.isArray(platform.fields)
    ? platform.fields.map((field) => (isJsonObject(field) ? [field.field ?? null, field.message] : [undefined, field]))
    : isJsonObject(platform.fields)
      ? Object.entries(platform.fields)
      : []
  return { message, detail: `${clock}${wait}${fieldLines(fields, text)}` }
}

/** A line for each field, `  name: message` (a list of messages joined with `; `), the first MAX_REFUSAL_FIELDS of them. */
function fieldLines(fields: readonly [unknown, unknown][], text: (value: unknown) => string): string {
  const message = (value: unknown) => (Array.isArray(value) && value.every((each) => typeof each === 'string') ? text(value.join('; ')) : text(value))
  const shown = fields.slice(0, MAX_REFUSAL_FIELDS).map(([name, value]) => (name === undefined ? `\n  ${text(value)}` : `\n  ${text(name)}: ${message(value)}`))
  const more = fields.length > MAX_REFUSAL_FIELDS ? `\n  … and ${fields.length - MAX_REFUSAL_FIELDS} more fields` : ''
  return `${shown.join('')}${more}`
}

/**
 * A refusal whose body is not the platform's `{"error": …}` (the spec does not show its errors' shape): a JSON object's
 * keys as fields (`{"amount": ["Ensure this value is greater than or equal to 0.01."]}`), or the text as it came, cut
 * and on one line. Its reason was dropped, and `… once what the platform refused is put right` could not be followed.
 */
function describeOtherBody(body: unknown, text: (value: unknown) => string): string {
  if (isJsonObject(body)) return fieldLines(Object.entries(body), text)
  if (typeof body === 'string' && body.trim() !== '') return `\n  the platform's answer: ${text(body.trim())}`
  if (body !== undefined && body !== null && body !== '') return `\n  the platform's answer: ${text(body)}`
  return ''
}

/**
 * The wait a 429 or 503 asked for in its Retry-After, for a person: `The platform asks to wait 120 s before the next
 * call (Retry-After)`. Run again sooner, the command would most likely be refused the same way.
 */
function describeWait(ms: number): string {
  const seconds = Math.ceil(ms / 1000)
  const asked = `The platform asks to wait ${seconds.toLocaleString('en-US')} s${aboutDuration(seconds)} before the next call (Retry-After)`
  // a wait past a day is no throttle to sit out but most likely a wrong header (99999999999 s, a date in 9999)
  return seconds > DAY_S ? `${asked}: longer than a day, which looks like a mistake; ask the platform before waiting it out` : asked
}

const DAY_S = 86_400
const YEAR_S = 365 * DAY_S

/** ` (about 2 h)` after a wait of an hour or more, for a person reading seconds; nothing under an hour. */
function aboutDuration(seconds: number): string {
  if (seconds < 3_600) return ''
  const [amount, unit] = seconds < DAY_S ? [seconds / 3_600, 'h'] : seconds < YEAR_S ? [seconds / DAY_S, 'days'] : [seconds / YEAR_S, 'years']
  return ` (about ${Math.round(amount).toLocaleString('en-US')} ${unit})`
}

/** The most levels of a refusal's value written out; deeper ones are shown as `…`. */
const MAX_REFUSAL_DEPTH = 16

/**
 * A value of a refusal that is not a string, as JSON, cut after about `max` characters and `MAX_REFUSAL_DEPTH`
 * levels (`…` where it was cut). The refusal's body is not held to the depth a result is, and JSON.stringify of
 * a field nested 100,000 deep overflowed the stack: the command printed `Maximum call stack size exceeded` and
 * nothing of the refusal.
 */
function boundedJson(value: unknown, max: number): string {
  let written = ''
  let cut = false
  const write = (part: string) => {
    if (written.length >= max) cut = true
    else written += part
  }
  const walk = (current: unknown, depth: number): void => {
    if (cut) return
    if (depth >= MAX_REFUSAL_DEPTH && current !== null && typeof current === 'object') {
      write('…')
      return
    }
    if (Array.isArray(current)) {
      write('[')
      current.forEach((item, index) => {
        if (index > 0) write(',')
        walk(item, depth + 1)
      })
      write(']')
    } else if (isJsonObject(current)) {
      write('{')
      Object.entries(current).forEach(([key, item], index) => {
        write(`${index > 0 ? ',' : ''}${JSON.stringify(key)}:`)
        walk(item, depth + 1)
      })
      write('}')
    } else {
      write(JSON.stringify(current) ?? 'null')
    }
  }
  walk(value, 0)
  return cut || written.length > max ? `${[...written].slice(0, max).join('')}…` : written
}
