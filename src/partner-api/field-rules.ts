// Pure: the field rules of the spec that both the client (validate-request.ts, before sending) and the
// sandbox (sandbox-platform.ts, on receipt) enforce, so the two can never disagree on what is valid.
// Where the spec is loose we pick the strictest reasonable reading, so that a request the client lets
// through is valid under any reading the platform may have.

export const MIN_DISPUTE_REASON_LENGTH = 20

/**
 * A trade's id, reference, status and external reference, as the service stores and indexes them (orders,
 * their history, the deliveries): at most this many UTF-16 units, whichever way they came (a webhook, an
 * API answer, a poll).
 */
export const TRADE_FACT_MAX_LENGTH = 200

/** A UTF-16 surrogate without its pair: no UTF-8 text holds one, so neither does Postgres's text. */
export const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

/**
 * A non-empty string of at most TRADE_FACT_MAX_LENGTH units without a NUL or a lone surrogate (Postgres's text
 * holds neither: the sandbox took `sur\ud800x` as an external reference, and every webhook of that trade was then
 * stored `invalid`, never reaching its order).
 */
export function isTradeFact(value: unknown): value is string {
  return (
    typeof value === 'string' &&
    value.length > 0 &&
    value.length <= TRADE_FACT_MAX_LENGTH &&
    !value.includes('\u0000') &&
    !LONE_SURROGATE.test(value)
  )
}

/**
 * A platform id (a trade's, a milestone's, a proposal's) as the client puts it in a request's path: not blank,
 * not a dot segment, which the URL parser collapses (`/trades/../fund/` is another endpoint's path), without
 * a lone surrogate, which has no UTF-8 to percent-encode (encodeURIComponent throws a URIError), and at most
 * TRADE_FACT_MAX_LENGTH units, as a trade id is stored: a milestone id of 100,000 characters was sent, and the
 * server refused the request line 431 before any platform read it. An answer's ids are held to it too
 * (responses.ts), so that no id is stored that a later call would refuse.
 */
export function isPathId(value: string): boolean {
  return value.trim().length > 0 && value.length <= TRADE_FACT_MAX_LENGTH && value !== '.' && value !== '..' && !LONE_SURROGATE.test(value)
}

// "12.50", "3", "0.5": no sign, no exponent, no thousands separators
export const DECIMAL = /^\d+(\.\d+)?$/

// International format (E.164): a plus sign, a country code that never starts with 0, at most 15 digits
// in all; the shortest numbers in service (e.g. +290 4xxx, +683 4xxx) have 7.
export const PHONE = /^\+[1-9]\d{6,14}$/

// made at the first count, not when the module loads: making one cost every command's start 15 ms of CPU (ICU's
// break rules loaded), and most never count a reason's characters
let graphemes: Intl.Segmenter | undefined

/**
 * "Characters" as a reader counts them: grapheme clusters, so an emoji (even a flag or a family, which
 * are several code points) is one. This is the strictest count: never more than the code points or the
 * UTF-16 units, so a reason long enough here is long enough under any of them.
 */
export function characterCount(text: string): number {
  let count = 0
  graphemes ??= new Intl.Segmenter(undefined, { granularity: 'grapheme' })
  for (const _ of graphemes.segment(text)) count++
  return count
}

/** A dispute reason counts its characters without the whitespace around it. */
export function isLongEnoughReason(reason: string): boolean {
  return characterCount(reason.trim()) >= MIN_DISPUTE_REASON_LENGTH
}

export function isPositiveDecimal(value: string): boolean {
  return DECIMAL.test(value) && /[1-9]/.test(value)
}

/** A decimal percentage from 0 to 100 inclusive, compared exactly (never as a binary float). */
export function isPercentage(value: string): boolean {
  if (!DECIMAL.test(value)) return false
  const { units, scale } = parseDecimal(value)
  return units <= 100n * 10n ** BigInt(scale)
}

/** 100 minus a percentage, exactly, with as many decimals as the input: "99.99" → "0.01", "40" → "60". */
export function percentageComplement(percentage: string): string {
  if (!isPercentage(percentage)) throw new RangeError(`Not a percentage from 0 to 100: ${percentage}`)
  const { units, scale } = parseDecimal(percentage)
  return formatDecimal(100n * 10n ** BigInt(scale) - units, scale)
}

// a decimal string as an integer count of its smallest unit: "62.50" → 6250 units at scale 2
function parseDecimal(value: string): { units: bigint; scale: number } {
  const [whole, fraction = ''] = value.split('.')
  return { units: BigInt(`${whole}${fraction}`), scale: fraction.length }
}

function formatDecimal(units: bigint, scale: number): string {
  if (scale === 0) return units.toString()
  const digits = units.toString().padStart(scale + 1, '0')
  return `${digits.slice(0, -scale)}.${digits.slice(-scale)}`
}
