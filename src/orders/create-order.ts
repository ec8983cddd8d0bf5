// Creating an order: inserted, and every webhook parked for its reference applied in the same
// transaction, under the reference's lock. A delivery parked while the transaction ran (its statement could not
// see the uncommitted order) is applied by its own ingest once the lock is given up, before its answer
// (parked-deliveries.ts), so its sender's next delivery comes after it; a second pass after the commit catches
// any other.
import type { Kysely } from 'kysely'
import type { Database } from '../db/database.js'
import { PartnerValidationError } from '../partner-api/partner-api-error.js'
import { applyParkedDeliveries, type ParkedDeliveryResult } from '../webhooks/parked-deliveries.js'
import { isForeignReference, type ObservationSettings } from './apply-observation.js'
import { checkExternalReference } from './external-reference.js'
import type { Order } from './order.js'
import { findOrderByExternalReference, insertOrder, lockOrderReference } from './order.repository.js'

/** Throws PartnerValidationError unless `externalReference` can be a new order's (what createOrder checks first). */
export function checkOrderReference(externalReference: string, settings: Pick<ObservationSettings, 'referencePattern'>): void {
  checkExternalReference(externalReference)
  // the webhooks of a reference the pattern does not match are dismissed, not kept for an order made later
  if (isForeignReference(settings, externalReference)) {
    throw new PartnerValidationError('external_reference', 'does not match ORDER_REFERENCE_PATTERN, the references this backend’s orders use')
  }
}

export async function createOrder(
  db: Kysely<Database>,
  {
    externalReference,
    now,
    onCreated,
  }: {
    externalReference: string
    now: () => Date
    /** Called once the order is committed, before the second pass: from then on the order exists whatever follows. */
    onCreated?: () => Promise<void>
  },
  settings: ObservationSettings,
): Promise<{ order: Order; appliedDeliveries: number; parkedDeliveries: ParkedDeliveryResult[] }> {
  checkOrderReference(externalReference, settings)
  const parked = await db.transaction().execute(async (trx) => {
    // a delivery parked while this runs waits for the commit before it looks for the order again
    await lockOrderReference(trx, externalReference)
    await insertOrder(trx, externalReference)
    return applyParkedDeliveries(trx, externalReference, settings, now)
  })
  await onCreated?.()
  parked.push(...(await applyParkedDeliveries(db, externalReference, settings, now)))
  const order = await findOrderByExternalReference(db, externalReference)
  if (!order) throw new Error(`Order ${externalReference} vanished right after it was created`)
  // appliedDeliveries counts the parked deliveries processed, whatever each one's outcome
  return { order, appliedDeliveries: parked.length, parkedDeliveries: parked }
}
