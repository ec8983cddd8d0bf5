// Signing and sending webhooks as the platform does, for tests.
import { createHmac, randomUUID } from 'node:crypto'
import type { App } from '../../src/http/app.js'
import request from 'supertest'
import { rememberSecret } from './log-sink.js'
import { TEST_WEBHOOK_SECRET } from './test-config.js'

export function signBody(body: string | Buffer, secret = TEST_WEBHOOK_SECRET): string {
  const signature = `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`
  rememberSecret(signature.slice('sha256='.length))
  return signature
}

export function tradePayload(externalReference: string, status: string, tradeId = `trd_${externalReference}`) {
  return { trade_id: tradeId, reference: `REF-${externalReference}`, status, external_reference: externalReference }
}

export interface SendOptions {
  body: string | Buffer | object
  deliveryId?: string | null
  secret?: string
  signature?: string | null
  path?: string
}

/** POSTs a signed delivery through supertest; `signature: null` sends none, a string sends that. */
export function sendWebhook(app: App, options: SendOptions) {
  const raw =
    typeof options.body === 'string' || Buffer.isBuffer(options.body) ? options.body : JSON.stringify(options.body)
  // superagent would re-serialize a Buffer sent as JSON; bytes go as they are under another type
  let call = request(app)
    .post(options.path ?? '/webhooks/partner')
    .set('Content-Type', Buffer.isBuffer(raw) ? 'application/octet-stream' : 'application/json')
  const deliveryId = options.deliveryId === undefined ? `dlv_${randomUUID()}` : options.deliveryId
  if (deliveryId !== null) call = call.set('X-Partner-Delivery-Id', deliveryId)
  const signature = options.signature === undefined ? signBody(raw, options.secret) : options.signature
  if (signature !== null) call = call.set('X-Partner-Signature', signature)
  return call.send(raw)
}

/** POSTs a signed delivery to a running service's webhook path over HTTP: its status and its answer. */
export async function postDelivery(url: string, { id, body }: { id: string; body: string }) {
  const response = await fetch(`${url}/webhooks/partner`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-partner-delivery-id': id, 'x-partner-signature': signBody(body) },
    body,
  })
  return { status: response.status, answer: (await response.json()) as { received?: boolean; duplicate?: boolean } }
}
