// Checks every request against what the spec states (and the gaps we fill, README "Partner API")
// before anything is sent; the field rules the sandbox shares are in field-rules.ts. A failure throws
// PartnerValidationError naming the field at fault, e.g. `reason`, `split_buyer_pct` or
// `milestones.0.amount`. Values are sent as given, never rewritten.
import { type ZodType, z } from 'zod'
import type { PartnerKind } from '../config.js'
import {
  DECIMAL,
  isLongEnoughReason,
  isPathId,
  isPercentage,
  isPositiveDecimal,
  MIN_DISPUTE_REASON_LENGTH,
  PHONE,
  TRADE_FACT_MAX_LENGTH,
} from './field-rules.js'
import { PartnerValidationError } from './partner-api-error.js'
import { tradeFact } from './responses.js'
import type {
  CreateProposalRequest,
  CreateTradeRequest,
  OpenDisputeRequest,
  RespondToProposalRequest,
} from './types.js'

const requiredText = () =>
  z
    .string({ error: (issue) => (issue.input === undefined ? 'is required' : 'must be a string') })
    .refine((value) => value.trim().length > 0, 'must not be blank')

const optionalText = () => z.string({ error: 'must be a string' }).optional()

const positiveAmount = () =>
  requiredText()
    .regex(DECIMAL, 'must be a decimal amount such as "12.50"')
    .refine(isPositiveDecimal, 'must be greater than zero')

const party = z.enum(['buyer', 'seller'], {
  error: (issue) => (issue.input === undefined ? 'is required (buyer or seller)' : 'must be buyer or seller'),
})

const milestone = z.strictObject({ title: requiredText(), amount: positiveAmount() })

function createTradeSchema(kind: PartnerKind) {
  return z.strictObject({
    title: requiredText(),
    amount: positiveAmount(),
    currency: requiredText(),
    // Marketplace partners name the seller of every trade; Merchant trades use the implicit house seller
    seller_id:
      kind === 'marketplace'
        ? z
            .string({
              error: (issue) =>
                issue.input === undefined
                  ? 'is required for a marketplace partner (PARTNER_KIND)'
                  : 'must be a string',
            })
            .refine((value) => value.trim().length > 0, 'must not be blank')
        : optionalText().refine(
            (value) => value === undefined || value.trim().length > 0,
            'must not be blank',
          ),
    buyer_name: optionalText(),
    buyer_phone: optionalText().refine(
      (value) => value === undefined || PHONE.test(value),
      'must be in international format: a leading +, then 7 to 15 digits, e.g. +4915112345678',
    ),
    // the platform echoes it in every webhook and answer, where a longer one is refused (responses.ts)
    external_reference: requiredText().pipe(tradeFact),
    milestones: z
      .array(milestone, { error: 'must be an array of {title, amount}' })
      .min(1, 'must hold at least one milestone when present (omit it for a single deliver/release trade)')
      .optional(),
  })
}

const openDisputeSchema = z.strictObject({
  reason: z
    .string({ error: (issue) => (issue.input === undefined ? 'is required' : 'must be a string') })
    .refine(isLongEnoughReason, `must be at least ${MIN_DISPUTE_REASON_LENGTH} characters`),
  category: optionalText(),
  party,
})

const createProposalSchema = z
  .strictObject({
    outcome: z.enum(['buyer_win', 'seller_win', 'split'], {
      error: (issue) =>
        issue.input === undefined
          ? 'is required (buyer_win, seller_win or split)'
          : 'must be buyer_win, seller_win or split',
    }),
    split_buyer_pct: optionalText(),
    party,
  })
  .superRefine((proposal, context) => {
    const pct = proposal.split_buyer_pct
    if (proposal.outcome === 'split') {
      if (pct === undefined) {
        context.addIssue({
          code: 'custom',
          path: ['split_buyer_pct'],
          message: 'is required for outcome split',
        })
      } else if (!isPercentage(pct)) {
        context.addIssue({
          code: 'custom',
          path: ['split_buyer_pct'],
          message: 'must be a decimal percentage between 0 and 100, e.g. "40" or "62.5"',
        })
      }
    } else if (pct !== undefined) {
      // a share only means something for a split; refusing it beats sending something ambiguous
      context.addIssue({
        code: 'custom',
        path: ['split_buyer_pct'],
        message: 'is only allowed for outcome split',
      })
    }
  })

const respondSchema = z.strictObject({
  accept: z.boolean({
    error: (issue) => (issue.input === undefined ? 'is required (true or false)' : 'must be a boolean'),
  }),
  party,
})

function check<T>(schema: ZodType, value: unknown): T {
  const result = schema.safeParse(value)
  if (result.success) return result.data as T
  const issue = result.error.issues[0]!
  if (issue.code === 'unrecognized_keys') {
    throw new PartnerValidationError(issue.keys[0] ?? '(request)', 'is not a field of this request')
  }
  const field = issue.path.length > 0 ? issue.path.map(String).join('.') : '(request)'
  throw new PartnerValidationError(field, issue.path.length > 0 ? issue.message : 'must be a JSON object')
}

export function validateCreateTrade(request: CreateTradeRequest, kind: PartnerKind): CreateTradeRequest {
  return check(createTradeSchema(kind), request)
}

export function validateOpenDispute(request: OpenDisputeRequest): OpenDisputeRequest {
  return check(openDisputeSchema, request)
}

export function validateCreateProposal(request: CreateProposalRequest): CreateProposalRequest {
  return check(createProposalSchema, request)
}

export function validateRespondToProposal(request: RespondToProposalRequest): RespondToProposalRequest {
  return check(respondSchema, request)
}

/** A platform id used as a path segment: non-empty, and never a dot segment the URL parser would collapse. */
export function validatePathId(field: string, value: unknown): string {
  if (typeof value !== 'string' || value.trim().length === 0) {
    throw new PartnerValidationError(field, 'is required (a platform id)')
  }
  if (value.length > TRADE_FACT_MAX_LENGTH) throw new PartnerValidationError(field, `must be at most ${TRADE_FACT_MAX_LENGTH} characters (a platform id)`)
  if (!isPathId(value)) throw new PartnerValidationError(field, 'is not a valid platform id')
  return value
}
