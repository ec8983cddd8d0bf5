// Delivers the sandbox's webhooks as the spec says the platform does: signed with the webhook secret
// (`sha256=` hex HMAC of the raw body), a fresh X-Partner-Delivery-Id for every attempt, at most 6
// attempts with exponential backoff, a 2xx within the attempt timeout counting as delivered.
// An attempt is counted (and saved, through onPendingChange) before it is sent, so a restart, however abrupt,
// carries on from the next attempt and never makes a seventh.
// Faults are drawn from the seed and the event (keyedDraw): a run repeats them for a seed, each event getting the
// same faults whatever order concurrent trades reach the dispatcher in (a demo's fifty trades, a test's).
// An event the reorder fault holds goes out after its trade's next event, or after reorderHoldMs when none comes
// (its trade's last event, or every event at a rate of 1): a hold without that bound kept the last event of a
// trade for ever, never sent and never logged.
import { createHmac, randomUUID } from 'node:crypto'
import type { Clock } from '../clock.js'
import { readAnswer } from '../http/read-answer.js'
import type { Logger } from '../logger.js'
import { keyedDraw } from './seeded-random.js'

export const MAX_ATTEMPTS = 6

/** How long the reorder fault holds an event at most, when no later event of its trade comes to overtake it. */
export const REORDER_HOLD_MS = 3_000

// a receiver's answer is read this far at most (a receiver may answer with a body that never ends)
const MAX_ANSWER_BYTES = 64 * 1024

export interface Faults {
  /** Share of events never delivered at all. */
  dropRate: number
  /** Share of delivered attempts sent a second time with the same delivery id. */
  duplicateRate: number
  /** Share of events held back so the trade's next event overtakes them. */
  reorderRate: number
  /** Share of events delayed by delayMs before their first attempt. */
  delayRate: number
  delayMs: number
  seed: number
}

export const NO_FAULTS: Faults = { dropRate: 0, duplicateRate: 0, reorderRate: 0, delayRate: 0, delayMs: 0, seed: 1 }

/** `held`: the reorder fault holds the event (attempt 0) until its trade's next event has gone, or its hold ends. */
export type AttemptResult = 'delivered' | 'failed' | 'timeout' | 'dropped' | 'duplicate' | 'held'

export interface DeliveryAttempt {
  eventId: string
  deliveryId: string | null
  attempt: number
  event: string
  tradeId: string | null
  status: string | null
  result: AttemptResult
  httpStatus?: number
  /**
   * Why an attempt got no HTTP status, in a word: the system's code (`ECONNREFUSED`, `ENOTFOUND`, a TLS one),
   * `timeout`, `url_has_credentials` (fetch sends no URL with a user or password), `network_error`, or the
   * sandbox's own `no_webhook_url`, `receiver_down`, `trade_failing`. Never the URL, which may hold a password.
   */
  reason?: string
  at: string
}

export interface DispatcherOptions {
  clock: Clock
  logger: Logger
  fetch: typeof fetch
  webhookUrl: () => string | undefined
  webhookSecret: () => string
  retryBaseDelayMs: number
  retryMaxDelayMs: number
  attemptTimeoutMs: number
  faults: Faults
  /** The reorder fault's longest hold (REORDER_HOLD_MS by default). */
  reorderHoldMs?: number
  /** At most this many attempts are kept in the log (oldest dropped first). */
  logLimit?: number
  /** Called whenever an event starts or stops waiting for delivery, so the caller can save `pending()`. */
  onPendingChange?: () => void
}

/** An event not yet delivered (nor given up): what a restarted sandbox sends again. */
export interface PendingEvent {
  eventId: string
  event: string
  tradeId: string | null
  status: string | null
  body: string
  /** Attempts started so far: a restart resumes from the next one. */
  attempts: number
}

export class WebhookDispatcher {
  readonly log: DeliveryAttempt[] = []
  private faults: Faults
  // how many events of each fault key were dispatched under the current seed: the nth is the key's nth draw
  private readonly drawn = new Map<string, number>()
  // the fault key of each event on its way, for the duplicate fault drawn at its delivery
  private readonly faultKeys = new Map<string, string>()
  private receiverDown = false
  private readonly failingTrades = new Set<string>()
  private readonly inFlight = new Set<Promise<void>>()
  // events held back by the reorder fault, released after the trade's next event or when their hold ends (the
  // controller ends the hold's timer when the next event came first, or the dispatcher stopped)
  private readonly held = new Map<string, { pending: PendingEvent; hold: AbortController }[]>()
  // every event from send() until it is delivered or given up, held ones included
  private readonly undelivered = new Map<string, PendingEvent>()
  private stopped = false
  // the reason of the last attempt with no answer that was logged (warnNoAnswer)
  private lastWarned: string | undefined

  constructor(private readonly options: DispatcherOptions) {
    this.faults = { ...options.faults }
  }

  setFaults(faults: Partial<Faults>): void {
    this.faults = { ...this.faults, ...faults }
    // a seed given again repeats the faults from the start
    if (faults.seed !== undefined) this.drawn.clear()
  }

  get currentFaults(): Faults {
    return { ...this.faults }
  }

  setReceiverDown(down: boolean): void {
    this.receiverDown = down
  }

  failTrade(tradeId: string, failing: boolean): void {
    if (failing) this.failingTrades.add(tradeId)
    else this.failingTrades.delete(tradeId)
  }

  /** Events waiting for delivery, oldest first. */
  pending(): PendingEvent[] {
    return [...this.undelivered.values()].map((pending) => ({ ...pending }))
  }

  /** Whether an event is still owed: queued and neither delivered nor given up (nor dropped by the faults). */
  owes(eventId: string): boolean {
    return this.undelivered.has(eventId)
  }

  /**
   * Sends events a previous run left undelivered, without faults, each from the attempt after those it made and
   * after the gap the schedule puts before that attempt.
   */
  resume(events: readonly PendingEvent[]): void {
    for (const pending of events) {
      const resumed = { ...pending }
      this.undelivered.set(pending.eventId, resumed)
      // (one whose sixth attempt was under way is given up at once)
      const retried = resumed.attempts > 0 && resumed.attempts < MAX_ATTEMPTS
      const gap = retried ? this.retryDelay(resumed.attempts) : 0
      this.track(this.deliver(resumed, gap))
    }
    if (events.length > 0) this.options.onPendingChange?.()
  }

  /** No further attempt starts; what is undelivered stays in pending(). */
  stop(): void {
    this.stopped = true
    // (what is held stays owed: pending() has it, for the next start)
    for (const queue of this.held.values()) for (const { hold } of queue) hold.abort()
    this.held.clear()
  }

  /** Queues one event (a JSON body) for delivery; returns at once. */
  send(event: string, body: Record<string, unknown>, tradeId: string | null, status: string | null): void {
    this.dispatch(this.prepare(event, body, tradeId, status))
  }

  /** An event as it will be sent and saved, not yet queued (dispatch queues it). */
  prepare(event: string, body: Record<string, unknown>, tradeId: string | null, status: string | null): PendingEvent {
    return { eventId: randomUUID(), event, tradeId, status, body: JSON.stringify(body), attempts: 0 }
  }

  /** Queues a prepared event for delivery; returns at once. */
  dispatch(pending: PendingEvent): void {
    const { tradeId } = pending
    const key = this.faultKey(pending)
    const drop = this.draw(key, 'drop') < this.faults.dropRate
    const reorder = this.draw(key, 'reorder') < this.faults.reorderRate
    const delay = this.draw(key, 'delay') < this.faults.delayRate
    if (drop) {
      this.record(pending, null, 0, 'dropped')
      this.releaseHeld(tradeId)
      return
    }
    this.undelivered.set(pending.eventId, pending)
    this.faultKeys.set(pending.eventId, key)
    this.options.onPendingChange?.()
    if (reorder && tradeId !== null) {
      this.hold(pending, tradeId)
      return
    }
    this.track(this.deliver(pending, delay ? this.faults.delayMs : 0))
    this.releaseHeld(tradeId)
  }

  /**
   * What an event's faults are drawn from: its type and what it is about by a name the caller chose (the
   * order's external reference, the seller's or buyer's id), not the trade id or event id the sandbox makes up
   * anew each run, and which of the events so named it is.
   */
  private faultKey(pending: PendingEvent): string {
    const body = JSON.parse(pending.body) as Record<string, unknown>
    const about = [body.external_reference, body.seller_id, body.buyer_id].find((value) => typeof value === 'string') ?? ''
    const named = `${pending.event}\u0000${String(about)}`
    const nth = (this.drawn.get(named) ?? 0) + 1
    this.drawn.set(named, nth)
    return `${named}\u0000${nth}`
  }

  private draw(key: string, fault: string): number {
    return keyedDraw(this.faults.seed, `${key}\u0000${fault}`)
  }

  /** Holds an event for the reorder fault: the trade's next event releases it, or the end of its hold. */
  private hold(pending: PendingEvent, tradeId: string): void {
    const hold = new AbortController()
    const queue = this.held.get(tradeId) ?? []
    queue.push({ pending, hold })
    this.held.set(tradeId, queue)
    this.record(pending, null, 0, 'held')
    this.options.clock.sleep(this.options.reorderHoldMs ?? REORDER_HOLD_MS, hold.signal).then(
      () => this.releaseOne(tradeId, pending),
      // released before its hold ended, or the dispatcher stopped
      () => undefined,
    )
  }

  private releaseOne(tradeId: string, pending: PendingEvent): void {
    const queue = this.held.get(tradeId)
    const at = queue?.findIndex((entry) => entry.pending === pending) ?? -1
    if (!queue || at === -1) return
    queue.splice(at, 1)
    if (queue.length === 0) this.held.delete(tradeId)
    this.track(this.deliver(pending, 0))
  }

  private releaseHeld(tradeId: string | null): void {
    if (tradeId === null) return
    const queue = this.held.get(tradeId)
    if (!queue) return
    this.held.delete(tradeId)
    for (const { pending, hold } of queue) {
      hold.abort()
      this.track(this.deliver(pending, 0))
    }
  }

  /** Resolves when nothing is left to deliver; events still held by the reorder fault are sent first. */
  async idle(): Promise<void> {
    for (;;) {
      for (const tradeId of [...this.held.keys()]) this.releaseHeld(tradeId)
      if (this.inFlight.size === 0) return
      await Promise.allSettled([...this.inFlight])
    }
  }

  /** Adds work that idle() must wait for (the refund timer uses it too). */
  track(work: Promise<void>): void {
    this.inFlight.add(work)
    void work.finally(() => this.inFlight.delete(work))
  }

  private async deliver(pending: PendingEvent, initialDelayMs: number): Promise<void> {
    if (initialDelayMs > 0) await this.options.clock.sleep(initialDelayMs)
    for (let attempt = pending.attempts + 1; attempt <= MAX_ATTEMPTS; attempt++) {
      if (this.stopped) return
      this.countAttempt(pending, attempt)
      const outcome = await this.attempt(pending, attempt)
      if (outcome === 'delivered') return this.settle(pending)
      if (attempt < MAX_ATTEMPTS) await this.options.clock.sleep(this.retryDelay(attempt))
    }
    this.options.logger.warn({ eventId: pending.eventId, event: pending.event }, 'sandbox webhook given up after 6 attempts')
    this.settle(pending)
  }

  /** The wait after the given attempt failed: doubling from the base, capped. */
  private retryDelay(attempt: number): number {
    return Math.min(this.options.retryBaseDelayMs * 2 ** (attempt - 1), this.options.retryMaxDelayMs)
  }

  // before the attempt is sent: one cut short by a crash still counts towards the six (`undelivered` holds
  // this same object, so pending() reports the count)
  private countAttempt(pending: PendingEvent, attempt: number): void {
    pending.attempts = attempt
    this.options.onPendingChange?.()
  }

  private settle(pending: PendingEvent): void {
    // a stopped dispatcher's state was saved with this event pending: a restart sends it again
    if (this.stopped) return
    this.undelivered.delete(pending.eventId)
    this.faultKeys.delete(pending.eventId)
    this.options.onPendingChange?.()
  }

  private async attempt(pending: PendingEvent, attempt: number): Promise<AttemptResult> {
    const deliveryId = `dlv_${randomUUID().replaceAll('-', '')}`
    const url = this.options.webhookUrl()
    const failing = pending.tradeId !== null && this.failingTrades.has(pending.tradeId)
    if (!url || this.receiverDown || failing) {
      const reason = !url ? 'no_webhook_url' : this.receiverDown ? 'receiver_down' : 'trade_failing'
      this.record(pending, deliveryId, attempt, 'failed', undefined, reason)
      return 'failed'
    }
    const headers = {
      'content-type': 'application/json',
      'x-partner-signature': `sha256=${createHmac('sha256', this.options.webhookSecret()).update(pending.body).digest('hex')}`,
      'x-partner-delivery-id': deliveryId,
    }
    const post = () =>
      this.options.fetch(url, {
        method: 'POST',
        headers,
        body: pending.body,
        signal: AbortSignal.timeout(this.options.attemptTimeoutMs),
        // a redirect is the receiver's answer, a failed attempt: the signed delivery is never sent to another address
        redirect: 'manual',
      })
    let response: Response
    try {
      response = await post()
    } catch (error) {
      const reason = noAnswerReason(error)
      const result: AttemptResult = reason === 'timeout' ? 'timeout' : 'failed'
      this.record(pending, deliveryId, attempt, result, undefined, reason)
      this.warnNoAnswer(pending, attempt, reason)
      return result
    }
    // Only the status counts: a 2xx within the timeout is delivered, whatever becomes of its body. The body is read
    // (up to the bound, within the same timeout) and then dropped; one that does not end in time used to turn a 2xx
    // into a timeout, and the event was sent again
    const result: AttemptResult = response.ok ? 'delivered' : 'failed'
    this.record(pending, deliveryId, attempt, result, response.status)
    if (result === 'delivered') this.lastWarned = undefined
    await readAnswer(response, MAX_ANSWER_BYTES).catch(() => undefined)
    // (an event resumed from an earlier run has no key: it is sent without faults)
    const key = this.faultKeys.get(pending.eventId)
    if (result === 'delivered' && key !== undefined && this.draw(key, `duplicate ${attempt}`) < this.faults.duplicateRate) {
      // a network-level duplicate: the same delivery id arrives twice
      const again = await post().catch(() => undefined)
      if (again) await readAnswer(again, MAX_ANSWER_BYTES).catch(() => undefined)
      this.record(pending, deliveryId, attempt, 'duplicate', again?.status)
    }
    return result
  }

  // An attempt with no answer is said once per reason, until one is delivered (the delivery log has every attempt):
  // a receiver not started, a wrong port, a URL fetch refuses used to show nowhere but in that log, without a reason
  private warnNoAnswer(pending: PendingEvent, attempt: number, reason: string): void {
    if (this.lastWarned === reason) return
    this.lastWarned = reason
    this.options.logger.warn(
      { eventId: pending.eventId, event: pending.event, attempt, reason },
      'sandbox webhook attempt got no answer (the delivery log has every attempt; this is said again for another reason, or after one is delivered)',
    )
  }

  private record(
    pending: PendingEvent,
    deliveryId: string | null,
    attempt: number,
    result: AttemptResult,
    httpStatus?: number,
    reason?: string,
  ): void {
    this.log.push({
      eventId: pending.eventId,
      deliveryId,
      attempt,
      event: pending.event,
      tradeId: pending.tradeId,
      status: pending.status,
      result,
      ...(httpStatus === undefined ? {} : { httpStatus }),
      ...(reason === undefined ? {} : { reason }),
      at: new Date(this.options.clock.now()).toISOString(),
    })
    const limit = this.options.logLimit ?? 100_000
    if (this.log.length > limit) this.log.splice(0, this.log.length - limit)
  }
}

/** Why a fetch got no answer, in a word; never its message, which may quote the URL and its password. */
function noAnswerReason(error: unknown): string {
  const { name, message } = error as Error
  if (name === 'TimeoutError') return 'timeout'
  const code = ((error as { cause?: { code?: unknown } }).cause ?? {}).code
  if (typeof code === 'string' && /^[A-Z][A-Z0-9_]{1,63}$/.test(code)) return code
  // undici: "Request cannot be constructed from a URL that includes credentials"
  if (name === 'TypeError' && /credentials/.test(String(message))) return 'url_has_credentials'
  return 'network_error'
}
