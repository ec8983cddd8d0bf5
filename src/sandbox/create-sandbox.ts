// The sandbox platform: the partner API of the spec (signed requests, eleven endpoints, the lifecycle
// of sandbox-platform.ts) and its webhooks (webhook-dispatcher.ts), in one Express app that runs in
// this process (tests, the demo, `npm start` in local mode) or on its own (`npm run cli -- sandbox`).
// It is a development tool: it imports nothing of the receiver.
import { createHash, timingSafeEqual } from 'node:crypto'
import { once } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { parse as parseContentType } from 'content-type'
import express, { type Express, type Request, type Response } from 'express'
import { type Clock, MAX_TIMER_MS, systemClock } from '../clock.js'
import { bearerCredential } from '../http/authorization.js'
import { isLoopbackHost } from '../http/loopback-host.js'
import { createLogger, type Logger } from '../logger.js'
import type { FullTradeRecord as TradeRecord } from '../partner-api/types.js'
import { printable } from '../printable.js'
import { SandboxAuthenticator } from './sandbox-auth.js'
import { SandboxError, SandboxPlatform } from './sandbox-platform.js'
import { openSandboxState } from './sandbox-state.js'
import { lockSandboxState } from './sandbox-state-lock.js'
import {
  type DeliveryAttempt,
  type Faults,
  NO_FAULTS,
  type PendingEvent,
  REORDER_HOLD_MS,
  WebhookDispatcher,
} from './webhook-dispatcher.js'

export interface SandboxOptions {
  keyId: string
  apiSecret: string
  webhookSecret: string
  /** Where webhooks go; without one, every attempt fails (as if no webhook were registered). */
  webhookUrl?: string
  /** Bearer token of the /sandbox/* control endpoints; without one they refuse every call. */
  controlToken?: string | undefined
  partnerKind?: 'marketplace' | 'merchant'
  retryBaseDelayMs?: number
  retryMaxDelayMs?: number
  attemptTimeoutMs?: number
  timestampWindowS?: number
  refundDelayMs?: number
  /**
   * What a milestone deliver or release answers, of the two records the spec allows ("Milestone or trade
   * record"): `trade`, the whole trade record (the default), or `milestone`, the milestone's full record after the
   * step, so that a client is tried against both (SANDBOX_MILESTONE_ANSWER).
   */
  milestoneAnswer?: 'trade' | 'milestone'
  faults?: Partial<Faults>
  /**
   * The reorder fault's longest hold: an event it holds goes out after its trade's next event, or after this when
   * none comes (REORDER_HOLD_MS, 3 s).
   */
  reorderHoldMs?: number
  /**
   * Where the trades, the reference counter and undelivered webhooks are kept across restarts
   * (sandbox-state.ts: this snapshot file and its journal beside it); read at creation, each change saved before
   * it is answered. Without one, all is in memory.
   */
  stateFile?: string
  clock?: Clock
  logger?: Logger
  fetch?: typeof fetch
}

export const SANDBOX_DEFAULTS = {
  retryBaseDelayMs: 1_000,
  retryMaxDelayMs: 60_000,
  attemptTimeoutMs: 5_000,
  timestampWindowS: 300,
  refundDelayMs: 1_000,
  milestoneAnswer: 'trade',
  reorderHoldMs: REORDER_HOLD_MS,
} as const

export interface Sandbox {
  readonly app: Express
  readonly deliveryLog: readonly DeliveryAttempt[]
  listen(port: number, host?: string): Promise<string>
  close(): Promise<void>
  setWebhookUrl(url: string | undefined): void
  setFaults(faults: Partial<Faults>): void
  setReceiverDown(down: boolean): void
  failTrade(tradeId: string, failing: boolean): void
  /** Resolves when no webhook attempt, retry or refund is pending. */
  idle(): Promise<void>
  trade(tradeId: string): TradeRecord
  trades(): TradeRecord[]
  /** Sends a seller onboarding event (`seller.{status}`), as the control endpoint does. */
  sellerStatus(sellerId: string, status: string): void
  /** Sends a buyer onboarding event (`buyer.{status}`); marketplace partners only, as the spec says. */
  buyerStatus(buyerId: string, status: string): void
}

const API = '/api/partner/v1'

export function createSandbox(options: SandboxOptions): Sandbox {
  const clock = options.clock ?? systemClock
  const logger = options.logger ?? createLogger({ level: 'warn', secrets: [options.apiSecret, options.webhookSecret] })
  const settings = { ...SANDBOX_DEFAULTS, ...definedOnly(options) }
  let webhookUrl = options.webhookUrl
  const partnerKind = options.partnerKind ?? 'marketplace'

  const dispatcher = new WebhookDispatcher({
    clock,
    logger,
    fetch: options.fetch ?? fetch,
    webhookUrl: () => webhookUrl,
    webhookSecret: () => options.webhookSecret,
    retryBaseDelayMs: settings.retryBaseDelayMs,
    retryMaxDelayMs: settings.retryMaxDelayMs,
    attemptTimeoutMs: settings.attemptTimeoutMs,
    faults: { ...NO_FAULTS, ...options.faults },
    reorderHoldMs: settings.reorderHoldMs,
    // inside a request the route saves once at its end (again if an attempt started meanwhile: its count)
    onPendingChange: () => {
      if (handling === 0) saveInBackground()
      else pendingChanged = true
    },
  })
  // An API call's webhooks and refunds wait until its state is saved: a call whose state cannot be saved is
  // undone, and must have sent nothing (it used to answer 500 after its trade existed and its webhook went out,
  // and the client's retry made a second trade)
  let deferred: { events: PendingEvent[]; effects: (() => void)[] } | undefined
  const whenSaved = (effect: () => void, event?: PendingEvent) => {
    if (!deferred) return effect()
    deferred.effects.push(effect)
    if (event) deferred.events.push(event)
  }
  const platform = new SandboxPlatform({
    clock,
    partnerKind: () => partnerKind,
    onStatusChange: (trade) => {
      const event = dispatcher.prepare(
        `trade.${trade.status}`,
        // exactly the four fields of the spec's trade payload
        {
          trade_id: trade.trade_id,
          reference: trade.reference,
          status: trade.status,
          external_reference: trade.external_reference,
        },
        trade.trade_id,
        trade.status,
      )
      whenSaved(() => dispatcher.dispatch(event), event)
    },
    scheduleRefund: (tradeId) =>
      whenSaved(() =>
        dispatcher.track(
          clock.sleep(settings.refundDelayMs).then(() => {
            if (closed) return
            platform.refund(tradeId)
            saveInBackground()
          }),
        ),
      ),
  })

  // state persistence: restore what a previous run saved, then save after every change
  let closed = false
  let handling = 0
  let pendingChanged = false
  // restored webhooks are sent again once this sandbox listens: one that cannot (its port taken, perhaps
  // by a sandbox already running over the same file) must neither send them nor write the file under it
  let unsent: PendingEvent[] = []
  // `waiting`: the webhooks of the call being saved, not queued yet. What is written is what changed since the last
  // save (the whole state only when the journal is due for a new snapshot)
  const save = (waiting: readonly PendingEvent[] = []) => {
    if (!store || closed) return
    const pendingWebhooks = [...unsent, ...dispatcher.pending(), ...waiting]
    store.save({ ...platform.changes(), pendingWebhooks }, () => ({ ...platform.snapshot(), pendingWebhooks }))
    platform.forgetChanges()
  }
  // a save outside a request (a delivery settled, a refund) has no one to answer: it is logged
  const saveInBackground = () => {
    try {
      save()
    } catch (error) {
      logger.error({ err: error }, 'sandbox state not saved')
    }
  }
  const opened = options.stateFile ? openSandboxState(options.stateFile, logger) : undefined
  const store = opened?.store
  const saved = opened?.state
  if (saved) {
    platform.restore(saved)
    unsent = saved.pendingWebhooks
  }
  const keys = new Map([[options.keyId, options.apiSecret]])
  const auth = new SandboxAuthenticator(() => keys, settings.timestampWindowS, clock)

  const app = express()
  app.disable('x-powered-by')
  // the platform's paths as the spec writes them: /API/… or /trades/tr_1 (no closing slash) is not one of them,
  // and is not authenticated as one
  app.set('case sensitive routing', true)
  app.set('strict routing', true)
  // Date from the sandbox's own clock, the one its timestamp window is checked on (Node would send the
  // machine's): a client tells from it how far apart the clocks are when a timestamp is refused
  app.use((_req, res, next) => {
    res.setHeader('Date', new Date(clock.now()).toUTCString())
    next()
  })
  // raw bytes: the signature is recomputed over the body exactly as received. Not inflated: a gzip body was
  // checked against the signature of its decoded JSON, where the spec signs the bytes sent; one with a
  // Content-Encoding is refused (415 unsupported_encoding) before it is read
  app.use(API, express.raw({ type: () => true, limit: '1mb', inflate: false }), (req, res, next) => {
    const rawBody = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0)
    const [path, query] = splitOnce(req.originalUrl, '?')
    // a GET's {body} is the empty string (spec section 5), whatever bytes came with it
    const failure = auth.check({
      method: req.method,
      path,
      rawBody: req.method === 'GET' ? Buffer.alloc(0) : rawBody,
      header: (name) => req.get(name),
    })
    if (failure) {
      res.status(401).json({ error: { code: failure, message: authMessages[failure] } })
      return
    }
    // what the signature does not cover is refused, not ignored: no operation takes a query string, and a GET
    // has no body
    if (query !== undefined) {
      res.status(400).json({ error: { code: 'query_not_allowed', message: 'No operation takes a query string: it is not signed' } })
      return
    }
    if (req.method === 'GET' && rawBody.length > 0) {
      res.status(400).json({ error: { code: 'body_not_allowed', message: 'A GET has no body: it is not signed' } })
      return
    }
    // the spec's bodies are JSON sent as `Content-Type: application/json`: a client that labels its body otherwise (or
    // not at all) is told so here, not first by the platform
    if (req.method !== 'GET' && rawBody.length > 0 && !isJsonContentType(req.get('content-type'))) {
      res.status(415).json({
        error: { code: 'unsupported_media_type', message: 'A body is JSON sent as Content-Type: application/json (charset utf-8, if one is named)' },
      })
      return
    }
    if (req.method !== 'GET') {
      // decoded strictly: Buffer's toString put U+FFFD in place of bytes that are not UTF-8 (a Latin-1 é), and the
      // trade, and every webhook of it, carried an external reference the partner never sent
      let text: string
      try {
        text = strictUtf8.decode(rawBody)
      } catch {
        res.status(400).json({ error: { code: 'invalid_body', message: 'The body is not valid UTF-8: send JSON in UTF-8' } })
        return
      }
      try {
        req.body = rawBody.length === 0 ? {} : JSON.parse(text)
      } catch {
        res.status(400).json({ error: { code: 'invalid_json', message: 'The body is not valid JSON' } })
        return
      }
      if (req.body === null || typeof req.body !== 'object' || Array.isArray(req.body)) {
        res.status(400).json({ error: { code: 'invalid_json', message: 'The body must be a JSON object' } })
        return
      }
    }
    next()
  })

  // every API operation but GET may change the state: it is on disk before the answer goes out, and before its
  // webhooks and refunds start. One whose state cannot be saved (DATA_DIR full or read-only) is undone: 503
  // state_not_saved, and a retry does it once
  const route = (handler: (req: Request) => unknown, status = 200) => (req: Request, res: Response) => {
    const changes = req.method !== 'GET'
    // what the call changes can be undone, should its save fail
    const undoable = changes && store !== undefined
    if (undoable) platform.beginChange()
    const call: NonNullable<typeof deferred> = { events: [], effects: [] }
    let result: unknown
    let unsaved: unknown
    // (what the call queues saves nothing on its own: the route saves once, at its end)
    handling++
    deferred = call
    pendingChanged = false
    try {
      try {
        result = handler(req)
      } catch (error) {
        // refused: the platform checks before it changes anything, so there is nothing to undo (nor, so far, to send)
        deferred = undefined
        for (const effect of call.effects) effect()
        throw error
      }
      deferred = undefined
      if (changes) {
        try {
          save(call.events)
        } catch (error) {
          unsaved = error
        }
      }
      if (unsaved === undefined) {
        pendingChanged = false
        for (const effect of call.effects) effect()
        // one the faults dropped is owed no more, and one whose first attempt started has it counted: the file
        // says so too
        if (pendingChanged || call.events.some((event) => !dispatcher.owes(event.eventId))) saveInBackground()
      }
    } finally {
      handling--
      if (unsaved === undefined) platform.endChange()
    }
    if (unsaved !== undefined) {
      platform.undoChange()
      logger.error({ err: unsaved }, 'sandbox state not saved: the call is undone')
      res.status(503).set('Retry-After', '1').json({
        error: { code: 'state_not_saved', message: 'The sandbox could not save its state (is DATA_DIR full or read-only?): nothing changed; try again' },
      })
      return
    }
    res.status(status).json(result)
  }
  const id = (req: Request, name: string) => String(req.params[name])
  // the trade as it is after the milestone's step, or that milestone's own record in it
  const milestoneStepAnswer = (trade: TradeRecord, milestoneId: string) =>
    settings.milestoneAnswer === 'milestone'
      ? trade.milestones!.find((milestone) => milestone.milestone_id === milestoneId)!
      : trade
  app.post(`${API}/trades/`, route((req) => platform.create(req.body), 201))
  app.get(`${API}/trades/:id/`, route((req) => platform.get(id(req, 'id'))))
  app.post(`${API}/trades/:id/fund/`, route((req) => platform.fund(id(req, 'id'))))
  app.post(`${API}/trades/:id/deliver/`, route((req) => platform.deliver(id(req, 'id'))))
  app.post(`${API}/trades/:id/release/`, route((req) => platform.release(id(req, 'id'))))
  app.post(`${API}/trades/:id/cancel/`, route((req) => platform.cancel(id(req, 'id'))))
  app.post(
    `${API}/trades/:id/milestones/:milestoneId/deliver/`,
    route((req) => milestoneStepAnswer(platform.deliverMilestone(id(req, 'id'), id(req, 'milestoneId')), id(req, 'milestoneId'))),
  )
  app.post(
    `${API}/trades/:id/milestones/:milestoneId/release/`,
    route((req) => milestoneStepAnswer(platform.releaseMilestone(id(req, 'id'), id(req, 'milestoneId')), id(req, 'milestoneId'))),
  )
  app.post(`${API}/trades/:id/dispute/`, route((req) => platform.openDispute(id(req, 'id'), req.body), 201))
  app.post(`${API}/trades/:id/proposals/`, route((req) => platform.createProposal(id(req, 'id'), req.body), 201))
  app.post(
    `${API}/trades/:id/proposals/:proposalId/respond/`,
    route((req) => platform.respond(id(req, 'id'), id(req, 'proposalId'), req.body)),
  )

  // control endpoints: sandbox only, not signed like the API but behind a bearer token, and only under a
  // loopback Host name, so a web page cannot reach them through DNS rebinding
  app.use('/sandbox', (req, res, next) => {
    if (!isLoopbackHost(req.get('host'))) {
      res.status(403).json({
        error: { code: 'forbidden_host', message: 'Control endpoints answer only to localhost, 127.0.0.1 or [::1]' },
      })
      return
    }
    if (!options.controlToken || !sameToken(bearerCredential(req.get('authorization')), options.controlToken)) {
      res.status(401).json({
        error: {
          code: 'invalid_control_token',
          message: 'Control endpoints need Authorization: Bearer <sandboxControlToken of DATA_DIR/local-secrets.json or SANDBOX_CONTROL_TOKEN>',
        },
      })
      return
    }
    next()
  })
  // JSON whatever the Content-Type says, as the API's bodies are: `curl -d` sends a form's, and a body of another
  // type used to be left unread, its settings ignored and the call answered 200
  app.use('/sandbox', express.json({ type: () => true }))
  app.get('/sandbox/deliveries', (_req, res) => {
    res.json(dispatcher.log)
  })
  app.get('/sandbox/trades', (_req, res) => {
    res.json(platform.list())
  })
  app.post('/sandbox/faults', (req, res) => {
    dispatcher.setFaults(pickFaults(req.body))
    res.json(dispatcher.currentFaults)
  })
  app.post('/sandbox/receiver-down', (req, res) => {
    const down: unknown = req.body?.down
    if (typeof down !== 'boolean') {
      throw new SandboxError(422, 'validation_failed', 'down must be true or false', [
        { field: 'down', message: 'is required: true or false' },
      ])
    }
    dispatcher.setReceiverDown(down)
    res.json({ down })
  })
  app.post('/sandbox/sellers/:sellerId/status', (req, res) => {
    sendSellerStatus(String(req.params.sellerId), req.body?.status)
    res.status(202).json({ queued: true })
  })
  app.post('/sandbox/buyers/:buyerId/status', (req, res) => {
    sendBuyerStatus(String(req.params.buyerId), req.body?.status)
    res.status(202).json({ queued: true })
  })

  app.use((req, res) => {
    res.status(404).json({ error: { code: 'not_found', message: `No route for ${req.method} ${req.path}` } })
  })
  app.use((error: unknown, _req: Request, res: Response, _next: express.NextFunction) => {
    if (error instanceof SandboxError) {
      res.status(error.status).json({
        error: { code: error.code, message: error.message, ...(error.fields ? { fields: error.fields } : {}) },
      })
      return
    }
    // what express.json refused in a control call's body (its errors have a type): not JSON (nor an object or
    // array), too large, or in a charset or encoding it does not read; else what the router refused (a path
    // whose percent-encoding does not decode)
    const { status, type } = error as { status?: number; type?: string }
    if (status === 413) {
      res.status(413).json({ error: { code: 'payload_too_large', message: 'The body is too large' } })
      return
    }
    if (type === 'encoding.unsupported') {
      res.status(415).json({
        error: { code: 'unsupported_encoding', message: "The body's Content-Encoding is not accepted: send the body unencoded (an API call's signature covers the bytes sent)" },
      })
      return
    }
    if (type === 'entity.parse.failed') {
      res.status(400).json({ error: { code: 'invalid_json', message: 'The body is not a JSON object' } })
      return
    }
    if (status !== undefined && status >= 400 && status < 500) {
      res.status(status).json({
        error: type
          ? { code: 'invalid_body', message: 'The body cannot be read: send JSON in UTF-8' }
          : { code: 'invalid_request', message: `The request cannot be read: ${(error as Error).message}` },
      })
      return
    }
    logger.error({ err: error }, 'sandbox error')
    res.status(500).json({ error: { code: 'internal_error', message: 'Internal error' } })
  })

  function sendSellerStatus(sellerId: string, status: unknown): void {
    checkOnboardingEvent('seller', sellerId, status)
    dispatcher.send(`seller.${status}`, { event: `seller.${status}`, seller_id: sellerId, status }, null, status)
  }

  // The spec's third event kind: "only for Marketplace partners with KYC-gated buyers". Its payload is
  // not shown; it mirrors the seller event.
  function sendBuyerStatus(buyerId: string, status: unknown): void {
    if (partnerKind !== 'marketplace') {
      throw new SandboxError(409, 'not_marketplace', 'Buyer onboarding events exist only for Marketplace partners')
    }
    checkOnboardingEvent('buyer', buyerId, status)
    dispatcher.send(`buyer.${status}`, { event: `buyer.${status}`, buyer_id: buyerId, status }, null, status)
  }

  let server: http.Server | undefined
  // the state file is this process's while it listens: a second process over it (another service on the same
  // DATA_DIR) is refused before it listens, sends or writes anything
  let unlock: (() => void) | undefined
  const stopBeforeListening = () => {
    closed = true
    dispatcher.stop()
    server = undefined
    unlock?.()
    unlock = undefined
  }
  return {
    app,
    deliveryLog: dispatcher.log,
    listen: async (port, host = '127.0.0.1') => {
      try {
        if (options.stateFile && !unlock) unlock = lockSandboxState(options.stateFile)
      } catch (error) {
        stopBeforeListening()
        throw error
      }
      server = http.createServer(app)
      server.listen(port, host)
      try {
        await once(server, 'listening')
      } catch (error) {
        stopBeforeListening()
        throw error
      }
      dispatcher.resume(unsent)
      unsent = []
      return `http://${host}:${(server.address() as AddressInfo).port}`
    },
    close: async () => {
      // nothing more is sent or saved: what was undelivered is in the state file for the next start
      closed = true
      dispatcher.stop()
      unlock?.()
      unlock = undefined
      if (!server) return
      const closing = new Promise<void>((resolve) => server!.close(() => resolve()))
      server.closeAllConnections()
      await closing
    },
    setWebhookUrl: (url) => {
      webhookUrl = url
    },
    setFaults: (faults) => dispatcher.setFaults(faults),
    setReceiverDown: (down) => dispatcher.setReceiverDown(down),
    failTrade: (tradeId, failing) => dispatcher.failTrade(tradeId, failing),
    idle: () => dispatcher.idle(),
    trade: (tradeId) => platform.get(tradeId),
    trades: () => platform.list(),
    sellerStatus: sendSellerStatus,
    buyerStatus: sendBuyerStatus,
  }
}

// fatal: bytes that are not UTF-8 are refused, not replaced; ignoreBOM: a byte-order mark stays in the text (and
// JSON.parse refuses it, as it did)
const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })

const ONBOARDING_STATUS = /^[a-z0-9_]{1,64}$/
// a seller or buyer id as the platform would issue one: no control codes, as long as a trade's fields at most
const isOnboardingId = (id: string) => id.length >= 1 && id.length <= 200 && printable(id) === id

function checkOnboardingEvent(party: 'seller' | 'buyer', id: string, status: unknown): asserts status is string {
  const fields: { field: string; message: string }[] = []
  if (!isOnboardingId(id)) fields.push({ field: `${party}_id`, message: 'must be 1 to 200 characters without control codes' })
  if (typeof status !== 'string' || !ONBOARDING_STATUS.test(status)) {
    fields.push({ field: 'status', message: 'is required: lowercase letters, digits and _, at most 64' })
  }
  if (fields.length > 0) {
    throw new SandboxError(422, 'validation_failed', `Invalid ${party} event: ${fields.map((f) => f.field).join(', ')}`, fields)
  }
}

const authMessages = {
  missing_auth_headers: 'X-Partner-Key-Id, X-Partner-Timestamp, X-Partner-Nonce and X-Partner-Signature are required',
  unknown_key: 'The key id is not known',
  stale_timestamp: 'The timestamp is outside the accepted window',
  invalid_signature: 'The signature does not match the request',
  replayed_nonce: 'The nonce was already used within the window',
} as const

function splitOnce(text: string, separator: string): [string, string | undefined] {
  const at = text.indexOf(separator)
  return at === -1 ? [text, undefined] : [text.slice(0, at), text.slice(at + 1)]
}

function sameToken(presented: string, expected: string): boolean {
  // equal-length digests: the comparison takes the same time whatever was presented
  const digest = (value: string) => createHash('sha256').update(value).digest()
  return timingSafeEqual(digest(presented), digest(expected))
}

function definedOnly<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>
}

interface FaultRule {
  test: (value: number) => boolean
  message: string
}
const SHARE: FaultRule = { test: (value) => value >= 0 && value <= 1, message: 'must be a share between 0 and 1' }
const whole = (message: string, max = Number.MAX_SAFE_INTEGER): FaultRule => ({
  test: (value) => Number.isSafeInteger(value) && value >= 0 && value <= max,
  message,
})
const FAULT_RULES: Record<keyof Faults, FaultRule> = {
  dropRate: SHARE,
  duplicateRate: SHARE,
  reorderRate: SHARE,
  delayRate: SHARE,
  // a longer wait would end after 1 ms, not when asked (the timers' limit)
  delayMs: whole(`must be a whole number of ms, at most ${MAX_TIMER_MS}`, MAX_TIMER_MS),
  seed: whole('must be a whole number'),
}

/** The fault settings a control call names; every key must be one of them, with a valid value, or nothing changes. */
function pickFaults(body: unknown): Partial<Faults> {
  if (Array.isArray(body)) {
    throw new SandboxError(400, 'invalid_json', 'The body must be a JSON object of fault settings')
  }
  const picked: Partial<Faults> = {}
  const fields: { field: string; message: string }[] = []
  for (const [key, value] of Object.entries((body ?? {}) as Record<string, unknown>)) {
    const rule = Object.hasOwn(FAULT_RULES, key) ? FAULT_RULES[key as keyof Faults] : undefined
    if (!rule) fields.push({ field: key, message: `is not a fault setting (${Object.keys(FAULT_RULES).join(', ')})` })
    else if (typeof value !== 'number' || !rule.test(value)) fields.push({ field: key, message: rule.message })
    else picked[key as keyof Faults] = value
  }
  if (fields.length > 0) {
    throw new SandboxError(422, 'validation_failed', `Invalid fault settings: ${fields.map((f) => f.field).join(', ')}`, fields)
  }
  return picked
}

/** Whether a Content-Type names JSON, in UTF-8 if it names a charset at all. */
function isJsonContentType(header: string | undefined): boolean {
  if (header === undefined) return false
  try {
    const { type, parameters } = parseContentType(header)
    return type === 'application/json' && (parameters.charset === undefined || /^utf-?8$/i.test(parameters.charset))
  } catch {
    return false
  }
}
