// Ending a connection without waiting on a server that no longer answers.
import type pg from 'pg'
import { closeWithin } from '../close-within.js'

/**
 * Ends `client` politely, and closes its socket if the server has not seen the session out within `ms`. A polite
 * end waits for the server to close the connection: over a path that went silent (no FIN, no RST) that never
 * comes, and a service stop waited for it until its bound and exited 1.
 */
export async function endWithin(client: pg.Client, ms: number): Promise<void> {
  await closeWithin(() => client.end(), () => closeSocket(client), ms)
}

/** Closes the client's socket at once: no Terminate sent, nothing waited for (pg keeps its socket private). */
export function closeSocket(client: pg.Client | pg.PoolClient): void {
  const { connection } = client as unknown as { connection?: { stream?: { destroy(): void } } }
  connection?.stream?.destroy()
}
