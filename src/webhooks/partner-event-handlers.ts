// YOUR handlers for seller and buyer events: the file a fork edits to act on them. Each runs after the
// delivery is stored and its answer becomes the stored outcome; a handler that throws is logged and
// answered 500 `event_handler_failed`, and the delivery stays stored as `ignored`. The platform's retry (a
// fresh delivery id) runs it again; after its last, `deliveries reapply ID` (or the console's Re-apply) runs
// it again on the stored body. So make a handler's side effect safe to run twice.
import type { EventHandlers } from './event-handlers.js'

export function registerEventHandlers(events: EventHandlers): void {
  // An example (uncomment, and write markSellerApproved):
  //
  // events.on('seller.approved', async ({ db, body }) => {
  //   await markSellerApproved(db, body)
  //   return 'applied'
  // })
  void events
}
