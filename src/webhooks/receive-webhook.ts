// The ingest: verify, parse, then record and apply in one statement. Glossary:
// - delivery: one POST from the platform, named by X-Partner-Delivery-Id (unique per attempt) and
//   told apart by its body's SHA-256: a retry repeats both (a duplicate); the same id with another
//   verified body is a reused id, stored and applied like any new delivery, and reported;
// - unmatched: a trade event whose external_reference has no order yet; parked, applied on creation.
import { createHash } from 'node:crypto'
import type { Kysely } from 'kysely'
import type { Clock } from '../clock.js'
import { type DatabaseErrorDescription, describeDatabaseError, loggableError } from '../db/database-errors.js'
import type { Database } from '../db/database.js'
import { AppError } from '../http/app-error.js'
import { schemaMissingAnswer } from '../http/error-handler.js'
import type { Logger } from '../logger.js'
import { webhookObservation } from '../orders/observations.js'
import { DELIVERY_ID_RULE, isDeliveryId, loggableDeliveryId } from './delivery-id.js'
import type { DeliveryIdTurns } from './delivery-id-turns.js'
import { type DeliveryOutcome, recordDelivery, updateDeliveryOutcome } from './delivery.repository.js'
import { type EventHandlers, runHandlers } from './event-handlers.js'
import type { DeliveryWriter } from './group-commit.js'
import { classifyDelivery, type ParsedBody, PayloadError, parseBody } from './parse-delivery.js'
import type { SeenDeliveries } from './seen-deliveries.js'
import { signatureHeaderWellFormed, verifySignature } from './verify-signature.js'

export interface ReceiveDeps {
  db: Kysely<Database>
  logger: Logger
  clock: Clock
  secrets: readonly string[]
  /** Writes trade events, grouping concurrent ones into one statement (group-commit.ts). */
  writer: DeliveryWriter
  /** Delivery ids known to be stored: their retries are answered without the database. */
  seen: SeenDeliveries
  /** Stores the bodies sent under one delivery id one after another, in this process (delivery-id-turns.ts). */
  turns: DeliveryIdTurns
  /** The fork's seller and buyer event handlers (event-handlers.ts). */
  eventHandlers: EventHandlers
  /**
   * Writes the line of a delivery refused for its signature; the endpoint limits it to one a second
   * (limit-lines.ts), as anyone who can reach the URL can send a refused delivery. Default: every one.
   */
  logRejectedSignature?: ((fields: object) => void) | undefined
}

export interface IncomingDelivery {
  deliveryId: string | undefined
  signature: string | undefined
  rawBody: Buffer
}

export type ReceiveResult =
  // replayed: a fresh id, but a body a delivery that changed nothing has already (nothing stored; see migrations/0017)
  | { duplicate: true; replayed?: boolean }
  | { duplicate: false; outcome: DeliveryOutcome; eventType: string; idReused: boolean }

export async function receiveWebhook(deps: ReceiveDeps, delivery: IncomingDelivery): Promise<ReceiveResult> {
  const { logger } = deps
  // raw bytes: the signature covers the exact body as sent, so nothing is parsed before this check
  if (!verifySignature(deps.secrets, delivery.rawBody, delivery.signature)) {
    throw signatureRejected(deps, delivery, {
      bodyLength: delivery.rawBody.length,
      bodySha256: createHash('sha256').update(delivery.rawBody).digest('hex'),
    })
  }
  const deliveryId = delivery.deliveryId
  if (deliveryId === undefined || !isDeliveryId(deliveryId)) {
    throw new AppError(400, 'invalid_payload', `X-Partner-Delivery-Id must be ${DELIVERY_ID_RULE}`)
  }
  const bodySha256 = createHash('sha256').update(delivery.rawBody).digest('hex')
  // a retry of a delivery this process saw stored: nothing to write, nothing to read
  if (deps.seen.has(deliveryId, bodySha256)) return { duplicate: true }
  let parsed: ParsedBody
  try {
    parsed = parseBody(delivery.rawBody)
  } catch (error) {
    if (error instanceof PayloadError) throw new AppError(400, 'invalid_payload', error.message)
    throw error
  }

  const receivedAt = new Date(deps.clock.now())
  // after the bodies sent earlier under this id, whichever way each is stored: so this one sees them (a
  // reused id is reported once), and a retry that waited behind its first attempt is answered from memory
  let result = await deps.turns.run(deliveryId, async (): Promise<ReceiveResult> => {
    if (deps.seen.has(deliveryId, bodySha256)) return { duplicate: true }
    const stored = await storing(
      () => store(deps, { deliveryId, bodySha256 }, parsed, receivedAt),
      (reason) => storeRefused(deps, { deliveryId, bodySha256 }, parsed, receivedAt, reason),
    )
    deps.seen.add(deliveryId, bodySha256)
    return stored
  })
  if (!result.duplicate && result.outcome === 'ignored') {
    result = await runEventHandlers(deps, { deliveryId, bodySha256 }, parsed.body, result, receivedAt)
  }
  if (!result.duplicate && result.idReused) {
    // the sender reused an id for another body (a platform fault, or a replay of a captured id):
    // stored and applied as any new delivery; the hash tells the bodies apart without logging one
    logger.warn(
      { ...loggableDeliveryId(deliveryId), bodySha256, eventType: result.eventType, outcome: result.outcome },
      'webhook delivery id reused with a different body',
    )
  }
  return result
}

/**
 * The refusal, before its body is read, of a delivery whose signature header no body could verify (missing
 * or malformed), or undefined: no body is read, or asked for with `100 Continue`, only to be refused. The same
 * answer and line as verifying gives, with the announced length instead of the body's length and hash.
 */
export function refuseBeforeBody(
  deps: Pick<ReceiveDeps, 'logger' | 'secrets' | 'logRejectedSignature'>,
  delivery: { deliveryId: string | undefined; signature: string | undefined; announcedLength: string | undefined },
): AppError | undefined {
  if (signatureHeaderWellFormed(delivery.signature)) return undefined
  const length = Number(delivery.announcedLength)
  return signatureRejected(deps, delivery, { announcedLength: Number.isSafeInteger(length) ? length : null })
}

/**
 * How a refused signature failed: no header (`missing`), not `sha256=` and 64 hex digits (`malformed`: neither is
 * what the platform sends), or well-formed and matching no secret (`mismatch`: the platform signing with a secret
 * this side does not list, or someone imitating it). webhook_signature_failures_total counts them apart, so the
 * alert for a secret changed on one side is not set off by scanners' unsigned requests.
 */
export type SignatureFailure = 'missing' | 'malformed' | 'mismatch'

export class SignatureRejected extends AppError {
  constructor(readonly failure: SignatureFailure) {
    super(401, 'invalid_signature', 'Missing, malformed or wrong X-Partner-Signature')
  }
}

function signatureRejected(
  deps: Pick<ReceiveDeps, 'logger' | 'secrets' | 'logRejectedSignature'>,
  delivery: { deliveryId: string | undefined; signature: string | undefined },
  body: object,
): SignatureRejected {
  const logRejected = deps.logRejectedSignature ?? ((fields: object) => deps.logger.warn(fields, 'webhook signature rejected'))
  logRejected({
    ...loggableDeliveryId(delivery.deliveryId),
    ...body,
    signaturePresent: delivery.signature !== undefined,
    secretsTried: deps.secrets.length,
  })
  const failure =
    delivery.signature === undefined ? 'missing' : signatureHeaderWellFormed(delivery.signature) ? 'mismatch' : 'malformed'
  return new SignatureRejected(failure)
}

// The database refused a value of this verified delivery (a lone surrogate in a field, say): the data is
// the sender's, so a retry would be refused again. It is kept as `invalid` with what is always storable:
// the delivery id, the event type made well-formed (an unpaired surrogate or a NUL becomes U+FFFD) and
// the raw body, whose JSON escapes (\ud800) are plain ASCII text. Nothing is applied to an order.
async function storeRefused(
  deps: ReceiveDeps,
  key: { deliveryId: string; bodySha256: string },
  parsed: ParsedBody,
  receivedAt: Date,
  reason: DatabaseErrorDescription,
): Promise<ReceiveResult> {
  const eventType = storableText(classifyDelivery(parsed).eventType)
  const { inserted, idReused, replayed } = await recordDelivery(deps.db, {
    ...key,
    eventType,
    rawBody: parsed.text,
    outcome: 'invalid',
    receivedAt,
  })
  if (!inserted) return { duplicate: true, replayed }
  deps.logger.warn({ ...loggableDeliveryId(key.deliveryId), err: reason }, 'webhook payload refused by the database; stored as invalid')
  return { duplicate: false, outcome: 'invalid', eventType, idReused }
}

async function store(
  deps: ReceiveDeps,
  { deliveryId, bodySha256 }: { deliveryId: string; bodySha256: string },
  parsed: ParsedBody,
  receivedAt: Date,
): Promise<ReceiveResult> {
  const { logger } = deps
  const event = classifyDelivery(parsed)
  if (event.kind === 'trade') {
    const result = await deps.writer.write({
      delivery: { deliveryId, bodySha256, eventType: event.eventType, rawBody: parsed.text },
      observation: webhookObservation(event, deliveryId, receivedAt),
    })
    if (result === 'duplicate' || result === 'replayed') return { duplicate: true, replayed: result === 'replayed' }
    if (result.outcome === 'trade_mismatch') {
      logger.warn({ ...loggableDeliveryId(deliveryId), orderId: result.orderId }, 'webhook trade id differs from the order’s trade, or the order was linked under the other PARTNER_ENV')
    }
    return { duplicate: false, outcome: result.outcome, eventType: event.eventType, idReused: result.idReused }
  }

  const outcome: DeliveryOutcome = event.kind === 'invalid' ? 'invalid' : 'ignored'
  const { inserted, idReused, replayed } = await recordDelivery(
    deps.db,
    { deliveryId, bodySha256, eventType: event.eventType, rawBody: parsed.text, outcome, receivedAt },
    // a body an event handler takes is stored under each id: the platform's retry of one whose handler failed
    // (answered 500) comes under a fresh id, and must run the handler again
    { foldReplays: outcome === 'invalid' || deps.eventHandlers.handlersFor(event.eventType).length === 0 },
  )
  if (!inserted) return { duplicate: true, replayed }
  if (event.kind === 'invalid') {
    logger.warn({ ...loggableDeliveryId(deliveryId), eventType: event.eventType, problem: event.problem }, 'webhook payload invalid')
  }
  return { duplicate: false, outcome, eventType: event.eventType, idReused }
}

// Runs once the delivery is stored, outside `storing`: whatever a handler throws (its own database
// error included) is the handler's failure, not an outage. A 503 would promise a retry that cannot
// help (the retry is a duplicate of the stored delivery), so it is a 500 `event_handler_failed`, logged
// with the delivery id and the event type, and the delivery stays stored as `ignored`.
async function runEventHandlers(
  deps: ReceiveDeps,
  key: { deliveryId: string; bodySha256: string },
  body: Record<string, unknown>,
  stored: ReceiveResult & { duplicate: false },
  receivedAt: Date,
): Promise<ReceiveResult> {
  const handlers = deps.eventHandlers.handlersFor(stored.eventType)
  if (handlers.length === 0) return stored
  const context = { db: deps.db, logger: deps.logger, deliveryId: key.deliveryId, eventType: stored.eventType, body }
  try {
    const outcome = await runHandlers(handlers, context)
    if (outcome === 'applied') await updateDeliveryOutcome(deps.db, key, { outcome: 'applied', appliedAt: receivedAt })
    return { ...stored, outcome }
  } catch (error) {
    deps.logger.error(
      { ...loggableDeliveryId(key.deliveryId), eventType: stored.eventType, err: loggableError(error) },
      'webhook event handler failed; the delivery stays stored as ignored',
    )
    throw new AppError(500, 'event_handler_failed', `The handler for ${stored.eventType} failed`)
  }
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g

function storableText(text: string): string {
  return text.replace(LONE_SURROGATE, '\ufffd').replaceAll('\0', '\ufffd')
}

// What the database's error means decides the answer (database-errors.ts): unavailable, overloaded, tables
// missing (a restore under way) or a conflict that persisted is a 503 (the platform retries, and the statement
// either committed whole or not at all); data it refused is the sender's, stored as invalid, or a 400 if even that is refused; anything
// else is a bug (500).
async function storing<T>(
  work: () => Promise<T>,
  storeRefused: (reason: DatabaseErrorDescription) => Promise<T>,
): Promise<T> {
  try {
    return await work()
  } catch (error) {
    const reason = describeDatabaseError(error)
    if (reason.kind !== 'refused_data') throw storeError(error)
    try {
      return await storeRefused(reason)
    } catch (again) {
      if (describeDatabaseError(again).kind !== 'refused_data') throw storeError(again)
      throw new AppError(400, 'invalid_payload', 'The database refused the delivery’s data', { cause: again })
    }
  }
}

function storeError(error: unknown): unknown {
  const { kind } = describeDatabaseError(error)
  if (kind === 'overloaded') {
    return new AppError(503, 'overloaded', 'Too many deliveries are waiting to be stored; retry later', { cause: error })
  }
  if (kind === 'schema_missing') {
    return new AppError(503, 'schema_missing', schemaMissingAnswer(error), { cause: error })
  }
  if (kind === 'unavailable' || kind === 'conflict') {
    return new AppError(503, 'database_unavailable', 'The delivery could not be stored; retry later', { cause: error })
  }
  return error
}

