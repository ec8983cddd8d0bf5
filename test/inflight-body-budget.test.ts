// The body budget's room-making on its own: which bodies still arriving are cut for a request that does not fit.
// (test/limits.test.ts and test/memory-bound.test.ts drive it through the listener.)
import { describe, expect, it } from 'vitest'
import { InflightBodyBudget } from '../src/http/inflight-body-budget.js'

/** A body still arriving that holds `bytes`; cut, it gives them back. */
function arriving(budget: InflightBodyBudget, bytes: number) {
  expect(budget.tryReserve(bytes)).toBe(true)
  const body = { cut: false }
  budget.beginArriving(
    () => (body.cut ? 0 : bytes),
    () => {
      body.cut = true
      budget.release(bytes)
    },
  )
  return body
}

describe('the in-flight body budget making room', () => {
  it('cuts the bodies arriving longest, as many as it takes and no more', () => {
    // 0: every body still arriving may be cut
    const budget = new InflightBodyBudget(100, 0)
    const oldest = arriving(budget, 30)
    const next = arriving(budget, 30)
    const youngest = arriving(budget, 30)
    // 10 free: the oldest's 30 make 40, not enough; the next's make 70
    expect(budget.makeRoom(50)).toBe(true)
    expect([oldest.cut, next.cut, youngest.cut]).toEqual([true, true, false])
    expect(budget.reservedBytes).toBe(30)
  })

  it('cuts none when cutting every one it may would still not make room', () => {
    const budget = new InflightBodyBudget(100, 0)
    // 50 held by a body read whole and waiting for its answer: not arriving, never cut
    expect(budget.tryReserve(50)).toBe(true)
    const slow = arriving(budget, 30)
    // 20 free and 30 to cut make 50: 60 cannot fit, so the slow body keeps its place
    expect(budget.makeRoom(60)).toBe(false)
    expect(slow.cut).toBe(false)
    expect(budget.reservedBytes).toBe(80)
    expect(budget.makeRoom(50)).toBe(true)
    expect(slow.cut).toBe(true)
  })

  it('cuts nothing that has been arriving for less than its time', () => {
    const budget = new InflightBodyBudget(100, 60_000)
    const recent = arriving(budget, 90)
    expect(budget.makeRoom(20)).toBe(false)
    expect(recent.cut).toBe(false)
    expect(budget.makeRoom(10)).toBe(true)
  })
})
