// YOUR reaction handlers: the one file a fork edits to run its own code on order transitions.
//
// Each handler is called at least once per (event, handler) — again after a crash, a timeout, a throw or a
// stop it did not return from — so make its side effect idempotent on `event.eventId` (see README, "Reactions").
// Pass `signal` on to what it waits for: at a stop a call that ignores it is not waited for, and its event
// runs again, perhaps while the old call is still ending. Events of one
// order reach one handler in sequence order; a handler that keeps failing holds back that order's later
// events for that handler until an operator retries or skips the job (`reactions retry|skip`).
// A trade whose webhooks were missed can jump (created → released): there is then no `trade.funded`
// event; subscribe to 'trade.*' and use hasReached() when a side effect needs "at least funded".
import type { ReactionRegistry } from './reaction-registry.js'

export function registerPartnerHandlers(reactions: ReactionRegistry): void {
  // An example (uncomment, and write shipGoods so that a second call with the same key does nothing):
  //
  // reactions.on('trade.funded', 'ship-goods', async (event, { signal }) => {
  //   await shipGoods({ orderReference: event.externalReference, idempotencyKey: event.eventId, signal })
  // })
  void reactions
}
