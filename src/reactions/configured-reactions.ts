// The reaction handlers the service runs, from its config: the built-in forwarder when FORWARD_URL is
// set, then the fork's own (partner-handlers.ts). `serve` runs them; a CLI command that moves an order
// needs the same names, so the jobs it enqueues are the ones the service's dispatcher will run.
import type { Clock } from '../clock.js'
import type { Config } from '../config.js'
import { createForwarder } from './forwarder.js'
import { registerPartnerHandlers } from './partner-handlers.js'
import { createReactionRegistry, type ReactionRegistry } from './reaction-registry.js'

/** The forwarder's handler name: stored with its jobs, so it never changes. */
export const FORWARDER_HANDLER = 'forwarder'

export function configuredReactions(config: Config, { clock }: { clock?: Clock } = {}): ReactionRegistry {
  const reactions = createReactionRegistry()
  if (config.forward) {
    const { url, secret, timeoutMs } = config.forward
    reactions.on('trade.*', FORWARDER_HANDLER, createForwarder({ url, secret, timeoutMs, ...(clock ? { clock } : {}) }))
  }
  registerPartnerHandlers(reactions)
  return reactions
}
