import { type Clock, systemClock } from '../../src/clock.js'

/** A clock that moves only when told to; sleepers wake when their time is reached. */
export class FakeClock implements Clock {
  private current: number
  /** How far stepWallClock has set now() from the monotonic time. */
  private wallStep = 0
  private sleepers: { until: number; resolve: () => void }[] = []
  /** Every duration passed to sleep(), in order: what a backoff test asserts on. */
  readonly sleeps: number[] = []

  constructor(start = Date.parse('2026-01-01T00:00:00Z')) {
    this.current = start
  }

  now(): number {
    return this.current + this.wallStep
  }

  /** The same time as now() unless stepWallClock was called: it moves only forward, by advance(). */
  monotonicNow(): number {
    return this.current
  }

  /**
   * Sets the wall clock (now()) `ms` forward, or back when negative, as NTP or an operator setting the machine's
   * clock does: monotonicNow() and the sleepers do not move.
   */
  stepWallClock(ms: number): void {
    this.wallStep += ms
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    this.sleeps.push(ms)
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason)
      // as the real clock: a sleeper that wakes stops listening, so one signal can serve many sleeps
      const onAbort = () => {
        this.sleepers = this.sleepers.filter((s) => s !== sleeper)
        reject(signal!.reason)
      }
      const sleeper = {
        until: this.current + ms,
        resolve: () => {
          signal?.removeEventListener('abort', onAbort)
          resolve()
        },
      }
      this.sleepers.push(sleeper)
      signal?.addEventListener('abort', onAbort, { once: true })
    })
  }

  /** Moves time forward and wakes every sleeper whose time has come, letting their continuations run. */
  async advance(ms: number): Promise<void> {
    this.current += ms
    const due = this.sleepers.filter((s) => s.until <= this.current)
    this.sleepers = this.sleepers.filter((s) => s.until > this.current)
    for (const sleeper of due) sleeper.resolve()
    for (let i = 0; i < 5; i++) await Promise.resolve()
    await new Promise((resolve) => setImmediate(resolve))
  }

  /** How many sleepers are waiting: lets a test wait until the code under test went to sleep. */
  get pendingSleepers(): number {
    return this.sleepers.length
  }
}

/**
 * A FakeClock whose sleep of 0 ms (or less) ends at once, as the system clock's does (the next tick), where FakeClock's
 * waits for the next advance: for a test of code that must not retry at once, which would otherwise hang, not fail.
 */
export class ZeroSleepFakeClock extends FakeClock {
  override sleep(ms: number, signal?: AbortSignal): Promise<void> {
    if (ms > 0) return super.sleep(ms, signal)
    this.sleeps.push(ms)
    return signal?.aborted ? Promise.reject(signal.reason) : Promise.resolve()
  }
}

/** The machine's clock, stepped by `stepMs` (the test sets it); its sleeps and monotonic time are the machine's. */
export class SteppedClock implements Clock {
  stepMs = 0
  now() {
    return Date.now() + this.stepMs
  }
  monotonicNow() {
    return performance.now()
  }
  sleep(ms: number, signal?: AbortSignal) {
    return systemClock.sleep(ms, signal)
  }
}
