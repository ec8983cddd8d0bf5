// Pure: the first key that one object of a JSON text holds twice. JSON.parse keeps the last of the two
// ("last key wins"); a reader that keeps the first sees another body under the same signature, so a body with
// `"status":"created","status":"released"` said `released` to us and may say `created` to the platform. Used on
// both texts the platform sends us: a webhook's body (src/webhooks/parse-delivery.ts) and an API answer
// (src/partner-api/partner-api-transport.ts).
//
// On the ingest path, so in two steps, the first cheap (about 1 µs on a 1 kB body, a quarter of JSON.parse's):
// 1. count: every key in the text ends in `"`, white space and `:` (a key end), so the text holds at least as
//    many key ends as it writes keys (a string value such as `"say \":\""` adds more, never fewer), and it writes
//    at least as many keys as its parsed objects hold, as many only when no object's keys repeat. So when the
//    key ends are as many as the keys held, no key repeats.
// 2. otherwise, find it: one pass of a sticky pattern that steps over everything but strings and brackets (a
//    value's text is never looked into), a string followed by `:` being a key, with the keys of each open object.
import { printable } from '../printable.js'

// [^"{}[\]]*   what lies between tokens: numbers, literals, commas, colons, white space (and a leading BOM)
// "(…)"        a string (its text, escapes as written, in group 1), then `:` when it is a key (group 2)
// ([{}[\]])    a bracket (group 3)
const NEXT_TOKEN = /[^"{}[\]]*(?:"([^"\\]*(?:\\.[^"\\]*)*)"([\t\n\r ]*:)?|([{}[\]]))/y

/**
 * The first key found a second time in the same object, at any depth, decoded as JSON.parse decodes it
 * (`"st\u0061tus"` is `status`); undefined when every object's keys differ. `text` is JSON that JSON.parse
 * accepted and `value` what it made of it: neither is checked against the other.
 */
export function findDuplicateKey(text: string, value: unknown): string | undefined {
  return keyEnds(text) === keysHeld(value) ? undefined : firstDuplicateKey(text)
}

const SHOWN_KEY_MAX_LENGTH = 100

/**
 * A key found twice, for a log line or a person: quoted and escaped as JSON writes it, on one line and visible
 * (printable.ts: it is the sender's text); a long key by its first 100 units. `status` → `"status"`.
 */
export function shownKey(key: string): string {
  const cut = key.length > SHOWN_KEY_MAX_LENGTH ? `${key.slice(0, SHOWN_KEY_MAX_LENGTH)}…` : key
  return printable(JSON.stringify(cut))
}

const [QUOTE, TAB, LINE_FEED, CARRIAGE_RETURN, SPACE] = [0x22, 0x09, 0x0a, 0x0d, 0x20]

// the colons with a quote before them, white space apart: indexOf and a look back, seven times quicker
// than counting the matches of /"[\t\n\r ]*:/g
function keyEnds(text: string): number {
  let count = 0
  for (let colon = text.indexOf(':'); colon !== -1; colon = text.indexOf(':', colon + 1)) {
    let before = colon - 1
    let unit = text.charCodeAt(before)
    while (unit === SPACE || unit === LINE_FEED || unit === CARRIAGE_RETURN || unit === TAB) unit = text.charCodeAt(--before)
    if (unit === QUOTE) count++
  }
  return count
}

// how many keys the objects in a parsed value hold, all depths together; without recursion, as JSON.parse
// accepts nesting deeper than the call stack
function keysHeld(value: unknown): number {
  let count = 0
  const pending: object[] = []
  if (typeof value === 'object' && value !== null) pending.push(value)
  for (let next = pending.pop(); next !== undefined; next = pending.pop()) {
    const members: unknown[] = Array.isArray(next) ? next : Object.values(next)
    if (!Array.isArray(next)) count += members.length
    for (const member of members) if (typeof member === 'object' && member !== null) pending.push(member)
  }
  return count
}

function firstDuplicateKey(text: string): string | undefined {
  // the keys of each enclosing object, innermost last; undefined for an array
  const enclosing: (Set<string> | undefined)[] = []
  let keys: Set<string> | undefined
  NEXT_TOKEN.lastIndex = 0
  let match: RegExpExecArray | null
  while ((match = NEXT_TOKEN.exec(text)) !== null) {
    const bracket = match[3]
    if (bracket === '{') {
      enclosing.push(keys)
      keys = new Set()
    } else if (bracket === '[') {
      enclosing.push(keys)
      keys = undefined
    } else if (bracket !== undefined) {
      keys = enclosing.pop()
    } else if (match[2] !== undefined && keys !== undefined) {
      const written = match[1]!
      const key = written.includes('\\') ? (JSON.parse(`"${written}"`) as string) : written
      if (keys.has(key)) {
        NEXT_TOKEN.lastIndex = 0
        return key
      }
      keys.add(key)
    }
  }
  return undefined
}
