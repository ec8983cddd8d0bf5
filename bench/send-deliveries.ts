// A fixed number of signed webhook deliveries to a receiver, 50 connections at once (autocannon), each
// request's body and delivery id made by `make` from a counter of its own: what the A/B benchmarks send.
import autocannon from 'autocannon'
import { deliveryHeaders } from './bench-secrets.js'

export type MakeDelivery = (index: number) => { body: string; deliveryId: string }

/** Sends `amount` deliveries; throws unless every one was answered 2xx. Resolves to autocannon's result. */
export async function sendDeliveries(port: number, make: MakeDelivery, amount: number) {
  let index = 0
  const result = await autocannon({
    url: `http://127.0.0.1:${port}`,
    connections: 50,
    amount,
    requests: [
      {
        method: 'POST',
        path: '/webhooks/partner',
        setupRequest: ((request: Record<string, unknown>) => {
          const { body, deliveryId } = make(index++)
          request.body = body
          request.headers = deliveryHeaders(body, deliveryId)
          return request
        }) as never,
      },
    ],
  })
  if (result.non2xx || result.errors) throw new Error(`non-2xx ${result.non2xx}, errors ${result.errors}`)
  return result
}
