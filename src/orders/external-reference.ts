// What an order's external reference may be, checked where an order is made (create-order.ts) and where a command
// names an order by it (cli/cli-arguments.ts): one that no order can have is refused the same way everywhere,
// rather than made nowhere and then looked up as `order_not_found`.
import { isTradeFact, TRADE_FACT_MAX_LENGTH } from '../partner-api/field-rules.js'
import { PartnerValidationError } from '../partner-api/partner-api-error.js'

/** Throws PartnerValidationError unless `externalReference` is one that an order can have. */
export function checkExternalReference(externalReference: string): void {
  // the platform echoes it in every webhook for the order, where a longer one is refused
  if (!isTradeFact(externalReference)) {
    throw new PartnerValidationError(
      'external_reference',
      `must be 1 to ${TRADE_FACT_MAX_LENGTH} characters without a NUL or a lone surrogate, as every webhook for the order carries it`,
    )
  }
}
