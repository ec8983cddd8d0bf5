// POST {WEBHOOK_PATH}: the raw body is captured with raw-body under the size limit (a Content-Length
// over it is refused before a byte is read; a streamed body is cut off at the limit), then handed to
// receiveWebhook. Answers follow the contract table in README.md.
import { type Response, Router } from 'express'
import getRawBody from 'raw-body'
import type { Metrics } from '../metrics/metrics.js'
import { loggableError } from '../db/database-errors.js'
import { AppError } from '../http/app-error.js'
import { loggableDeliveryId, type ReceiveDeps, receiveWebhook } from './receive-webhook.js'

/** The writer (group commit) and the memory of stored ids come made (delivery-ingest.ts). */
export interface WebhookRouteDeps extends ReceiveDeps {
  path: string
  bodyLimitBytes: number
  metrics?: Metrics | undefined
  /** False while the service waits for its database at start-up. */
  isReady?: (() => boolean) | undefined
}

// The two answers a stored delivery gets, encoded once: Express's res.json would stringify, look up the
// content type and hash an ETag for every delivery (a sender never revalidates a POST's answer)
const JSON_CONTENT_TYPE = 'application/json; charset=utf-8'
const RECEIVED = Buffer.from(JSON.stringify({ received: true }))
const RECEIVED_DUPLICATE = Buffer.from(JSON.stringify({ received: true, duplicate: true }))

function answer(res: Response, body: Buffer): void {
  res.writeHead(200, { 'Content-Type': JSON_CONTENT_TYPE, 'Content-Length': body.length })
  res.end(body)
}

export function webhookRoutes(deps: WebhookRouteDeps): Router {
  const router = Router()
  router.post(deps.path, async (req, res) => {
    const deliveryId = req.get('x-partner-delivery-id')
    if (deps.isReady && !deps.isReady()) {
      // before the body is read: the connection is closed rather than drained
      res.set('Connection', 'close')
      deps.metrics?.deliveries.inc({ outcome: 'rejected' })
      throw new AppError(503, 'database_unavailable', 'The service is starting and its database is not ready; retry later')
    }
    let rawBody: Buffer
    try {
      rawBody = await getRawBody(req, {
        length: req.headers['content-length'],
        limit: deps.bodyLimitBytes,
      })
    } catch (error) {
      const status = (error as { status?: number }).status
      // close the connection rather than read (and discard) the rest of an oversized body
      res.set('Connection', 'close')
      if (status === 413) {
        throw new AppError(413, 'payload_too_large', `The body is larger than ${deps.bodyLimitBytes} bytes`)
      }
      throw new AppError(400, 'invalid_payload', 'The body could not be read', { cause: error })
    }
    const started = process.hrtime.bigint()
    try {
      const result = await receiveWebhook(deps, { deliveryId, signature: req.get('x-partner-signature'), rawBody })
      const outcome = result.duplicate ? 'duplicate' : result.outcome
      // a reused id is counted apart (its stored outcome, the status rules', is in the log and the row)
      deps.metrics?.deliveries.inc({ outcome: !result.duplicate && result.idReused ? 'id_reused' : outcome })
      deps.metrics?.ingestSeconds.observe({ outcome }, Number(process.hrtime.bigint() - started) / 1e9)
      deps.logger.info(
        { ...loggableDeliveryId(deliveryId), outcome, ...(result.duplicate ? {} : { eventType: result.eventType }) },
        'webhook received',
      )
      answer(res, result.duplicate ? RECEIVED_DUPLICATE : RECEIVED)
    } catch (error) {
      if (error instanceof AppError) {
        if (error.code === 'invalid_signature') deps.metrics?.signatureFailures.inc()
        deps.metrics?.deliveries.inc({ outcome: 'rejected' })
        if (error.code === 'database_unavailable') deps.logger.error({ ...loggableDeliveryId(deliveryId), err: loggableError(error.cause) }, 'webhook not stored')
        if (error.code === 'overloaded') deps.logger.warn({ ...loggableDeliveryId(deliveryId) }, 'webhook refused: ingest queue full')
      }
      throw error
    }
  })
  return router
}
