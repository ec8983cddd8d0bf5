// A handler's timeoutMs (reaction-registry.ts), kept: each call of the handler gets a signal of its own, aborted
// timeoutMs after the call began, with a HandlerTimeoutError as its reason, or as soon as the signal of its batch or
// claim is (the lease about to end, the shutdown). Used by the stream's first attempts (stream-worker.ts) and the job
// loop (dispatcher.ts) alike, one per handler.
//
// Cheap on the path of every event: the calls of one handler have the same timeout, so their deadlines share one timer
// (deadlines.ts), and the calls under one batch or claim signal share one listener on it, not one each. A call costs
// an AbortController and two Set entries.
//
// The outcome of a call whose deadline passed is the timeout, whatever the call did after it: the error it threw then
// (most often what its aborted request threw) is kept as the cause, and a value it returned late is not taken. A call
// that ignores its signal holds its slot until it returns; its attempt is written then, as a timeout (its job stays
// running under its lease meanwhile, and is aborted there as any call is).
import type { Clock } from '../clock.js'
import { createAbortWatch } from './abort-watch.js'
import { createDeadlines } from './deadlines.js'

/** The attempt of a handler that did not return within its timeoutMs: retried as any failure (plan-retry.ts). */
export class HandlerTimeoutError extends Error {
  override name = 'HandlerTimeoutError'
  // `_timeout`: an outage's sign, as forward_timeout is (recovery-watch.ts)
  readonly code = 'reaction_timeout'
  constructor(
    readonly handler: string,
    readonly timeoutMs: number,
    options?: ErrorOptions,
  ) {
    super(`reaction handler ${handler} timed out after ${timeoutMs} ms (its timeoutMs): its signal was aborted`, options)
  }
}

export interface TimedCall {
  /** The call's own signal: what the handler is given. */
  readonly signal: AbortSignal
  /** Whether its deadline passed before it ended, and was what aborted its signal. */
  readonly timedOut: boolean
  /** The call returned or threw: its deadline is dropped. */
  end(): void
  /** What the call counts as once its deadline passed: the timeout, with what the call threw (if anything) as its cause. */
  failure(thrown: unknown): HandlerTimeoutError
}

export interface CallTimeouts {
  readonly timeoutMs: number
  /** A call starts under `parent` (its batch's or claim's signal). */
  start(parent: AbortSignal): TimedCall
}

/** The deadlines of `handler`'s calls, `timeoutMs` each. */
export function createCallTimeouts(clock: Clock, handler: string, timeoutMs: number): CallTimeouts {
  const deadlines = createDeadlines(clock, timeoutMs)
  // the calls running under each parent signal, which it aborts when it aborts
  const running = createAbortWatch<AbortController>()

  return {
    timeoutMs,
    start(parent) {
      const call = new AbortController()
      let timedOut = false
      running.add(parent, call)
      const deadline = deadlines.add(() => {
        // stopped before its deadline (the lease, the shutdown): that is what became of it
        if (call.signal.aborted) return
        timedOut = true
        call.abort(new HandlerTimeoutError(handler, timeoutMs))
      })
      return {
        signal: call.signal,
        get timedOut() {
          return timedOut
        },
        end() {
          deadlines.delete(deadline)
          running.delete(parent, call)
        },
        failure(thrown) {
          // (fetch and most libraries reject with the signal's reason itself)
          if (thrown === call.signal.reason && thrown instanceof HandlerTimeoutError) return thrown
          return new HandlerTimeoutError(handler, timeoutMs, thrown === undefined ? undefined : { cause: thrown })
        },
      }
    },
  }
}
