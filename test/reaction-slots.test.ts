// The handler slots (REACTION_CONCURRENCY) the job loop and the streams share: never more taken than there
// are, and a stream waiting for one is served before a later taker that finds one free.
import { describe, expect, it } from 'vitest'
import { createSlots } from '../src/reactions/handler-slots.js'

describe('reaction handler slots', () => {
  it('takes a free slot at once and refuses when all are taken', () => {
    const slots = createSlots(2)
    expect(slots.tryTake()).toBe(true)
    expect(slots.tryTake()).toBe(true)
    expect(slots.tryTake()).toBe(false)
    expect(slots.busy).toBe(2)
    slots.give()
    expect(slots.tryTake()).toBe(true)
    expect(slots.busy).toBe(2)
  })

  it('gives a freed slot to the one already waiting, not to a later tryTake', async () => {
    const slots = createSlots(1)
    expect(slots.tryTake()).toBe(true)
    const waiting = slots.whenFree(new AbortController().signal)
    slots.give()
    // the waiter has not run yet: the slot is promised to it
    expect(slots.tryTake()).toBe(false)
    expect(await waiting).toBe(true)
    expect(slots.busy).toBe(1)
    expect(slots.tryTake()).toBe(false)
  })

  it('stops waiting when the signal aborts, taking nothing', async () => {
    const slots = createSlots(1)
    slots.tryTake()
    const abort = new AbortController()
    const waiting = slots.whenFree(abort.signal)
    abort.abort()
    expect(await waiting).toBe(false)
    expect(slots.busy).toBe(1)
    slots.give()
    expect(slots.busy).toBe(0)
  })
})
