import { describe, expect, it } from 'vitest'
import { invalidReason } from '../src/webhooks/invalid-reason.js'

describe('invalidReason: why a stored invalid delivery was, read again from its body', () => {
  it('names the problem the checks find, as the ingest logged it', () => {
    expect(invalidReason('{"event":"trade.released","trade_id":"t","status":"funded","external_reference":"r"}')).toBe(
      'its event trade.released is not trade.{status} of its status',
    )
    expect(invalidReason('{"trade_id":"t","status":"funded"}')).toBe(
      'missing or not a non-empty string (≤ 200 characters, no NUL or lone surrogate): external_reference',
    )
    expect(invalidReason('\ufeff{"a":1,"a":2}')).toBe('duplicate key "a"')
  })

  it('says the database refused a value of a body the checks take (stored invalid by receive-webhook.ts)', () => {
    expect(invalidReason('{"event":"seller.\\ud800","seller_id":"s"}')).toMatch(/^the database refused one of its values when it was received/)
  })

  it('says what is wrong with a body that is not JSON, never throwing', () => {
    expect(invalidReason('not json')).toBe('The body is not valid JSON')
  })
})
