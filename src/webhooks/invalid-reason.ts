// Why a delivery stored as `invalid` was: read again from its stored body by the checks that refused it
// (parse-delivery.ts), as the reason itself is not stored. Pure.
import { classifyDelivery, parseBody, PayloadError } from './parse-delivery.js'

/**
 * The reason a stored `invalid` delivery was refused, from its raw body as stored: the problem classifyDelivery
 * finds in it, or, for a body this build's checks take, that the database refused one of its values when it was
 * received (receive-webhook.ts stores such a delivery as invalid too). Its words may quote the body (a duplicate
 * key, the event's kind): text from outside, for the caller to escape where it shows it.
 */
export function invalidReason(rawBody: string): string {
  let event: ReturnType<typeof classifyDelivery>
  try {
    event = classifyDelivery(parseBody(Buffer.from(rawBody)))
  } catch (error) {
    // not stored so by this build (such a body is refused 400): its words, for a row written some other way
    if (error instanceof PayloadError) return error.message
    throw error
  }
  if (event.kind === 'invalid') return event.problem
  return (
    'the database refused one of its values when it was received (a value it cannot store, such as a NUL or a lone ' +
    'surrogate in its event); this build’s checks take the body as it is'
  )
}
