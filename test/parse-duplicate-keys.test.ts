// A key twice in one object of a body: found at any depth, however its text is escaped, and never reported for
// a text JSON.stringify wrote (which cannot hold one); and such a body, parsed, is classified invalid.
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { findDuplicateKey } from '../src/webhooks/find-duplicate-key.js'
import { classifyDelivery, parseBody } from '../src/webhooks/parse-delivery.js'

// every character as a \uXXXX escape: the same key to JSON.parse, another text to a pattern
const fullyEscaped = (key: string) =>
  `"${key
    .split('')
    .map((unit) => `\\u${unit.charCodeAt(0).toString(16).padStart(4, '0')}`)
    .join('')}"`

// strings of any UTF-16 units: quotes, backslashes, controls, brackets and lone surrogates among them
const anyJson = fc.jsonValue({ stringUnit: 'binary' })
const anyString = fc.string({ unit: 'binary' })

// the text and what JSON.parse makes of it, as parseBody passes them
const found = (text: string) => findDuplicateKey(text, JSON.parse(text.replace(/^\ufeff/, '')))

describe('findDuplicateKey', () => {
  it('reports nothing for any JSON text JSON.stringify writes, compact or indented', () => {
    fc.assert(
      fc.property(anyJson, fc.constantFrom(undefined, 2, '\t'), (value, indent) => {
        const text = JSON.stringify(value, null, indent)
        expect(found(text)).toBeUndefined()
        // beside a value that holds a key end the counts differ, and the whole text is searched
        expect(found(`{"value":${text},"text":"\\":"}`)).toBeUndefined()
      }),
      { numRuns: 2_000 },
    )
  })

  it('reports a key injected twice into an object, at any depth, as JSON.parse decodes it', () => {
    const entry = fc.tuple(anyString, anyJson)
    fc.assert(
      fc.property(
        anyString,
        anyJson,
        anyJson,
        fc.uniqueArray(entry, { selector: ([key]) => key, maxLength: 6 }),
        fc.nat(),
        fc.boolean(),
        fc.array(fc.constantFrom('object', 'array'), { maxLength: 4 }),
        (key, first, second, entries, at, escaped, enclosing) => {
          const others = entries.filter(([other]) => other !== key).map(([other, value]) => `${JSON.stringify(other)}:${JSON.stringify(value)}`)
          const place = at % (others.length + 1)
          const members = [...others.slice(0, place), `${JSON.stringify(key)}:${JSON.stringify(first)}`, ...others.slice(place)]
          members.push(`${escaped ? fullyEscaped(key) : JSON.stringify(key)}:${JSON.stringify(second)}`)
          let text = `{${members.join(',')}}`
          for (const container of enclosing) text = container === 'object' ? `{"milestones":${text},"n":1}` : `[1,${text},{"n":2}]`
          expect(found(text)).toBe(key)
        },
      ),
      { numRuns: 2_000 },
    )
  })

  it.each([
    ['the attack: status twice at the top', '{"trade_id":"t1","reference":"R1","status":"created","status":"released","external_reference":"o1"}', 'status'],
    ['one written with an escape', '{"status":"created","st\\u0061tus":"released"}', 'status'],
    ['a key twice inside a milestone', '{"milestones":[{"id":"m1","amount":"1"},{"id":"m2","id":"m3"}]}', 'id'],
    ['a key twice after a nested object closed', '{"a":{"b":1,"c":[{}]},"a":2}', 'a'],
    ['white space before the colons', '{ "a" \n:\t1 , "a"\r\n : 2 }', 'a'],
    ['a key with an escaped quote and backslash', '{"a\\"b\\\\":1,"a\\"b\\\\":2}', 'a"b\\'],
    ['the empty key', '{"":1,"":2}', ''],
    ['__proto__, which JSON.parse keeps as an own key', '{"__proto__":1,"__proto__":2}', '__proto__'],
    ['after a leading byte-order mark', '\ufeff{"a":1,"a":2}', 'a'],
    // more key ends (`":`) in string values than keys twice: the counts differ all the same
    ['a key twice beside values that hold key ends', '{"a" :1,"a" :2,"v":"\\":","w":["\\" :"]}', 'a'],
  ])('reports %s', (_name, text, key) => {
    expect(found(text)).toBe(key)
  })

  it.each([
    ['the same key in two objects', '{"a":{"x":1},"b":{"x":2}}'],
    ['the same keys in each object of an array', '{"milestones":[{"id":"m1"},{"id":"m2"}]}'],
    ['a key the same as its enclosing object’s', '{"a":{"a":{"a":1}}}'],
    ['strings that look like keys, inside values', '{"a":"\\"a\\":1","b":["a",":","{\\"b\\":2}"],"c":"}{]["}'],
    ['keys that differ only in case or by an escape that decodes otherwise', '{"Status":1,"status":2,"st\\u0041tus":3}'],
    ['a top-level array of objects with the same keys', '[{"a":1},{"a":1}]'],
    ['the empty object and scalars', '{}'],
    ['values that hold key ends, so that the counts differ', '{"a":"\\":","b":{"c":"x\\"\\t:"}}'],
  ])('reports nothing for %s', (_name, text) => {
    expect(found(text)).toBeUndefined()
  })

  it('reports the key of one body, not one left over from an earlier text', () => {
    expect(found('{"a":1,"a":2}')).toBe('a')
    expect(found('{"b":"\\":","c":2}')).toBeUndefined()
    expect(found('{"c":1,"c":2}')).toBe('c')
  })

  it('takes nesting deeper than the call stack', () => {
    const depth = 200_000
    const deep = (inner: string) => `{"a":${'['.repeat(depth)}${inner}${']'.repeat(depth)},"b":"\\":"}`
    expect(found(deep('{"x":1}'))).toBeUndefined()
    expect(found(deep('{"x":1,"x":2}'))).toBe('x')
  })
})

describe('a parsed body with a key twice', () => {
  const classified = (text: string) => classifyDelivery(parseBody(Buffer.from(text)))

  it('is invalid, its reason naming the key, whatever the value JSON.parse kept', () => {
    const attack = '{"trade_id":"t1","reference":"R1","status":"created","status":"released","external_reference":"o1"}'
    expect(classified(attack)).toEqual({ kind: 'invalid', eventType: 'trade.released', problem: 'duplicate key "status"' })
    const nested = '{"trade_id":"t1","status":"funded","external_reference":"o1","milestones":[{"id":"m1","status":"a","status":"b"}]}'
    expect(classified(nested)).toEqual({ kind: 'invalid', eventType: 'trade.funded', problem: 'duplicate key "status"' })
  })

  it('is invalid when its event is one that changes no order, too', () => {
    expect(classified('{"event":"seller.verified","seller_id":"s1","seller_id":"s2"}')).toEqual({
      kind: 'invalid',
      eventType: 'seller.verified',
      problem: 'duplicate key "seller_id"',
    })
  })

  it('names a key of controls, bidirectional marks or great length escaped, on one line', () => {
    const shown = (key: string) => {
      const result = classified(`{"trade_id":"t1","status":"funded","external_reference":"o1",${JSON.stringify(key)}:1,${JSON.stringify(key)}:2}`)
      return result.kind === 'invalid' ? result.problem : result.kind
    }
    expect(shown('a\nb\u001b[2J')).toBe('duplicate key "a\\nb\\u001b[2J"')
    expect(shown('invoice\u202efdp.exe')).toBe('duplicate key "invoice\\u202efdp.exe"')
    expect(shown('\ud800')).toBe('duplicate key "\\ud800"')
    expect(shown('k'.repeat(5_000))).toBe(`duplicate key "${'k'.repeat(100)}…"`)
  })

  it('leaves a body without one as it was', () => {
    const body = '{"trade_id":"t1","reference":"R1","status":"released","external_reference":"o1","milestones":[{"status":"a"},{"status":"b"}]}'
    expect(classified(body)).toEqual({
      kind: 'trade',
      eventType: 'trade.released',
      tradeId: 't1',
      tradeReference: 'R1',
      status: 'released',
      externalReference: 'o1',
    })
  })
})
