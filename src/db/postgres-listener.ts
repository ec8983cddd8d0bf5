// A replica's one LISTEN connection on Postgres (DatabaseHandle.listen): outside the pool, reconnecting with
// backoff, and probing on each (re)connect whether what is sent through the pool reaches it (behind a
// connection pooler in transaction mode nothing does: DATABASE_LISTEN_URL).
import { randomUUID } from 'node:crypto'
import { setTimeout as delay } from 'node:timers/promises'
import type pg from 'pg'
import { pgDriver } from '../lazy-packages.js'
import type { Logger } from '../logger.js'
import { describeDatabaseErrorOf } from './database-errors.js'
import { closeSocket, endWithin } from './end-within.js'
import { SESSION_SETTINGS } from './session-defaults.js'

/** How long a listener waits for its probe, the NOTIFY it sends itself through the pool on each (re)connect. */
export const LISTENER_PROBE_MS = 10_000
/** How often a listener that hears its probes sends itself another, to find a connection gone silent. */
export const LISTENER_CHECK_MS = 30_000
// a probe's payload: no wake-up, for this listener or another replica's
const PROBE_PREFIX = 'listener-probe:'

// what every listener connection calls itself in pg_stat_activity, so other processes can count them
export const listenerName = (channel: string) => `partner-escrow listen ${channel}`.slice(0, 63)

// LISTEN needs a session of its own for as long as it listens: a pooled client would be handed to other
// queries. The loop connects, listens and waits for the connection's end; every failure (Postgres down,
// the connection cut) is logged and retried with a doubling delay capped at 30 s, so a listener never
// ends the process. After each (re)connect onNotify runs once: what was committed while no connection
// listened is found by looking. Then the listener sends itself a probe through the pool (sendProbe) and
// reports whether it came within LISTENER_PROBE_MS (onProbe); a probe's payload is never a wake-up.
export function listenOnPostgres({
  url,
  setting,
  channel,
  onNotify,
  logger,
  ownListeners,
  sendProbe,
  onProbe,
  checkMs = LISTENER_CHECK_MS,
}: {
  url: string
  /** The setting `url` came from (DATABASE_URL or DATABASE_LISTEN_URL): what a refused login's warning names. */
  setting: string
  channel: string
  onNotify: (payload?: string) => void
  logger: Logger | undefined
  ownListeners: Set<number>
  /** Sends a NOTIFY with this payload on the channel the way the replicas send theirs (through the pool). */
  sendProbe: (payload: string) => Promise<void>
  /** Whether the first probe on a connection came back within LISTENER_PROBE_MS. */
  onProbe: (heard: boolean) => void
  /** How often a connection that heard its first probe is probed again. Default LISTENER_CHECK_MS. */
  checkMs?: number
}): (withinMs?: number) => Promise<void> {
  const stopping = new AbortController()
  // pg never settles the connect() of a client ended while it connects (it takes the end for the caller's own):
  // a stop that came then waited for the listener for good, and the service exited 1 at its bound
  const stopped = new Promise<void>((resolve) => stopping.signal.addEventListener('abort', () => resolve(), { once: true }))
  let client: pg.Client | undefined
  const run = async () => {
    let failures = 0
    while (!stopping.signal.aborted) {
      const connection = new (pgDriver().Client)({
        connectionString: url,
        keepAlive: true,
        connectionTimeoutMillis: 5_000,
        application_name: listenerName(channel),
      })
      client = connection
      const ended = new Promise<void>((resolve) => {
        connection.on('end', resolve)
        connection.on('error', (error) => {
          if (!stopping.signal.aborted) logger?.warn({ err: describeDatabaseErrorOf(error, setting) }, 'notification listener connection lost')
          resolve()
        })
      })
      // a probe's payload is no wake-up, this listener's or another replica's
      let probe: { payload: string; heard: () => void } | undefined
      connection.on('notification', (message) => {
        if (message.channel !== channel) return
        if (message.payload?.startsWith(PROBE_PREFIX)) {
          if (message.payload === probe?.payload) probe.heard()
          return
        }
        onNotify(message.payload)
      })
      try {
        await Promise.race([connection.connect(), stopped])
        if (stopping.signal.aborted) {
          // no session to see out: the stop's polite end need not wait for the server
          closeSocket(connection)
          throw new Error('the listener stopped while it connected')
        }
        const pid = (connection as unknown as { processID: number | null }).processID
        if (pid !== null) ownListeners.add(pid)
        // it idles between notifications: no idle_session_timeout of the database's ends it (session-defaults.ts)
        await connection.query(SESSION_SETTINGS)
        await connection.query(`LISTEN ${connection.escapeIdentifier(channel)}`)
        failures = 0
        onNotify()
        // true: heard; false: sent and not heard within LISTENER_PROBE_MS; undefined: not sent (the database
        // away), the connection ended or the listener stopped, which tells nothing
        const probeOnce = async (): Promise<boolean | undefined> => {
          const payload = `${PROBE_PREFIX}${randomUUID()}`
          const heard = new Promise<boolean>((resolve) => (probe = { payload, heard: () => resolve(true) }))
          return Promise.race([
            heard,
            sendProbe(payload).then(
              () => delay(LISTENER_PROBE_MS, false, { signal: stopping.signal, ref: false }),
              () => undefined,
            ),
            ended.then(() => undefined),
          ]).catch(() => undefined)
        }
        void (async () => {
          const first = await probeOnce()
          if (first === undefined || stopping.signal.aborted) return
          onProbe(first)
          // A connection that heard its first probe is probed again every checkMs: one whose path died without a
          // word (no FIN, no RST) looks connected and hears nothing, and other replicas' commits woke this one only
          // at its next look, until the operating system gave up on the connection, hours later. One that never
          // heard its first (a pooler in transaction mode) is not probed again: onProbe's warning says so once. A
          // probe that could not be sent tells nothing; the next is sent all the same.
          if (!first) return
          for (;;) {
            const next = await Promise.race([
              delay(checkMs, true, { signal: stopping.signal, ref: false }).catch(() => false),
              ended.then(() => false),
            ])
            if (!next) return
            if ((await probeOnce()) === false) break
          }
          if (!stopping.signal.aborted) {
            logger?.warn({ probeMs: LISTENER_PROBE_MS }, 'notification listener did not hear its own probe: its connection went silent; connecting again')
            closeSocket(connection)
          }
        })()
        await ended
      } catch (error) {
        if (!stopping.signal.aborted) logger?.warn({ err: describeDatabaseErrorOf(error, setting) }, 'notification listener cannot connect')
      }
      const pid = (connection as unknown as { processID: number | null }).processID
      if (pid !== null) ownListeners.delete(pid)
      connection.end().catch(() => {})
      if (stopping.signal.aborted) break
      failures += 1
      await delay(Math.min(30_000, 250 * 2 ** Math.min(failures, 7)), undefined, { signal: stopping.signal }).catch(() => {})
    }
  }
  const running = run()
  // `withinMs`: what the stop has left of its share of the shutdown bound (the reaction dispatcher's grace). A fixed
  // second here took a stop on a silent database past that share, and a service whose SHUTDOWN_TIMEOUT_MS left it
  // less than that second exited 1 at its bound, cut short, where nothing was left to wait for
  return async (withinMs = LISTENER_END_MS) => {
    stopping.abort()
    if (client) await endWithin(client, Math.max(0, Math.min(LISTENER_END_MS, withinMs)))
    await running
  }
}

// How long a stop waits at most for the server to see the listener's session out before it closes the socket itself.
const LISTENER_END_MS = 1_000
