// A scripted stand-in for fetch: each call takes the next step of the script (an answer, a thrown
// network error, or a hang until aborted) and is recorded, so retry and timeout tests run on a FakeClock
// without any socket.
import type { FakeClock } from './fake-clock.js'

export interface FetchCall {
  url: string
  method: string
  headers: Record<string, string>
  body: string | undefined
}

export type FetchStep =
  | { status: number; body?: unknown; headers?: Record<string, string> }
  | { networkError: string }
  | 'hang'

export interface ScriptedFetch {
  fetch: typeof fetch
  calls: FetchCall[]
}

export function scriptedFetch(script: FetchStep[] | ((call: FetchCall) => FetchStep)): ScriptedFetch {
  const calls: FetchCall[] = []
  const fake = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const call: FetchCall = {
      url: String(input),
      method: init.method ?? 'GET',
      headers: { ...(init.headers as Record<string, string>) },
      body: init.body === undefined || init.body === null ? undefined : String(init.body),
    }
    calls.push(call)
    const step = typeof script === 'function' ? script(call) : script[calls.length - 1]
    if (step === undefined) throw new Error(`scripted fetch: no step for call #${calls.length}`)
    if (step === 'hang') {
      return new Promise<Response>((_resolve, reject) => {
        const signal = init.signal
        if (signal?.aborted) return reject(signal.reason)
        signal?.addEventListener('abort', () => reject(signal.reason))
      })
    }
    if ('networkError' in step) {
      // what undici throws when the connection fails: a TypeError with the system error as cause
      throw new TypeError('fetch failed', {
        cause: Object.assign(new Error(step.networkError), { code: step.networkError }),
      })
    }
    const text =
      step.body === undefined ? '' : typeof step.body === 'string' ? step.body : JSON.stringify(step.body)
    return new Response(text || null, { status: step.status, headers: step.headers })
  }
  return { fetch: fake as typeof fetch, calls }
}

/**
 * Awaits a call that sleeps on the fake clock between attempts: whenever it waits on a sleep other than
 * its request timeout, time is moved forward by exactly that sleep.
 */
export async function settleWithClock<T>(clock: FakeClock, run: Promise<T>, timeoutMs: number): Promise<T> {
  let settled = false
  const observed = run.finally(() => {
    settled = true
  })
  observed.catch(() => {})
  let advancedAt = -1
  while (!settled) {
    const last = clock.sleeps.at(-1)
    if (
      clock.pendingSleepers > 0 &&
      last !== undefined &&
      last !== timeoutMs &&
      advancedAt !== clock.sleeps.length
    ) {
      advancedAt = clock.sleeps.length
      await clock.advance(last)
    } else {
      await new Promise((resolve) => setImmediate(resolve))
    }
  }
  return observed
}
