// The platform's request authentication (spec section 5), written from the spec alone and apart from
// the client's signing, so that a mistake on one side is not mirrored on the other.
// HMAC-SHA256 over `{METHOD}.{path}.{timestamp}.{nonce}.{body}` with the raw bytes received; the
// timestamp must be inside the window; a nonce is refused if seen inside the window.
import { createHmac, timingSafeEqual } from 'node:crypto'
import type { Clock } from '../clock.js'

export type AuthFailure = 'missing_auth_headers' | 'unknown_key' | 'stale_timestamp' | 'invalid_signature' | 'replayed_nonce'

export interface AuthRequest {
  method: string
  path: string
  rawBody: Buffer
  header(name: string): string | undefined
}

export class SandboxAuthenticator {
  // nonce → when it stops mattering; pruned as time passes, so memory is bounded by the window
  private readonly nonces = new Map<string, number>()
  private lastPrune = 0

  constructor(
    private readonly keys: () => ReadonlyMap<string, string>,
    private readonly windowS: number,
    private readonly clock: Clock,
  ) {}

  check(request: AuthRequest): AuthFailure | undefined {
    const keyId = request.header('x-partner-key-id')
    const timestamp = request.header('x-partner-timestamp')
    const nonce = request.header('x-partner-nonce')
    const signature = request.header('x-partner-signature')
    if (!keyId || !timestamp || !nonce || !signature) return 'missing_auth_headers'
    const secret = this.keys().get(keyId)
    if (secret === undefined) return 'unknown_key'
    const nowS = Math.floor(this.clock.now() / 1000)
    if (!/^\d{1,12}$/.test(timestamp) || Math.abs(nowS - Number(timestamp)) > this.windowS) return 'stale_timestamp'
    const expected = createHmac('sha256', secret)
      .update(Buffer.concat([Buffer.from(`${request.method.toUpperCase()}.${request.path}.${timestamp}.${nonce}.`), request.rawBody]))
      .digest()
    const presented = /^[0-9a-fA-F]{64}$/.test(signature) ? Buffer.from(signature, 'hex') : Buffer.alloc(32)
    if (!timingSafeEqual(expected, presented) || !/^[0-9a-fA-F]{64}$/.test(signature)) return 'invalid_signature'
    this.prune(nowS)
    const nonceKey = `${keyId}:${nonce}`
    if (this.nonces.has(nonceKey)) return 'replayed_nonce'
    this.nonces.set(nonceKey, Number(timestamp) + this.windowS)
    return undefined
  }

  private prune(nowS: number): void {
    if (nowS === this.lastPrune) return
    this.lastPrune = nowS
    for (const [nonce, expiresS] of this.nonces) if (expiresS < nowS) this.nonces.delete(nonce)
  }

  /** How many nonces are remembered: bounded by the window. */
  get rememberedNonces(): number {
    return this.nonces.size
  }
}
