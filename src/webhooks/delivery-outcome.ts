// What a stored delivery did, in one list with no imports: the CLI validates `--outcome` against it
// without loading the database code, and the metrics create their label values from it.

export const DELIVERY_OUTCOMES = [
  'applied',
  'duplicate_effect',
  'stale',
  'unknown_status',
  'unmatched',
  // parked deliveries an operator set aside (`deliveries dismiss`): their reference is not this backend's
  'dismissed',
  'ignored',
  'invalid',
  'trade_mismatch',
  // a poll's outcome, in the type because a delivery's is the observation's; never a webhook's
  'lease_lost',
] as const

export type DeliveryOutcome = (typeof DELIVERY_OUTCOMES)[number]

/** The outcomes a stored delivery can have (a search offers these): every one but a poll's lease_lost. */
export const WEBHOOK_OUTCOMES = DELIVERY_OUTCOMES.filter(
  (outcome): outcome is Exclude<DeliveryOutcome, 'lease_lost'> => outcome !== 'lease_lost',
)
