// Handlers for the events the platform sends besides trade status changes (trade events go through the
// status model, and a fork reacts to them in src/reactions). The spec shows no payload for
// seller.{status} and buyer.{status}, so without a handler they are stored (outcome `ignored`, raw body
// kept) and nothing else happens. A registry is an instance the composition root builds (service.ts)
// and gives to the app, so two apps in one process (tests, the demo) never share handlers; a fork
// registers its handlers in partner-event-handlers.ts.
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'
import type { Logger } from '../logger.js'
import { registerEventHandlers } from './partner-event-handlers.js'

export interface EventContext {
  db: Kysely<Database>
  logger: Logger
  deliveryId: string
  eventType: string
  body: Record<string, unknown>
}

/** Runs after the delivery is stored; 'applied' becomes the delivery's stored outcome. */
export type EventHandler = (context: EventContext) => Promise<'applied' | 'ignored'>

/** The event families a handler may be registered for. */
export type EventFamily = 'seller' | 'buyer'

/**
 * What `on` accepts, as Octokit's webhooks do: a family ('seller': every seller.* event) or one event
 * type ('seller.approved').
 */
export type EventName = EventFamily | `${EventFamily}.${string}`

export interface EventHandlers {
  on(event: EventName, handler: EventHandler): void
  /** The handlers an event type runs, in registration order (none for trade events). */
  handlersFor(eventType: string): readonly EventHandler[]
}

/**
 * Runs an event's handlers in registration order: 'applied' when any of them says so. What a handler throws is
 * thrown on, the handlers after it not run (the ingest answers it 500, `deliveries reapply` fails with it).
 */
export async function runHandlers(handlers: readonly EventHandler[], context: EventContext): Promise<'applied' | 'ignored'> {
  let outcome: 'applied' | 'ignored' = 'ignored'
  for (const handler of handlers) {
    if ((await handler(context)) === 'applied') outcome = 'applied'
  }
  return outcome
}

const FAMILIES: ReadonlySet<string> = new Set<EventFamily>(['seller', 'buyer'])

export function createEventHandlers(): EventHandlers {
  const registered: { event: EventName; handler: EventHandler }[] = []
  return {
    on(event, handler) {
      // the type says as much; this catches a plain-JavaScript caller or a cast
      if (!FAMILIES.has(event.split('.', 1)[0]!)) throw new TypeError(`Not an event family: ${event}`)
      registered.push({ event, handler })
    },
    handlersFor(eventType) {
      const family = eventType.split('.', 1)[0]!
      if (!FAMILIES.has(family)) return []
      return registered.filter(({ event }) => event === family || event === eventType).map(({ handler }) => handler)
    },
  }
}

/** The fork's handlers (partner-event-handlers.ts), in a registry of their own: what `serve` and a command run. */
export function configuredEventHandlers(): EventHandlers {
  const events = createEventHandlers()
  registerEventHandlers(events)
  return events
}
