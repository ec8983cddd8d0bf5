// `npx tsx bench/duplicate-keys.ts [calls]`: what the duplicate-key check adds to a delivery's parse, on a body of
// about 1 kB (the spec's trade payload with the trade's own fields and three milestones). Prints µs per call of
// findDuplicateKey alone (its count, which settles a body without duplicates, and its search, which a body takes
// when a string value holds `\":` or a key repeats), of parseBody, and of the parse as it was before the check
// (decode, JSON.parse, the NUL check): each the median of 9 rounds, all interleaved so that a slower moment of
// the machine falls on each.
import { findDuplicateKey } from '../src/webhooks/find-duplicate-key.js'
import { parseBody, parseJsonText } from '../src/webhooks/parse-delivery.js'

const calls = Number(process.argv[2] ?? 200_000)
const ROUNDS = 9

const milestone = (n: number, status: string) => ({
  milestone_id: `ms_01J9Z8Q4V7N${n}XK2H3RDB5C6T`,
  title: `Milestone ${n}: delivery of the ${['frame', 'wheels', 'saddle'][n - 1]}`,
  amount: `${n * 40}.00`,
  status,
})
const payload = {
  event: 'trade.funded',
  trade_id: 'trd_01J9Z8Q4V7NXK2H3RDB5C6TQ8M',
  reference: 'ESC-2024-000123456',
  status: 'funded',
  external_reference: 'order-8f14e45f-ceea-467f-a8f4-0b3c9d2e1a77',
  title: 'Bicycle, frame and wheels, as photographed in the listing',
  amount: '240.00',
  currency: 'EUR',
  seller_id: 'usr_01J9Z8Q4V7NXK2H3RDB5SELL',
  buyer_name: 'Zoë Müller-Lüdenscheidt',
  buyer_phone: '+4915112345678',
  milestones: [milestone(1, 'funded'), milestone(2, 'pending'), milestone(3, 'pending')],
  note: 'Pick-up in person; the seller says: "frame \\ fork as new".',
  created_at: '2024-05-01T10:15:30Z',
  updated_at: '2024-05-02T08:00:00Z',
}
const text = JSON.stringify(payload, null, 1)
const raw = Buffer.from(text)
const parsed = JSON.parse(text) as unknown
// the same body with one more value, which holds a key end (`\":`): the counts differ, and the text is searched
const searched = text.replace('"note": "', '"note": "\\": ')
const parsedSearched = JSON.parse(searched) as unknown

// parseBody before the check: the same steps without findDuplicateKey
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true })
const ESCAPED_NUL = /(?<!\\)(?:\\\\)*\\u0000/
function parseBodyBefore(rawBody: Buffer) {
  const decoded = decoder.decode(rawBody)
  const body = parseJsonText(decoded)
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw new Error('not an object')
  if (decoded.includes('\u0000') || (decoded.includes('\\u0000') && ESCAPED_NUL.test(decoded))) throw new Error('NUL')
  return { text: decoded, body }
}

let sink = 0
const cases: [string, () => void][] = [
  ['findDuplicateKey', () => (sink += findDuplicateKey(text, parsed) === undefined ? 1 : 0)],
  ['findDuplicateKey, searching', () => (sink += findDuplicateKey(searched, parsedSearched) === undefined ? 1 : 0)],
  ['parse before the check', () => (sink += parseBodyBefore(raw).text.length)],
  ['parseBody (with the check)', () => (sink += parseBody(raw).text.length)],
]

const microsPerCall = (run: () => void) => {
  const start = process.hrtime.bigint()
  for (let i = 0; i < calls; i++) run()
  return Number(process.hrtime.bigint() - start) / 1_000 / calls
}
for (const [, run] of cases) microsPerCall(run) // warm-up: every function optimised before it is measured
const samples = new Map<string, number[]>(cases.map(([name]) => [name, []]))
for (let round = 0; round < ROUNDS; round++) for (const [name, run] of cases) samples.get(name)!.push(microsPerCall(run))
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

console.log(`body: ${raw.length} bytes, ${calls} calls per round, median of ${ROUNDS} rounds (Node ${process.version})`)
for (const [name, values] of samples) console.log(`${name.padEnd(30)} ${median(values).toFixed(2).padStart(6)} µs per call`)
const before = median(samples.get('parse before the check')!)
const after = median(samples.get('parseBody (with the check)')!)
console.log(`the check adds ${(after - before).toFixed(2)} µs per delivery (${(((after - before) / before) * 100).toFixed(0)} % of the parse)`)
if (sink === 0) console.log('') // keeps the results in use
