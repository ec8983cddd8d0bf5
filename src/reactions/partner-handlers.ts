// YOUR reaction handlers: the one file a fork edits to run its own code on order transitions.
//
// Each handler is called at least once per (event, handler) — again after a crash, a timeout, a throw or a
// stop it did not return from — so make its side effect idempotent on `event.eventId` (see README, "Reactions").
// Pass `signal` on to what it waits for: it is aborted at the handler's `timeoutMs` (the attempt then fails and is
// retried), shortly before its lease ends, and at a stop, where a call that ignores it is not waited for and its
// event runs again, perhaps while the old call is still ending. Events of one
// order reach one handler in sequence order; a handler that keeps failing holds back that order's later events
// for that handler until an operator retries or skips the job (`reactions retry|skip`); throw an error with
// `permanent: true` to fail the job at once, or `retryAfterMs` to ask for a wait.
// A trade whose webhooks were missed can jump (created → released): there is then no `trade.funded`
// event; subscribe to 'trade.*' and use hasReached() when a side effect needs "at least funded".
// The names `forwarder` and `amqp` are the built-in handlers'. The project's own tests leave these handlers out;
// yours go in test/partner-handlers.test.ts (README, "Reactions", "Testing your handlers").
import type { Clock } from '../clock.js'
import type { Config } from '../config.js'
import type { Logger } from '../logger.js'
import type { ReactionRegistry } from './reaction-registry.js'

/**
 * What the handlers are set up with: the service's config (a setting of your own is added to src/config.ts, the one
 * file that reads the environment), its logger and its clock. A handler that calls the platform builds its client
 * once, here: `createPartnerApiClient(config, { logger, clock })` (src/partner-api/create-partner-api-client.ts).
 */
export interface PartnerHandlerSetup {
  config: Config
  logger: Logger
  clock: Clock
}

export function registerPartnerHandlers(reactions: ReactionRegistry, setup: PartnerHandlerSetup): void {
  // An example (uncomment, and write shipGoods so that a second call with the same key does nothing):
  //
  // reactions.on('trade.funded', 'ship-goods', async (event, { signal }) => {
  //   await shipGoods({ orderReference: event.externalReference, idempotencyKey: event.eventId, signal })
  // }, { timeoutMs: 30_000 })
  void reactions
  void setup
}
