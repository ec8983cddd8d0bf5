// Where a fork handles the events the platform sends besides trade status changes. The spec shows no
// payload for seller.{status} and buyer.{status}, so by default they are stored (outcome `ignored`,
// raw body kept) and nothing else happens. Fill in a handler to act on them: it runs after the
// delivery is stored; it receives the parsed body and the database, and may return 'applied'.
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'

export interface EventContext {
  db: Kysely<Database>
  logger: Logger
  deliveryId: string
  eventType: string
  body: Record<string, unknown>
}

export type EventHandler = (context: EventContext) => Promise<'applied' | 'ignored'>

/** Event kind prefix (the part before the first dot) → handler. */
export const eventHandlers: Record<string, EventHandler | undefined> = {
  seller: undefined,
  buyer: undefined,
}

export function handlerFor(eventType: string): EventHandler | undefined {
  const kind = eventType.split('.', 1)[0] ?? ''
  return Object.hasOwn(eventHandlers, kind) ? eventHandlers[kind] : undefined
}
