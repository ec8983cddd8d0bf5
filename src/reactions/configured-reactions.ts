// The reaction handlers the service runs, from its config: the built-in forwarder when FORWARD_URL is
// set (for the types FORWARD_EVENTS names), the RabbitMQ publisher when AMQP_URL is (AMQP_EVENTS), then
// the fork's own (partner-handlers.ts; left out by the project's own tests: `partnerHandlers`), then those of a
// program that starts the service itself (`register`, e.g. the ingest benchmark's no-op). The built-ins' names are
// reserved, whether or not their setting is on: a fork's `forwarder` would take the forwarder's stream and jobs. `serve`
// runs them; a CLI command that moves an order uses the same names to tell whether a handler takes its event (and
// wake the dispatchers); the events themselves reach the handlers through their streams.
import { type Clock, systemClock } from '../clock.js'
import type { Config } from '../config.js'
import type { Logger } from '../logger.js'
import { createAmqpPublisher } from './amqp-publisher.js'
import { createForwarder } from './forwarder.js'
import { registerPartnerHandlers } from './partner-handlers.js'
import { createReactionRegistry, type ReactionPattern, type ReactionRegistry, reservingNames } from './reaction-registry.js'

/** The forwarder's handler name: stored with its jobs, so it never changes. */
export const FORWARDER_HANDLER = 'forwarder'
/** The RabbitMQ publisher's handler name, stored with its jobs as well. */
export const AMQP_HANDLER = 'amqp'

export interface ConfiguredReactions extends ReactionRegistry {
  /**
   * The setting that chooses the types a built-in handler takes (FORWARD_EVENTS, AMQP_EVENTS); undefined for
   * a handler registered in code. Named when a job of a type its handler no longer takes is skipped.
   */
  typesSetting(name: string): string | undefined
  /** Closes what the built-in handlers keep open (the broker connection): once the dispatcher stopped. */
  close(): Promise<void>
}

export function configuredReactions(
  config: Config,
  {
    clock,
    logger,
    register,
    partnerHandlers = true,
  }: {
    clock?: Clock
    logger: Logger
    /** More handlers, registered in code by a program that starts the service itself. */
    register?: ((reactions: ReactionRegistry) => void) | undefined
    /**
     * Whether the fork's handlers (registerPartnerHandlers) are registered: the project's own tests leave them out
     * (test/helpers/test-service.ts), so a fork's handler neither changes what they see nor gets their events.
     */
    partnerHandlers?: boolean | undefined
  },
): ConfiguredReactions {
  const reactions = createReactionRegistry({ leaseMs: config.reactions.leaseS * 1000 })
  const typesSettings = new Map<string, string>()
  const closers: (() => Promise<void>)[] = []
  // (the event lists are checked against the status table by config.ts, as the registry checks a fork's patterns)
  if (config.forward) {
    const { url, secret, timeoutMs, events } = config.forward
    // FORWARD_EVENTS: an event of another type gets no forwarder job at all
    reactions.on(events as readonly ReactionPattern[], FORWARDER_HANDLER, createForwarder({ url, secret, timeoutMs, logger, ...(clock ? { clock } : {}) }), { timeoutMs })
    typesSettings.set(FORWARDER_HANDLER, 'FORWARD_EVENTS')
  }
  if (config.amqp) {
    // it connects on its first event, so a CLI command that only enqueues jobs never opens a connection
    const { events, ...settings } = config.amqp
    const publisher = createAmqpPublisher({ ...settings, logger })
    // AMQP_EVENTS: a partner that binds only some routing keys publishes only those, since any other
    // would be returned unroutable and retried until its job fails
    reactions.on(events as readonly ReactionPattern[], AMQP_HANDLER, publisher.handler, { timeoutMs: settings.timeoutMs })
    typesSettings.set(AMQP_HANDLER, 'AMQP_EVENTS')
    closers.push(publisher.close)
  }
  const forOthers = reservingNames(
    reactions,
    [FORWARDER_HANDLER, AMQP_HANDLER],
    'it is a built-in handler\'s (FORWARD_URL, AMQP_URL), whose stream and jobs it would take, set or not',
  )
  if (partnerHandlers) registerPartnerHandlers(forOthers, { config, logger, clock: clock ?? systemClock })
  register?.(forOthers)
  return Object.assign(reactions, {
    typesSetting: (name: string) => typesSettings.get(name),
    close: async () => {
      await Promise.all(closers.map((close) => close()))
    },
  })
}
