// Ending a connection without waiting on a peer that no longer answers.
import { setTimeout as delay } from 'node:timers/promises'

/**
 * Runs a polite `close` (one that waits for the peer to see the session out), and `force` (the socket closed
 * at once) if it has not ended within `ms`: over a path that went silent (no FIN, no RST) the peer's answer
 * never comes, and a service's stop waited for it until its bound and exited 1.
 */
export async function closeWithin(close: () => Promise<unknown>, force: () => void, ms: number): Promise<void> {
  const timer = new AbortController()
  const ended = close().then(
    () => true,
    () => true,
  )
  const done = await Promise.race([ended, delay(ms, false, { signal: timer.signal }).catch(() => true)])
  timer.abort()
  if (!done) force()
}
