// Pure: turns verified raw bytes into what the ingest stores and applies.
//
// The platform's trade payload is four fields (trade_id, reference, status, external_reference); the
// event kind is `trade.{status}`. A body with an `event` string names its own kind (seller.*, buyer.*,
// or kinds we do not know). The spec does not show those payloads, so they are kept raw. A trade body whose
// `event` is not `trade.{status}` of its own status is invalid: which of the two it means cannot be told.
// So is any body with a key twice in one of its objects (find-duplicate-key.ts): we would read its last
// value, a reader that keeps the first would read another body.
import { isPathId, isTradeFact, TRADE_FACT_MAX_LENGTH } from '../partner-api/field-rules.js'
import { findDuplicateKey, shownKey } from './find-duplicate-key.js'

export type ParsedDelivery =
  | {
      kind: 'trade'
      eventType: string
      tradeId: string
      tradeReference: string | null
      status: string
      externalReference: string
    }
  | { kind: 'other'; eventType: string }
  | { kind: 'invalid'; eventType: string; problem: string }

export class PayloadError extends Error {
  override name = 'PayloadError'
}

// ignoreBOM: a leading byte-order mark stays in the text, so the text stored is the exact bytes the
// signature covered (valid UTF-8 decodes and encodes back byte for byte; fatal refuses anything else)
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })
const BYTE_ORDER_MARK = '\ufeff'

/** A body as received: its text, what JSON.parse made of it, and a key its text holds twice in one object. */
export interface ParsedBody {
  text: string
  body: Record<string, unknown>
  /** The first key one of its objects holds twice (find-duplicate-key.ts); JSON.parse kept the last value. */
  duplicateKey?: string
}

/**
 * Decodes and parses the body; throws PayloadError when it is not UTF-8 JSON holding an object.
 * `text` is the whole body, byte-order mark included: Buffer.from(text) is the body received.
 */
export function parseBody(rawBody: Buffer): ParsedBody {
  let text: string
  try {
    text = decoder.decode(rawBody)
  } catch {
    throw new PayloadError('The body is not valid UTF-8')
  }
  let body: unknown
  try {
    body = parseJsonText(text)
  } catch {
    throw new PayloadError('The body is not valid JSON')
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw new PayloadError('The body must be a JSON object')
  }
  // (an escaped NUL, \u0000, is six characters of text in the body stored; a field the ingest stores that decodes to
  // one is refused by isTradeFact, or by the database and stored as invalid: receive-webhook.ts)
  const duplicateKey = findDuplicateKey(text, body)
  return duplicateKey === undefined ? { text, body: body as Record<string, unknown> } : { text, body: body as Record<string, unknown>, duplicateKey }
}

export function classifyDelivery({ body, duplicateKey }: Pick<ParsedBody, 'body' | 'duplicateKey'>): ParsedDelivery {
  const { event, trade_id: tradeId, reference, status, external_reference: externalReference } = body
  // clipped, whichever field names it: a 180,000-character status was an event type no index could hold (the
  // delivery, signed, refused 400 at every attempt) and one the log line of every delivery held whole
  const eventType = clipped(typeof event === 'string' ? event : typeof status === 'string' ? `trade.${status}` : 'trade.unknown')
  // before anything is read from it: every value read here may be one the platform does not mean
  if (duplicateKey !== undefined) return { kind: 'invalid', eventType, problem: `duplicate key ${shownKey(duplicateKey)}` }
  if (typeof event === 'string' && !event.startsWith('trade.')) return { kind: 'other', eventType }
  const problems: string[] = []
  if (!isTradeFact(tradeId)) problems.push('trade_id')
  if (!isTradeFact(status)) problems.push('status')
  if (!isTradeFact(externalReference)) problems.push('external_reference')
  if (reference !== undefined && reference !== null && !isTradeFact(reference)) problems.push('reference')
  if (problems.length > 0) {
    return {
      kind: 'invalid',
      eventType,
      problem: `missing or not a non-empty string (≤ ${TRADE_FACT_MAX_LENGTH} characters, no NUL or lone surrogate): ${problems.join(', ')}`,
    }
  }
  // the trade id goes into the path of every later call on the order: one the client cannot send ("..", blank)
  // linked to an order made each of them refused as if the operator had mistyped
  if (!isPathId(tradeId as string)) {
    return { kind: 'invalid', eventType, problem: 'trade_id must be usable as a path segment (not blank, "." or "..")' }
  }
  // a body that contradicts itself is not applied: `trade.released` with status `funded` was stored as a release
  // while the order moved to funded; the poller's GET of the trade settles what the status is
  if (typeof event === 'string' && event !== `trade.${status as string}`) {
    const shown = event.length > eventType.length ? `${eventType}…` : event
    return { kind: 'invalid', eventType, problem: `its event ${shown} is not trade.{status} of its status` }
  }
  return {
    kind: 'trade',
    eventType,
    tradeId: tradeId as string,
    tradeReference: (reference as string | undefined) ?? null,
    status: status as string,
    externalReference: externalReference as string,
  }
}

// the longest kind a valid trade event makes: `trade.` and a status of TRADE_FACT_MAX_LENGTH
const EVENT_TYPE_MAX_LENGTH = 'trade.'.length + TRADE_FACT_MAX_LENGTH

// The kind stored is the event's first 206 UTF-16 units, never the first half of a character cut from its second:
// cut between an emoji's two halves, the kind held a lone surrogate, which the database refuses, and a well-formed
// trade event was stored as invalid, its order unmoved (an event that changes no order was stored with U+FFFD)
function clipped(event: string): string {
  if (event.length <= EVENT_TYPE_MAX_LENGTH) return event
  const cut = event.slice(0, EVENT_TYPE_MAX_LENGTH)
  return /[\ud800-\udbff]$/.test(cut) ? cut.slice(0, -1) : cut
}

/** JSON.parse of a body's text; a leading byte-order mark is not part of the JSON (RFC 8259 §8.1). */
export function parseJsonText(text: string): unknown {
  return JSON.parse(text.startsWith(BYTE_ORDER_MARK) ? text.slice(BYTE_ORDER_MARK.length) : text)
}
