// The built-in RabbitMQ publisher: a reaction handler that publishes each event to a durable topic
// exchange of the partner's broker (AMQP_URL, AMQP_EXCHANGE), for order and ledger systems that read a
// queue rather than take HTTP calls.
//
// - routing key: the event's type, `trade.<status>`, so a queue binds `trade.#` for every event (a topic's `*` is one
//   word, and a status of the platform's may have a dot in it: `trade.*` would miss it) or `trade.funded` (then
//   AMQP_EVENTS=trade.funded, see configured-reactions.ts: any other type would come back unroutable);
// - message_id: the event id, the same on every retry: a consumer deduplicates by it;
// - body: the forwarder's Standard Webhooks-shaped JSON (forwardedPayload), persistent (delivery mode 2).
// The channel is a confirm channel: the handler resolves only once the broker confirmed the message, so
// the job is done only when the broker holds it. A nack, no connection, a lost connection or no confirm
// within the timeout throws an AmqpPublishError, and the dispatcher retries the job with backoff; the
// dispatcher also keeps one order's events in sequence, since it runs the next only after this one.
//
// Unroutable: RabbitMQ confirms a message that no queue is bound for, and drops it. So every message is
// published `mandatory`: the broker then returns it (basic.return) before its confirm, and the call
// throws amqp_unroutable, retried like any failure until the partner binds a queue (or the job fails).
// A return carries no delivery tag, and two calls for one event (same message_id) can be in flight on the
// one channel, so each publish carries its own `publish_id` header, which the return echoes: that, not
// the message_id, says which call's message came back.
//
// One connection and one channel, opened on first use and opened again on the next call after either
// closed: a broker that goes away fails the calls in flight and never the process (every connection and
// channel has its 'error' and 'close' listeners). No error or log line holds the URL's credentials.
import { randomUUID } from 'node:crypto'
import type { ChannelModel, ConfirmChannel, Message } from 'amqplib'
import { anySignal } from 'any-signal'
import { closeWithin } from '../close-within.js'
import { amqplib } from '../lazy-packages.js'
import type { Logger } from '../logger.js'
import { answeredWithoutTls, OWN_CA_HINT, refusedCertificateCode } from '../tls-certificate.js'
import { forwardedPayload, type ReactionHandler } from './reaction-event.js'

export type AmqpPublishErrorCode =
  | 'amqp_unreachable'
  | 'amqp_refused'
  | 'amqp_nacked'
  | 'amqp_unroutable'
  | 'amqp_timeout'
  | 'amqp_aborted'
  | 'amqp_closed'
  | 'amqp_routing_key_too_long'
  | 'amqp_invalid_options'

export class AmqpPublishError extends Error {
  override name = 'AmqpPublishError'
  /** No attempt can succeed (plan-retry.ts): the job is failed at once. */
  readonly permanent: boolean
  constructor(
    readonly code: AmqpPublishErrorCode,
    message: string,
    options?: ErrorOptions & { permanent?: boolean },
  ) {
    super(message, options)
    this.permanent = options?.permanent ?? false
  }
}

/** The longest routing key AMQP 0-9-1 carries (a short string: a length byte, then the UTF-8 bytes). */
const MAX_ROUTING_KEY_BYTES = 255

export interface AmqpPublisherOptions {
  /** AMQP_URL, amqp:// or amqps:// */
  url: string
  /** AMQP_EXCHANGE: a durable topic exchange, declared on every new channel */
  exchange: string
  logger: Logger
  /** Per call: to open the connection, and from publishing to the broker's confirm. */
  timeoutMs?: number
  /** amqplib's connect, replaceable in tests. */
  connect?: (url: string, socketOptions: object) => Promise<ChannelModel>
}

export interface AmqpPublisher {
  handler: ReactionHandler
  /** Closes the connection; later calls of the handler throw amqp_closed. */
  close(): Promise<void>
}

interface Link {
  connection: ChannelModel
  channel: ConfirmChannel
  /**
   * The publishes on this channel awaiting their confirm, by publish_id: true once the broker returned the
   * message. The return arrives before the confirm on the same channel, so the confirm's callback reads it.
   */
  inFlight: Map<string, boolean>
  /**
   * What the broker closed the channel (or the connection) with, once it did: amqplib fails the unconfirmed
   * publishes with a bare 'channel closed' after emitting this, so their calls take their reason from here.
   */
  closedWith: { error?: Error }
  /**
   * The broker's reason while it blocks this connection (a resource alarm: low on memory or disk). It then
   * reads nothing the connection sends, so a publish waits for a confirm that does not come until it is lifted.
   */
  blocked: { reason?: string }
}

const DEFAULT_TIMEOUT_MS = 10_000
// How long closing a connection waits for the broker's answer before it closes the socket itself.
const CLOSE_MS = 1_000

/** The broker as errors and logs name it: scheme, host, port and vhost, never the user or password. */
export function describeBroker(url: string): string {
  const parsed = new URL(url)
  const vhost = parsed.pathname.length > 1 ? parsed.pathname : ''
  return `${parsed.protocol}//${parsed.host}${vhost}`
}

export function createAmqpPublisher({
  url,
  exchange,
  logger,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  connect = (connectUrl, socketOptions) => amqplib().connect(connectUrl, socketOptions),
}: AmqpPublisherOptions): AmqpPublisher {
  const parsed = new URL(url)
  if (parsed.protocol !== 'amqp:' && parsed.protocol !== 'amqps:') {
    throw new Error('the AMQP URL must be an amqp:// or amqps:// URL')
  }
  if (!(timeoutMs > 0)) throw new Error('the AMQP timeout must be a positive number of milliseconds')
  const broker = describeBroker(url)
  // (the vhost as amqplib opens it: the path without its slash, percent-decoded; '/' when there is none)
  const vhost = parsed.pathname.length > 1 ? decodeVhost(parsed.pathname.slice(1)) : '/'
  const log = logger.child({ component: 'amqp-publisher', broker, exchange })

  // every caller waits on the one link being opened, so an outage costs one connection attempt per
  // round of retries, not one per job in flight
  let link: Promise<Link> | undefined
  let closed = false
  // every connection opened and not closed yet, the one a link is being opened on included: close() ends them
  const connections = new Set<ChannelModel>()
  // politely, and its socket past CLOSE_MS: over a path gone silent the broker's close-ok never comes (until
  // missed heartbeats, a minute or more), and a service's stop waited for it until its bound and exited 1
  const end = (connection: ChannelModel) =>
    closeWithin(
      () => connection.close(),
      () => (connection as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy(),
      CLOSE_MS,
    )

  function forget(opened: Promise<Link>) {
    if (link === opened) link = undefined
  }

  // `lost` forgets this link when its connection or channel closes, so the next call opens a new one
  async function open(lost: () => void): Promise<Link> {
    let connection: ChannelModel
    try {
      connection = await connect(url, {
        // bounds the TCP connect and the AMQP handshake; amqplib clears it once the connection is open
        timeout: timeoutMs,
        clientProperties: { connection_name: 'partner-escrow reactions' },
      })
    } catch (error) {
      throw connectFailure(error)
    }
    const closedWith: { error?: Error } = {}
    const blocked: { reason?: string } = {}
    // a broker that closes the connection (restart, management "close connection", lost socket) emits
    // 'error' and 'close': without these listeners Node would throw the error and stop the process
    connection.on('error', (error: Error) => {
      closedWith.error ??= error
      log.warn({ reason: describeError(error) }, 'AMQP connection error')
    })
    if (closed) {
      await end(connection)
      throw new AmqpPublishError('amqp_closed', 'the AMQP publisher is closed (shutting down)')
    }
    connections.add(connection)
    connection.on('close', () => connections.delete(connection))
    connection.on('close', () => {
      lost()
      if (!closed) log.warn('AMQP connection closed; the next publish opens a new one')
    })
    connection.on('blocked', (reason: string) => {
      blocked.reason = typeof reason === 'string' && reason !== '' ? reason : 'no reason given'
      log.warn({ reason }, 'the broker blocked publishing')
    })
    connection.on('unblocked', () => {
      blocked.reason = undefined
      log.info('the broker unblocked publishing')
    })
    try {
      await ensureExchange(connection)
      const channel = await connection.createConfirmChannel()
      channel.on('error', (error: Error) => {
        closedWith.error = error
        log.warn({ reason: describeError(error) }, 'AMQP channel error')
      })
      const inFlight = new Map<string, boolean>()
      channel.on('return', (message: Message) => {
        const publishId = (message.properties.headers as Record<string, unknown> | undefined)?.publish_id
        // an unknown id: its call already gave up (timed out, stopped); its retry publishes anew
        if (typeof publishId === 'string' && inFlight.has(publishId)) inFlight.set(publishId, true)
      })
      channel.on('close', () => {
        lost()
        // a channel closed by the broker (e.g. a refused declaration) leaves the connection open: close it
        // too, so the next call starts from a clean connection
        if (!closed) connection.close().catch(() => {})
      })
      log.info('AMQP connection open, exchange declared')
      return { connection, channel, inFlight, closedWith, blocked }
    } catch (error) {
      await end(connection)
      if (error instanceof AmqpPublishError) throw error
      throw new AmqpPublishError(
        'amqp_unreachable',
        `no channel on the broker ${broker}: ${describeError(error)}`,
        { cause: error },
      )
    }
  }

  // The exchange is declared on a channel of its own, which a refusal closes (the confirm channel is opened
  // after). Declaring it takes the user's configure right on it, even where it exists as asked; a broker's
  // administrator often declares the exchanges and gives each application's user only the right to write to its
  // own. Refused that right (403), the exchange is looked up instead, which takes none, and used as it is.
  async function ensureExchange(connection: ChannelModel): Promise<void> {
    const refused = (error: unknown) =>
      new AmqpPublishError('amqp_refused', `the broker ${broker} refused the topic exchange "${exchange}": ${describeError(error)}`, { cause: error })
    const declaring = await connection.createChannel()
    declaring.on('error', () => {})
    try {
      await declaring.assertExchange(exchange, 'topic', { durable: true })
      await declaring.close()
      return
    } catch (error) {
      if (amqpReplyCode(error) !== ACCESS_REFUSED) throw refused(error)
    }
    const looking = await connection.createChannel()
    looking.on('error', () => {})
    try {
      await looking.checkExchange(exchange)
      await looking.close()
    } catch (error) {
      if (amqpReplyCode(error) !== NOT_FOUND) throw refused(error)
      throw new AmqpPublishError(
        'amqp_refused',
        `on the broker ${broker} the topic exchange "${exchange}" does not exist and this user may not declare it ` +
          '(it has no configure right on it): declare it once with a user that may, or give this one that right',
        { cause: error },
      )
    }
  }

  // The broker refusing the connection is not an outage: a wrong user or password, or a vhost that does not
  // exist or this user may not use. amqplib reports the first with the broker's reply, and the second only as
  // an unexpected frame: both were `amqp_unreachable`, the second as "Expected ConnectionOpenOk; got
  // <ConnectionClose channel:0>".
  function connectFailure(error: unknown): AmqpPublishError {
    const message = error instanceof Error ? error.message : ''
    const refusedHandshake = /^Handshake terminated by server: (\d+)/.exec(message)
    if (refusedHandshake) {
      const hint = refusedHandshake[1] === String(ACCESS_REFUSED) ? ' (check the user and password of AMQP_URL)' : ''
      return new AmqpPublishError('amqp_refused', `the broker ${broker} refused the connection${hint}: ${describeError(error)}`, { cause: error })
    }
    if (/^Expected ConnectionOpenOk; got <ConnectionClose\b/.test(message)) {
      return new AmqpPublishError(
        'amqp_refused',
        `the broker ${broker} refused to open the vhost "${vhost}": it does not exist, or this user has no permission on it`,
        { cause: error },
      )
    }
    // amqplib refusing its own arguments (a TypeError: "Field 'heartbeat' is the wrong type" for AMQP_URL's
    // ?heartbeat=abc, a maxFrameSize below 4096) is no outage: the broker may be up, and no retry of this process
    // can succeed. config.ts refuses the URL's options at start; this names what a fork's options still get wrong
    if (error instanceof TypeError) {
      return new AmqpPublishError(
        'amqp_invalid_options',
        `amqplib refused the connection options for ${broker} (AMQP_URL's query options, or a fork's socket options): ${describeError(error)}`,
        { cause: error },
      )
    }
    const certificate = refusedCertificateCode(error)
    if (certificate !== undefined) {
      const message = `the broker ${broker} is unreachable: its TLS certificate was not accepted (${certificate}); ${OWN_CA_HINT}`
      return new AmqpPublishError('amqp_unreachable', message, { cause: error })
    }
    if (answeredWithoutTls(error)) {
      const message = `the broker ${broker} answered without TLS: its port takes plain AMQP; give AMQP_URL amqp://, or amqps:// with the broker's TLS port (5671 by default)`
      return new AmqpPublishError('amqp_unreachable', message, { cause: error })
    }
    return new AmqpPublishError('amqp_unreachable', `the broker ${broker} is unreachable: ${describeError(error)}`, { cause: error })
  }

  // A channel the broker closed before confirming: refused when it said so with a reply code (no write right on
  // the exchange: 403 ACCESS_REFUSED), with its reason; the job said only "failed: channel closed", as for a lost
  // connection, and the reason was in a log line of its own
  function channelClosed(error: Error, closedWith: Error | undefined): AmqpPublishError {
    const code = amqpReplyCode(closedWith)
    if (closedWith && code !== undefined && REFUSALS.has(code)) {
      return new AmqpPublishError('amqp_refused', `the broker ${broker} refused the message: ${describeError(closedWith)}`, { cause: closedWith })
    }
    const reason = closedWith ? ` (${describeError(closedWith)})` : ''
    return new AmqpPublishError('amqp_unreachable', `publishing to ${broker} failed: channel closed${reason}`, { cause: closedWith ?? error })
  }

  function currentLink(): Promise<Link> {
    if (link) return link
    const opening: Promise<Link> = open(() => forget(opening))
    link = opening
    // a failed attempt is forgotten at once: the next call (the dispatcher's retry) tries again
    opening.catch(() => forget(opening))
    return opening
  }

  const handler: ReactionHandler = async function publish(event, { signal, logger: jobLogger }) {
    if (closed) throw new AmqpPublishError('amqp_closed', 'the AMQP publisher is closed (shutting down)')
    const startedAt = Date.now()
    const deadline = AbortSignal.timeout(timeoutMs)
    const stop = anySignal([signal, deadline])
    // (the handler's logger names the job, its event id and attempt: said again here, each key came twice in the
    // line; and a failure was logged as "reaction published")
    const done = (fields: Record<string, unknown>) =>
      jobLogger.debug(
        { type: event.type, broker, durationMs: Date.now() - startedAt, ...fields },
        fields.error === undefined ? 'reaction published' : 'reaction publish failed',
      )
    // the link this call published on, once open: its blocked reason explains a confirm that did not come
    let opened: Link | undefined
    const whileBlocked = () => (opened?.blocked.reason === undefined ? '' : ` (the broker blocked this connection: ${opened.blocked.reason})`)
    const failure = (error: unknown): AmqpPublishError => {
      if (error instanceof AmqpPublishError) {
        const suffix = error.code === 'amqp_unreachable' ? whileBlocked() : ''
        return suffix ? new AmqpPublishError(error.code, `${error.message}${suffix}`, { cause: error.cause }) : error
      }
      if (signal.aborted) {
        return new AmqpPublishError('amqp_aborted', `publishing to ${broker} was stopped (lease ended or shutting down)`, {
          cause: signal.reason,
        })
      }
      if (deadline.aborted) {
        return new AmqpPublishError('amqp_timeout', `the broker ${broker} did not confirm within ${timeoutMs} ms${whileBlocked()}`)
      }
      return new AmqpPublishError('amqp_unreachable', `publishing to ${broker} failed: ${describeError(error)}`, {
        cause: error,
      })
    }

    // a status of the platform's up to 200 characters makes a key of up to 806 bytes: amqplib refused one past 255
    // as a wrong type, which read as an outage and was retried 10 times, its order's later events waiting behind it
    if (Buffer.byteLength(event.type) > MAX_ROUTING_KEY_BYTES) {
      done({ error: 'amqp_routing_key_too_long' })
      throw new AmqpPublishError(
        'amqp_routing_key_too_long',
        `the routing key of event type ${JSON.stringify(event.type.slice(0, 40))}… is ${Buffer.byteLength(event.type)} bytes, ` +
          `past AMQP's ${MAX_ROUTING_KEY_BYTES}: it cannot be published`,
        { permanent: true },
      )
    }
    const using = currentLink()
    const publishId = randomUUID()
    let inFlight: Map<string, boolean> | undefined
    try {
      opened = await untilStopped(using, stop)
      const { channel, inFlight: publishes, closedWith } = opened
      inFlight = publishes
      const body = Buffer.from(JSON.stringify(forwardedPayload(event)))
      publishes.set(publishId, false)
      await untilStopped(
        new Promise<void>((resolve, reject) => {
          // publish throws at once when the channel is already closed; the callback gets the broker's
          // ack (no error), its nack, or 'channel closed' when the channel went away unconfirmed
          channel.publish(
            exchange,
            event.type,
            body,
            {
              // returned, not dropped, when no queue is bound for the routing key
              mandatory: true,
              persistent: true,
              messageId: event.eventId,
              contentType: 'application/json',
              contentEncoding: 'utf-8',
              type: event.type,
              // AMQP timestamps are whole seconds
              timestamp: Math.floor(event.occurredAt.getTime() / 1000),
              appId: 'partner-escrow',
              headers: { order_id: event.orderId, sequence: event.sequence, publish_id: publishId },
            },
            (error: unknown) => {
              const returned = publishes.get(publishId) === true
              publishes.delete(publishId)
              if ((error === null || error === undefined) && !returned) resolve()
              else if (error === null || error === undefined) {
                // confirmed, but only as "routed to no queue": the message is gone, the job is not done
                reject(
                  new AmqpPublishError(
                    'amqp_unroutable',
                    `no queue is bound to exchange "${exchange}" for routing key ${event.type} on ${broker}: the broker returned the message`,
                  ),
                )
              } else if (error instanceof Error && error.message === 'channel closed') reject(channelClosed(error, closedWith.error))
              else reject(new AmqpPublishError('amqp_nacked', `the broker ${broker} refused (nacked) the message`))
            },
          )
        }),
        stop,
      )
      done({ confirmed: true })
    } catch (error) {
      const thrown = failure(error)
      done({ error: thrown.code })
      // no confirm in time: a connection that went silent (no RST) only closes after missed heartbeats;
      // drop it, so the retry opens a fresh one (calls in flight on it fail and are retried too)
      if (thrown.code === 'amqp_timeout' && link === using) {
        forget(using)
        using.then(({ connection }) => end(connection)).catch(() => {})
      }
      throw thrown
    } finally {
      // a call that gave up before its confirm: a late return for it is ignored
      inFlight?.delete(publishId)
      stop.clear()
    }
  }

  async function close() {
    closed = true
    link = undefined
    // (one still connecting is ended as soon as it opens)
    await Promise.all([...connections].map(end))
  }

  // it times its calls out itself (amqp_timeout): the dispatcher sets no deadline of its own at the same time
  return { handler: Object.assign(handler, { ownTimeoutMs: timeoutMs }), close }
}

// resolves or rejects with `work`, or rejects when `stop` aborts first; `work` still settles on its own
function untilStopped<T>(work: Promise<T>, stop: AbortSignal): Promise<T> {
  if (stop.aborted) {
    work.catch(() => {})
    return Promise.reject(stop.reason)
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(stop.reason)
    stop.addEventListener('abort', onAbort, { once: true })
    work.then(
      (value) => {
        stop.removeEventListener('abort', onAbort)
        resolve(value)
      },
      (error: unknown) => {
        stop.removeEventListener('abort', onAbort)
        reject(error)
      },
    )
  })
}

// amqplib's errors name the socket's code (ECONNREFUSED ...) or the broker's reply text; neither holds
// the URL or its credentials
// AMQP reply codes a refused declaration closes its channel with
const ACCESS_REFUSED = 403
const NOT_FOUND = 404
// reply codes of a broker that refuses what was asked, not one that went away (320 CONNECTION_FORCED: shut down,
// or closed by an operator): access refused, not found, resource locked, precondition failed, not allowed
const REFUSALS = new Set([ACCESS_REFUSED, NOT_FOUND, 405, 406, 530])

function decodeVhost(encoded: string): string {
  try {
    return decodeURIComponent(encoded)
  } catch {
    return encoded
  }
}

function amqpReplyCode(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code
  return typeof code === 'number' ? code : undefined
}

function describeError(error: unknown): string {
  const code = (error as { code?: unknown } | undefined)?.code
  const message = error instanceof Error ? error.message : String(error)
  return typeof code === 'string' && !message.includes(code) ? `${code} ${message}` : message
}
