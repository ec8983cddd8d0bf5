// The system clock's sleep: resolves after its time, and rejects with the signal's own reason when aborted
// (what every caller's catch sees), leaving no listener behind.
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'

/** A signal that counts the abort listeners added to it and not removed. */
function countedSignal() {
  const controller = new AbortController()
  const { signal } = controller
  const counted = { controller, signal, listeners: 0 }
  const add = signal.addEventListener.bind(signal)
  const remove = signal.removeEventListener.bind(signal)
  signal.addEventListener = ((...args: Parameters<typeof add>) => {
    counted.listeners += 1
    add(...args)
  }) as typeof add
  signal.removeEventListener = ((...args: Parameters<typeof remove>) => {
    counted.listeners -= 1
    remove(...args)
  }) as typeof remove
  return counted
}

describe('systemClock.sleep', () => {
  it('resolves after the time asked, and leaves no listener on its signal', async () => {
    const counted = countedSignal()
    const started = performance.now()
    const sleeping = systemClock.sleep(20, counted.signal)
    expect(counted.listeners).toBe(1)
    await sleeping
    expect(performance.now() - started).toBeGreaterThanOrEqual(19)
    expect(counted.listeners).toBe(0)
  })

  it('rejects with the signal reason when aborted while sleeping', async () => {
    const controller = new AbortController()
    const reason = new Error('woken')
    const sleeping = systemClock.sleep(60_000, controller.signal)
    controller.abort(reason)
    await expect(sleeping).rejects.toBe(reason)
  })

  it('rejects at once with the reason of a signal already aborted', async () => {
    const reason = new Error('already stopped')
    await expect(systemClock.sleep(60_000, AbortSignal.abort(reason))).rejects.toBe(reason)
  })
})
