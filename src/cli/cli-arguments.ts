// Argument parsers shared by commands: a bad value is a usage error (exit 2) naming what was wrong.
import { InvalidArgumentError } from 'commander'
import { checkExternalReference } from '../orders/external-reference.js'
import type { PartnerValidationError } from '../partner-api/partner-api-error.js'
import { DELIVERY_ID_RULE, isDeliveryId } from '../webhooks/delivery-id.js'
import { UsageError } from './cli-context.js'

/** Decimal digits alone: Number() also takes 0x10 (16), 0b11, 1e3, +80, 80.0 and surrounding spaces. */
export function decimalDigits(value: string): number {
  return /^[0-9]+$/.test(value) ? Number(value) : Number.NaN
}

/** A whole number, 0 included: a seed, a count, a wait. */
export function wholeNumber(value: string): number {
  const parsed = decimalDigits(value)
  // past 2^53 a number is no longer exact, and 1e300 is no integer the database takes
  // (named whole: "from 0, in decimal digits" read as a contradiction to a number of 20 digits)
  if (!Number.isSafeInteger(parsed)) {
    const why = /^[0-9]+$/.test(value) ? `from 0 to ${Number.MAX_SAFE_INTEGER}` : 'from 0, in decimal digits (0-9)'
    throw new InvalidArgumentError(`must be a whole number ${why}`)
  }
  return parsed
}

/** The most rows one listing prints: it is held whole in memory, in the running service when forwarded there. */
export const MAX_LIST_LIMIT = 10_000

/** A parser of whole numbers from `min` (1 unless given) to `max`: the message names the range. */
export function wholeNumberUpTo(max: number, min = 1): (value: string) => number {
  return (value) => {
    const parsed = decimalDigits(value)
    if (!Number.isInteger(parsed) || parsed < min || parsed > max) {
      throw new InvalidArgumentError(`must be a whole number from ${min} to ${max}`)
    }
    return parsed
  }
}

export const listLimit = wholeNumberUpTo(MAX_LIST_LIMIT)

/** A port to listen on, 0 (a free one) to 65535: Node's own refusal of another came only when it listened. */
export function portNumber(value: string): number {
  const port = decimalDigits(value)
  if (!(port <= 65_535)) throw new InvalidArgumentError('must be a port from 0 to 65535 (0: a free one)')
  return port
}

/**
 * The most trades one demo runs: the demo holds every trade's plan, order and report row, and the sandbox every
 * trade and webhook, in memory (the database too is in memory). 50 take about 15 s; 1,000 about 5 minutes.
 */
export const MAX_DEMO_TRADES = 1_000

export const demoTrades = wholeNumberUpTo(MAX_DEMO_TRADES)

/** A value that must not be empty, such as a secret: an empty one signs with no key at all. */
export function nonEmpty(value: string): string {
  if (value === '') throw new InvalidArgumentError('must not be empty')
  return value
}

/** How a command refuses an order's reference: `Invalid order: external_reference: …`, exit 2. */
export function invalidOrder(error: PartnerValidationError): UsageError {
  return new UsageError(`Invalid order: ${error.message}`)
}

/**
 * An external reference naming an order, held to the rule every order's reference is (orders/external-reference.ts)
 * and refused as `orders create` refuses it, before the database is opened: `orders show` took one of any length and
 * looked it up, and beside a running service a long one was refused by the service instead.
 */
export function orderReference(value: string): string {
  try {
    checkExternalReference(value)
  } catch (error) {
    throw invalidOrder(error as PartnerValidationError)
  }
  return value
}

/**
 * orderReference for each value of a variadic option (`reconcile --requeue [references...]`), gathered in a list.
 * Added to the list it is given, not copied into a new one: a copy for each value made 40,000 references take 15 s,
 * and beside a running service that time was the service's, its receiver answering nothing.
 */
export function orderReferences(value: string, previous: unknown): string[] {
  const references = Array.isArray(previous) ? (previous as string[]) : []
  references.push(orderReference(value))
  return references
}

/**
 * A delivery id as the receiver takes one (webhooks/delivery-id.ts), so as every stored delivery has: any other is
 * refused as a bad order reference is, exit 2, before the database is opened. `deliveries show ""` looked it up and
 * said `No delivery  [delivery_not_found]`.
 */
export function deliveryIdArgument(value: string): string {
  if (!isDeliveryId(value)) throw new UsageError(`Invalid delivery id: must be ${DELIVERY_ID_RULE}, as the receiver takes it`)
  return value
}
