// Fixed, public secrets for the benchmarks only, and the headers the platform would send with a body.
import { createHmac } from 'node:crypto'

export const BENCH_SECRET = 'bench-webhook-secret-0123456789abcdef'

export function deliveryHeaders(body: string, deliveryId: string): Record<string, string> {
  return {
    'content-type': 'application/json',
    'x-partner-delivery-id': deliveryId,
    'x-partner-signature': `sha256=${createHmac('sha256', BENCH_SECRET).update(body).digest('hex')}`,
  }
}
