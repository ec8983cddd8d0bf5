// What the platform answers, as zod schemas; the record types in types.ts are inferred from them.
//
// The spec shows only four fields of a trade (trade_id, reference, status, external_reference) and only the
// id of a dispute or proposal; the rest of each record is our assumption (README, "Partner API client"),
// answered in full by the sandbox. Two rules keep a partner in production working when the platform
// changes its answers:
// - tolerant: objects are loose (a field the platform adds is accepted and kept), fields the spec does not
//   show may be absent, and every enum-like field is an open string (we never branch on them; the trade
//   status has its own model for unknown values, src/orders/trade-status.ts);
// - strict where we rely on a field: the ids we store or address calls with, the trade status and references, and
//   the shape we walk (milestones, dispute). Any other field is typed unknown, so the typed record never lies, and
//   a field of another type than assumed (`"amount": 10.5`) is kept as it came.
import { z } from 'zod'
import { isPathId, LONE_SURROGATE, TRADE_FACT_MAX_LENGTH } from './field-rules.js'

const text = z.string()
const nullableText = z.string().nullable()

// The four fields every observation of a trade is made of are stored and indexed: an answer is held to the
// rule a webhook's payload is (src/webhooks/parse-delivery.ts), so a poll or an operation cannot store what
// a delivery could not. A NUL and a lone surrogate are refused as Postgres's text cannot hold either.
export const tradeFact = z
  .string()
  .min(1, 'must not be empty')
  .max(TRADE_FACT_MAX_LENGTH, `must be at most ${TRADE_FACT_MAX_LENGTH} characters`)
  .refine((value) => !value.includes('\u0000'), 'must not hold a NUL character')
  .refine((value) => !LONE_SURROGATE.test(value), 'must not hold a lone surrogate')

// An id the client later puts in a path (a trade's, a milestone's, a proposal's; a dispute's is held to it too)
// must pass the rule the client applies there (validatePathId): a trade id ".." was stored from a create's
// answer, and every later call on its order was then refused before sending, as if the operator had mistyped.
const PATH_ID_PROBLEM = `must be usable as a path segment (not blank, "." or "..", no lone surrogate, at most ${TRADE_FACT_MAX_LENGTH} characters)`
const platformId = z.string().refine(isPathId, PATH_ID_PROBLEM)
const tradeId = tradeFact.refine(isPathId, PATH_ID_PROBLEM)

// Full records: what the sandbox answers and the README documents.

export const fullMilestoneSchema = z.looseObject({
  milestone_id: platformId,
  title: text,
  amount: text,
  /** pending, delivered, released */
  status: text,
})

export const fullProposalSchema = z.looseObject({
  proposal_id: platformId,
  trade_id: text,
  /** buyer_win, seller_win, split */
  outcome: text,
  split_buyer_pct: nullableText,
  /** buyer, seller */
  party: text,
  /** pending, accepted, rejected */
  status: text,
  created_at: text,
})

export const fullDisputeSchema = z.looseObject({
  dispute_id: platformId,
  trade_id: text,
  /** buyer, seller */
  party: text,
  reason: text,
  category: nullableText,
  /** open, resolved */
  status: text,
  proposals: z.array(fullProposalSchema),
  created_at: text,
})

/** Set once an accepted proposal split the funds: percentages as decimal strings. */
const resolutionSchema = z.looseObject({ outcome: text, buyer_pct: text, seller_pct: text })
// the sandbox's resolution states the amounts too (README, "Sandbox"); a received one is not held to them
const fullResolutionSchema = resolutionSchema.extend({
  held_amount: text.optional(),
  buyer_amount: text.optional(),
  seller_amount: text.optional(),
})

export const fullTradeSchema = z.looseObject({
  trade_id: tradeId,
  reference: tradeFact,
  /** an open set: src/orders/trade-status.ts handles a status it does not know */
  status: tradeFact,
  external_reference: tradeFact,
  title: text,
  amount: text,
  currency: text,
  seller_id: text,
  buyer_name: nullableText,
  buyer_phone: nullableText,
  /** null for a single deliver/release trade */
  milestones: z.array(fullMilestoneSchema).nullable(),
  dispute: fullDisputeSchema.nullable(),
  resolution: fullResolutionSchema.nullable(),
  created_at: text,
  updated_at: text,
})

export const fullRespondResultSchema = z.looseObject({ proposal: fullProposalSchema, trade: fullTradeSchema })

// Received records: what the client accepts. Only what the service relies on is checked: the ids it stores or
// addresses calls with, the trade's status and references, and the shape it walks (the milestones it lists, the
// dispute it names). Any other field is taken as it comes and typed unknown: the spec gives no type for it, and a
// made trade was thrown away, its order marked unknown, over `"amount": 10.5` where a string was assumed.
const notRelied = z.unknown().optional()

export const milestoneSchema = z.looseObject({ milestone_id: platformId, title: notRelied, amount: notRelied, status: notRelied })

export const proposalSchema = z.looseObject({
  proposal_id: platformId,
  // checked against the trade the call was on
  trade_id: text.optional(),
  outcome: notRelied,
  split_buyer_pct: notRelied,
  party: notRelied,
  status: notRelied,
  created_at: notRelied,
})

export const disputeSchema = z.looseObject({
  dispute_id: platformId,
  trade_id: text.optional(),
  party: notRelied,
  reason: notRelied,
  category: notRelied,
  status: notRelied,
  // their ids are what `proposals respond` takes
  proposals: z.array(proposalSchema).optional(),
  created_at: notRelied,
})

export const tradeSchema = z.looseObject({
  // the four fields the spec shows and every observation of a trade is made of
  trade_id: tradeId,
  reference: tradeFact,
  status: tradeFact,
  external_reference: tradeFact,
  title: notRelied,
  amount: notRelied,
  currency: notRelied,
  seller_id: notRelied,
  buyer_name: notRelied,
  buyer_phone: notRelied,
  /** null for a single deliver/release trade; their ids are what `trades milestone deliver|release` take */
  milestones: z.array(milestoneSchema).nullable().optional(),
  dispute: disputeSchema.nullable().optional(),
  resolution: notRelied,
  created_at: notRelied,
  updated_at: notRelied,
})

export const respondResultSchema = z.looseObject({ proposal: proposalSchema, trade: tradeSchema })

/** The platform's error body, `{"error":{"code","message","fields"?}}`: only code and message are used. */
export const platformErrorBodySchema = z.looseObject({ error: z.looseObject({ code: text, message: text }) })

/**
 * The fields a record declares, at every depth. A loose object's inferred type also takes any other key
 * (`[key: string]: unknown`), so `trade.staus` compiled and read undefined; these types drop that index
 * signature. The parsed value still holds a field the platform added (README, "Partner API client").
 */
export type Declared<T> = T extends readonly (infer Item)[]
  ? Declared<Item>[]
  : T extends object
    ? { [K in keyof T as string extends K ? never : number extends K ? never : K]: Declared<T[K]> }
    : T

/** The record a schema checks, as the client returns it: its declared fields only. */
export type RecordOf<Schema extends z.ZodType> = Declared<z.output<Schema>>

/** The first field of an answer that is missing or mistyped, as a path such as `trade.status`. */
export interface ResponseProblem {
  field: string
  message: string
}

/** A parsed answer checked: the record, or where it is wrong. */
export type CheckedResponse<T> = { ok: true; value: T } | { ok: false; problem: ResponseProblem }

/** Checks a parsed JSON answer; never echoes a value of the body, only where it is wrong. */
export function checkResponse<T>(schema: z.ZodType<T>, body: unknown): CheckedResponse<T> {
  const result = schema.safeParse(body, {
    error: (issue) =>
      issue.input === undefined
        ? 'is missing'
        : issue.code === 'invalid_type'
          ? `must be ${issue.expected}`
          : undefined,
  })
  if (result.success) return { ok: true, value: result.data }
  const issue = result.error.issues[0]!
  if (issue.path.length === 0) return { ok: false, problem: { field: '(body)', message: 'must be an object' } }
  return { ok: false, problem: { field: issue.path.map(String).join('.'), message: issue.message } }
}

/**
 * What a milestone deliver or release answered: the spec allows either record, so the answer says which came.
 * Only a trade record carries the trade's status; a milestone record carries the milestone's alone.
 */
export type MilestoneAnswer =
  | { record: 'trade'; trade: RecordOf<typeof tradeSchema> }
  | { record: 'milestone'; milestone: RecordOf<typeof milestoneSchema> }

/**
 * The answer of a milestone deliver or release, which the spec gives as "Milestone or trade record" (section 4).
 * The two are told apart by a top-level `milestone_id`: a milestone record is named by it, while a trade record
 * holds its milestones in its `milestones` array and has none of its own. A body with one is checked as a
 * milestone record (milestoneSchema); any other is held to the trade schema, so a body that is neither is refused
 * as before, naming the first trade field at fault (`trade_id is missing`).
 */
export function checkMilestoneAnswer(body: unknown): CheckedResponse<MilestoneAnswer> {
  if (isMilestoneRecord(body)) {
    const checked = checkResponse(milestoneSchema, body)
    return checked.ok ? { ok: true, value: { record: 'milestone', milestone: checked.value } } : checked
  }
  const checked = checkResponse(tradeSchema, body)
  return checked.ok ? { ok: true, value: { record: 'trade', trade: checked.value } } : checked
}

function isMilestoneRecord(body: unknown): boolean {
  return typeof body === 'object' && body !== null && !Array.isArray(body) && Object.hasOwn(body, 'milestone_id')
}
