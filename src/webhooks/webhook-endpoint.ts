// POST {WEBHOOK_PATH}, on Node's own request and response: the platform's one hot path does not go through
// Express (its router, its request and response prototypes, res.json's ETag cost more than the rest of a
// duplicate's answer; bench/results/latest.md). app.ts sends the exact path here first and mounts the same
// endpoint in Express for the variants Express also matches (a trailing slash, another letter case).
//
// The body is read with raw-body under the size limit (a Content-Length over it is refused before a byte is
// read; a streamed body is cut off at the limit), its chunks counted in the in-flight budget as they arrive,
// then handed to receiveWebhook. Answers follow the contract table in README.md; errors get the one error shape
// (errorAnswer, as Express's error middleware gives).
import { createHash } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import getRawBody from 'raw-body'
import { loggableError, outcomeUnknown } from '../db/database-errors.js'
import type { DiskFullNote } from '../db/disk-full-note.js'
import { limitLines } from '../limit-lines.js'
import { AppError } from '../http/app-error.js'
import { errorAnswer, incompleteBody, schemaMissingWords } from '../http/error-handler.js'
import { awaitsContinue, continueReading } from '../http/expect-continue.js'
import { admitBody, type BodyAdmission, BodyBudgetSpent, type InflightBodyBudget } from '../http/inflight-body-budget.js'
import { writeJson } from '../http/json-answer.js'
import type { Metrics } from '../metrics/metrics.js'
import { loggableDeliveryId } from './delivery-id.js'
import { type ReceiveDeps, receiveWebhook, refuseBeforeBody, SignatureRejected } from './receive-webhook.js'

/** The writer (group commit) and the memory of stored ids come made (delivery-ingest.ts). */
export interface WebhookEndpointDeps extends ReceiveDeps {
  path: string
  bodyLimitBytes: number
  /** MAX_INFLIGHT_BODY_BYTES, shared by every request of the listener. */
  budget: InflightBodyBudget
  metrics?: Metrics | undefined
  /** False while the service waits for its database at start-up. */
  isReady?: (() => boolean) | undefined
  /** True once a signal arrived: every answer closes its connection. */
  isDraining?: (() => boolean) | undefined
  /** True while the embedded database's disk is almost full (db/storage-guard.ts). */
  storageLow?: (() => boolean) | undefined
  /** Where a delivery refused for a full disk, and a stored one, are noted for /readyz (db/disk-full-note.ts). */
  diskFull?: DiskFullNote | undefined
}

export type WebhookEndpoint = (req: IncomingMessage, res: ServerResponse) => void

export const PERHAPS_STORED_MESSAGE =
  "webhook perhaps stored: the database connection was lost before its answer came; answered 503, and the platform's retry is answered as a duplicate if it was"


// The two answers a stored delivery gets, encoded once
const RECEIVED = Buffer.from(JSON.stringify({ received: true }))
const RECEIVED_DUPLICATE = Buffer.from(JSON.stringify({ received: true, duplicate: true }))

/**
 * Whether a coding list (Content-Encoding, Transfer-Encoding; any letter case) names a coding besides `allowed`:
 * a Content-Encoding other than none or `identity` (RFC 9110 8.4), or a Transfer-Encoding besides `chunked`
 * (Node's parser takes `gzip, chunked` and undoes only the chunking, so the body read would still be gzip).
 */
function listsCodingBesides(header: string | undefined, allowed: 'identity' | 'chunked'): boolean {
  if (header === undefined) return false
  return header.split(',').some((coding) => {
    const name = coding.trim().toLowerCase()
    return name !== '' && name !== allowed
  })
}

// the headers that name a delivery and sign it: each once
const ONCE_ONLY = ['X-Partner-Delivery-Id', 'X-Partner-Signature'] as const

/** The first of the delivery's own headers the request has more than once, and how many times. */
function repeatedHeader(req: IncomingMessage): { name: string; count: number } | undefined {
  for (const name of ONCE_ONLY) {
    // Node joins a repeated header's values with ', ': only then is it worth building headersDistinct (every
    // header's values, on each delivery's path)
    if (req.headers[name.toLowerCase()]?.includes(',') !== true) continue
    const count = req.headersDistinct[name.toLowerCase()]?.length ?? 0
    if (count > 1) return { name, count }
  }
  return undefined
}

export function webhookEndpoint(deps: WebhookEndpointDeps): WebhookEndpoint {
  const { logger, metrics } = deps
  // The one line every delivery writes holds only fields built here (a delivery id that could carry a
  // secret is logged as its hash), so it skips pino's redaction by path: about a tenth of a duplicate's
  // CPU (bench/results/latest.md). Configured secrets are still blanked out of it (logger.ts).
  const deliveryLog = logger.child({}, { redact: [] })
  const counted = (outcome: string) => metrics?.deliveries.inc({ outcome })
  // lines an outage or an overload writes for every refused delivery: one a second at most (limit-lines.ts)
  const notStored = limitLines((fields: object) => logger.error(fields, 'webhook not stored'))
  // a connection lost with the statement on it: it may have committed (the platform's retry is then a duplicate)
  const perhapsStored = limitLines((fields: object) => logger.error(fields, PERHAPS_STORED_MESSAGE))
  const queueFull = limitLines((fields: object) => logger.warn(fields, 'webhook refused: ingest queue full'))
  // the service's tables missing (a restore under way, a database replaced), or a column of them (a restore of an older
  // build's dump): each delivery meets them until it ends
  const schemaMissing = limitLines((fields: { err: unknown }) =>
    logger.error(fields, `webhook not stored: ${schemaMissingWords((fields.err as { code?: string } | undefined)?.code)}`),
  )
  // and the line of a refused signature, which anyone who can reach the URL can make
  const receiveDeps: ReceiveDeps = {
    ...deps,
    logRejectedSignature: limitLines((fields: object) => logger.warn(fields, 'webhook signature rejected')),
  }

  const receive = async (req: IncomingMessage, res: ServerResponse, body: BodyAdmission, deliveryId: string | undefined) => {
    if (deps.isReady && !deps.isReady()) {
      // before the body is read: the connection is closed rather than drained
      res.setHeader('Connection', 'close')
      throw new AppError(503, 'database_unavailable', 'The service is starting and its database is not ready; retry later')
    }
    if (deps.storageLow?.()) {
      res.setHeader('Connection', 'close')
      throw new AppError(503, 'storage_low', "The service's data directory is almost full; retry later")
    }
    if (listsCodingBesides(req.headers['content-encoding'], 'identity')) {
      // the signature is over the bytes as sent: a gzip body verified and then failed to parse (400, and the
      // platform retried it to the end). Refused before it is read; the sender is told what it may send
      res.setHeader('Connection', 'close')
      res.setHeader('Accept-Encoding', 'identity')
      throw new AppError(415, 'unsupported_media_type', 'A Content-Encoding is not accepted: send the body as signed, unencoded')
    }
    if (listsCodingBesides(req.headers['transfer-encoding'], 'chunked')) {
      // the same for a transfer coding (RFC 9112 6.1: 501): its coded bytes were read as the body, and refused
      // 401 invalid_signature, as if a secret were wrong
      res.setHeader('Connection', 'close')
      throw new AppError(501, 'unsupported_transfer_coding', 'A Transfer-Encoding other than chunked is not accepted: send the body as signed, chunked or with a Content-Length')
    }
    const repeated = repeatedHeader(req)
    if (repeated) {
      // Node joins the two into one text with `, `, which was refused as a malformed id or signature, with their
      // generic messages; and which of the two a proxy in front read is anyone's guess. Refused from the headers
      res.setHeader('Connection', 'close')
      throw new AppError(400, 'duplicate_header', `${repeated.name} was sent ${repeated.count} times: a delivery carries it once`)
    }
    const signature = req.headers['x-partner-signature']
    const announcedLength = req.headers['content-length']
    // What the headers already refuse (no X-Partner-Signature, or not `sha256=` and 64 hex digits) is refused
    // before a byte of the body is read, and the connection closed, as the body may follow anyway. A client
    // with `Expect: 100-continue` is never asked for it. Any other used to be read to its end first: a
    // thousand connections sending unsigned bodies a byte every few seconds held every connection the
    // listener takes (MAX_CONNECTIONS), for the 30 s a request may last, with no secret needed.
    const refusal = refuseBeforeBody(receiveDeps, {
      deliveryId,
      signature: typeof signature === 'string' ? signature : undefined,
      announcedLength,
    })
    if (refusal) {
      res.setHeader('Connection', 'close')
      throw refusal
    }
    // a length past the limit is refused by the body reader below, before a byte is read
    if (awaitsContinue(req) && !(Number(announcedLength) > deps.bodyLimitBytes)) continueReading(req, res)
    let rawBody: Buffer
    try {
      rawBody = await body.read(() => getRawBody(req, { length: announcedLength, limit: deps.bodyLimitBytes }))
    } catch (error) {
      // close the connection rather than read (and discard) the rest of an oversized body
      res.setHeader('Connection', 'close')
      if (error instanceof BodyBudgetSpent) {
        res.setHeader('Retry-After', '1')
        throw error
      }
      if ((error as { status?: number }).status === 413) {
        throw new AppError(413, 'payload_too_large', `The body is larger than ${deps.bodyLimitBytes} bytes`)
      }
      throw incompleteBody(error) ?? new AppError(400, 'invalid_payload', 'The body could not be read', { cause: error })
    }
    const started = process.hrtime.bigint()
    const result = await receiveWebhook(receiveDeps, { deliveryId, signature: typeof signature === 'string' ? signature : undefined, rawBody }).catch(
      (error: unknown) => {
        if (error instanceof SignatureRejected && error.failure === 'mismatch' && mismatchesSeen.refusedBefore(deliveryId, rawBody)) {
          metrics?.signatureMismatchesResent.inc()
        }
        throw error
      },
    )
    // replayed: a fresh id over a body stored before with no effect, answered as the duplicate it is (nothing stored)
    const outcome = result.duplicate ? (result.replayed ? 'replayed' : 'duplicate') : result.outcome
    // a reused id is counted apart (its stored outcome, the status rules', is in the log and the row)
    counted(!result.duplicate && result.idReused ? 'id_reused' : outcome)
    metrics?.ingestSeconds.observe({ outcome }, Number(process.hrtime.bigint() - started) / 1e9)
    deliveryLog.info(
      { ...loggableDeliveryId(deliveryId), outcome, ...(result.duplicate ? {} : { eventType: result.eventType }) },
      'webhook received',
    )
    if (!result.duplicate) deps.diskFull?.stored()
    writeJson(res, 200, result.duplicate ? RECEIVED_DUPLICATE : RECEIVED)
  }

  const mismatchesSeen = refusedDeliveries(MISMATCHES_REMEMBERED)
  const refused = (error: unknown, res: ServerResponse, deliveryId: string | undefined) => {
    counted('rejected')
    if (error instanceof AppError) {
      if (error instanceof SignatureRejected) metrics?.signatureFailures.inc({ signature: error.failure })
      if (error.code === 'database_unavailable' && error.cause !== undefined) {
        deps.diskFull?.failed(error.cause)
        const line = outcomeUnknown(error.cause) ? perhapsStored : notStored
        line({ ...loggableDeliveryId(deliveryId), err: loggableError(error.cause) })
      }
      if (error.code === 'storage_low') metrics?.requestsRefused.inc({ reason: 'storage_low' })
      if (error.code === 'schema_missing') {
        metrics?.requestsRefused.inc({ reason: 'schema_missing' })
        schemaMissing({ ...loggableDeliveryId(deliveryId), err: loggableError(error.cause) })
      }
      if (error.code === 'overloaded' && !(error instanceof BodyBudgetSpent)) queueFull(loggableDeliveryId(deliveryId))
    }
    if (res.headersSent) {
      res.destroy()
      return
    }
    const { status, body, headers } = errorAnswer(error, logger, deps.path)
    for (const [name, value] of Object.entries(headers ?? {})) res.setHeader(name, value)
    writeJson(res, status, body)
  }

  return (req, res) => {
    if (deps.isDraining?.()) res.setHeader('Connection', 'close')
    // body bytes are counted as they arrive, so held-open bodies cannot grow the process's memory
    const body = admitBody(req, res, deps)
    if (body === undefined) return
    const header = req.headers['x-partner-delivery-id']
    const deliveryId = typeof header === 'string' ? header : undefined
    receive(req, res, body, deliveryId).catch((error: unknown) => refused(error, res, deliveryId))
  }
}

// How many deliveries refused for a signature matching no secret a replica remembers (a hash of id and body each,
// about 150 bytes): an outsider's fresh ids push the oldest out, never the memory up.
const MISMATCHES_REMEMBERED = 10_000

/**
 * The deliveries (id and body) refused for a signature matching no secret, the newest `limit`: `refusedBefore`
 * says whether this one was refused so before, and remembers it. The platform retries a refused delivery, the
 * same id and body; an outsider's noise is seldom one delivery sent again (webhook_signature_mismatches_resent_total).
 */
function refusedDeliveries(limit: number) {
  const seen = new Set<string>()
  return {
    refusedBefore(deliveryId: string | undefined, rawBody: Buffer): boolean {
      const key = createHash('sha256').update(deliveryId ?? '').update('\0').update(rawBody).digest('base64')
      const before = seen.delete(key)
      seen.add(key)
      if (seen.size > limit) seen.delete(seen.values().next().value!)
      return before
    },
  }
}
