// An AsyncLocalStorage that is turned off again once no work runs under it. On Node 20 and 22 a storage's first
// run() turns on a hook that every promise of the process calls from then on (to carry the store to it), and it
// stays on until every storage is disabled: one console page, or one command of a second terminal, left every
// later webhook delivery paying for it, 5-7 µs a delivery of 56-113 (bench/results/rounds.md). Node 24 carries the
// store in a frame of the promise's context instead, with no hook to turn off; there a storage is left on (disabling
// one there takes its store out of the context that disables it, which nothing here needs).
//
// A run's work ends when `done` settles (by default the promise the work returns; work that returns none ends with
// its return) and, when a time is given, not before `notBefore` (performance.now()): a console page's deadline, up to
// which its statements still running are bound by it (answer-bound.ts). Once no run's work is left, and that time has
// passed, the storage is disabled; the next run() turns it on again. Work that outlives its `done` sees no store once
// the storage is off: what uses one must end its own waits by then.
import { AsyncLocalStorage } from 'node:async_hooks'
import { performance } from 'node:perf_hooks'

export interface RunEnds {
  /** Settles when the run's work is over (by default the promise the work returns). */
  done?: PromiseLike<unknown>
  /** performance.now() before which the storage stays on, whatever `done` says. */
  notBefore?: number
}

export class ScopedStore<T> {
  readonly #storage = new AsyncLocalStorage<T>()
  #running = 0
  #onUntil = 0
  #offTimer: NodeJS.Timeout | undefined

  /** Runs `work` with `store` as what getStore() gives, in it and in everything it starts. */
  run<R>(store: T, work: () => R, ends: RunEnds = {}): R {
    clearTimeout(this.#offTimer)
    this.#running += 1
    if (ends.notBefore !== undefined) this.#onUntil = Math.max(this.#onUntil, ends.notBefore)
    let result: R
    try {
      result = this.#storage.run(store, work)
    } catch (error) {
      this.#ended()
      throw error
    }
    const done = ends.done ?? (isThenable(result) ? result : undefined)
    const ended = () => this.#ended()
    if (done) done.then(ended, ended)
    else ended()
    return result
  }

  getStore(): T | undefined {
    return this.#storage.getStore()
  }

  /** How many runs' work is not over yet (for the tests). */
  get running(): number {
    return this.#running
  }

  #ended(): void {
    this.#running -= 1
    if (this.#running > 0 || !carriedByHook()) return
    const left = this.#onUntil - performance.now()
    if (left <= 0) return this.#storage.disable()
    this.#offTimer = setTimeout(() => {
      if (this.#running === 0) this.#storage.disable()
    }, Math.ceil(left)).unref()
  }
}

let byHook: boolean | undefined

/**
 * Whether this Node's AsyncLocalStorage carries stores by a promise hook (Node 20 and 22): a promise made in a run
 * has a mark more (the store's) than one made outside it.
 */
function carriedByHook(): boolean {
  if (byHook === undefined) {
    const marks = () => Object.getOwnPropertySymbols(Promise.resolve()).length
    const outside = marks()
    const probe = new AsyncLocalStorage<true>()
    byHook = probe.run(true, marks) > outside
    probe.disable()
  }
  return byHook
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | undefined)?.then === 'function'
}
