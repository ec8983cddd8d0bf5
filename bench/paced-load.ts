// An open-loop load: deliveries sent at a fixed rate, each on its own schedule whether or not the earlier ones
// were answered, over at most `connections` keep-alive connections (undici's pool queues a request while every
// connection is busy). This is how the platform's deliveries arrive: they do not wait for our answers.
//
// autocannon's closed loop (each connection sends its next request once answered) measures the queue it builds
// at full speed; its `overallRate` sends each second's quota as fast as it can and then waits, the same queue in
// bursts. Here each request's latency runs from the moment it was due, not from when it left, so a generator
// that falls behind (this process shares the cores) adds to the latency instead of hiding it.
import { performance } from 'node:perf_hooks'
import { Pool } from 'undici'
import { deliveryHeaders } from './bench-secrets.js'

export interface PacedResult {
  /** Requests answered (any status) within the run and the drain after it. */
  answered: number
  non2xx: number
  /** Requests that failed or were not answered within the drain. */
  unanswered: number
  /** Answered a second, from the first request's due time to the last answer. */
  rps: number
  p50Ms: number
  p99Ms: number
}

// how long the requests still in flight when the schedule ends may take to be answered
const DRAIN_MS = 30_000

export async function pacedLoad(
  port: number,
  { rate, seconds, connections, makeBody }: { rate: number; seconds: number; connections: number; makeBody: (index: number) => { body: string; deliveryId: string } },
): Promise<PacedResult> {
  const pool = new Pool(`http://127.0.0.1:${port}`, { connections, pipelining: 1 })
  const latencies: number[] = []
  let non2xx = 0
  let sent = 0
  let lastAnswerAt = 0
  const total = Math.round(rate * seconds)
  const start = performance.now()

  // undici's dispatch() with a handler that keeps the status and lets the body through: no promise, stream or
  // request object per delivery, so the generator takes less of the cores it shares with the service
  let pending = 0
  let drainedAll: (() => void) | undefined
  const settle = () => {
    pending--
    if (pending === 0) drainedAll?.()
  }
  const send = (index: number, dueAt: number) => {
    const { body, deliveryId } = makeBody(index)
    let status = 0
    pending++
    pool.dispatch(
      { method: 'POST', path: '/webhooks/partner', headers: deliveryHeaders(body, deliveryId), body },
      {
        onConnect: () => {},
        onHeaders: (statusCode: number) => {
          status = statusCode
          return true
        },
        onData: () => true,
        onComplete: () => {
          lastAnswerAt = performance.now()
          latencies.push(lastAnswerAt - dueAt)
          if (status < 200 || status > 299) non2xx++
          settle()
        },
        onError: settle, // counted as unanswered
      },
    )
  }

  await new Promise<void>((resolve) => {
    // every millisecond (as near as the timer gets), every request that has fallen due since: request n is due
    // at n / rate seconds, so by then n + 1 are due (request 0 at the start)
    const tick = setInterval(() => {
      const due = Math.min(total, Math.floor(((performance.now() - start) * rate) / 1000) + 1)
      for (; sent < due; sent++) send(sent, start + (sent * 1000) / rate)
      if (sent === total) {
        clearInterval(tick)
        resolve()
      }
    }, 1)
  })
  const drained = await new Promise<boolean>((resolve) => {
    if (pending === 0) return resolve(true)
    drainedAll = () => resolve(true)
    setTimeout(() => resolve(false), DRAIN_MS).unref()
  })
  await (drained ? pool.close() : pool.destroy())

  latencies.sort((a, b) => a - b)
  const quantile = (q: number) => Math.round(latencies[Math.min(latencies.length - 1, Math.ceil(q * latencies.length) - 1)] ?? Number.NaN)
  return {
    answered: latencies.length,
    non2xx,
    unanswered: total - latencies.length,
    rps: Math.round((latencies.length * 1000) / Math.max(1, lastAnswerAt - start)),
    p50Ms: quantile(0.5),
    p99Ms: quantile(0.99),
  }
}
