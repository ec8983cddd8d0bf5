// Reactions, on Postgres, in one run:
// - commit-to-handler latency: one transition at a time into an idle dispatcher, from the moment the
//   statement's commit is answered to the moment the handler is called (the NOTIFY path);
// - dispatch throughput: N events of a no-op handler waiting in its stream, then the dispatcher started and
//   timed until every one is done; against graphile-worker running a no-op task over N waiting jobs on the same
//   Postgres, with the same concurrency, in the same process.
// Our jobs are spread over many orders (strict order per order and handler holds each order's next job
// back until the previous one is done); graphile-worker's run in its fastest mode, without named queues.
import { performance } from 'node:perf_hooks'
import { Logger as GraphileLogger, run as runGraphileWorker, makeWorkerUtils } from 'graphile-worker'
import pg from 'pg'
import { systemClock } from '../src/clock.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { createLogger } from '../src/logger.js'
import { applyObservation } from '../src/orders/apply-observation.js'
import { createOrder } from '../src/orders/create-order.js'
import { createDispatcher } from '../src/reactions/dispatcher.js'
import { DEFAULT_DISPATCHER_SETTINGS } from '../src/reactions/dispatcher-settings.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'

export interface ReactionsBenchResult {
  latency: { samples: number; p50Ms: number; p99Ms: number; maxMs: number }
  dispatch: { jobs: number; orders: number; concurrency: number; oursPerSecond: number; graphilePerSecond: number }
}

const CONCURRENCY = 8
const STATUSES = ['created', 'funded', 'delivered', 'released']

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!
}

/** Runs `work` over `items` with at most `limit` at once. */
export async function inParallel<T>(items: T[], limit: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) await work(items[next++]!)
    }),
  )
}

export async function runReactionsBench(url: string, { quick }: { quick: boolean }): Promise<ReactionsBenchResult> {
  const logger = createLogger({ level: 'silent' })
  const database = openDatabase({ databaseUrl: url, poolSize: 10, logger })
  const graphileSchema = `gw_${new URL(url).searchParams.get('options')?.match(/search_path=(\w+)/)?.[1] ?? 'bench'}`
  try {
    await migrateToLatest(database.db)
    const calls = new Map<string, number>()
    let done = 0
    let onDone: (() => void) | undefined
    const reactions = createReactionRegistry().on('trade.*', 'noop', async (event) => {
      calls.set(event.eventId, performance.now())
    })
    const dispatcher = () =>
      createDispatcher({
        db: database.db,
        handler: reactions.handler,
        streams: reactions,
        clock: systemClock,
        logger,
        listen: database.listen,
        settings: { ...DEFAULT_DISPATCHER_SETTINGS, concurrency: CONCURRENCY, maxAttempts: 10 },
        onAttempt: (_handler, result, count = 1) => {
          if (result === 'done') {
            done += count
            onDone?.()
          }
        },
      })
    const settings = { staleAfterS: 21_600, handlersFor: reactions.handlersFor }
    const move = async (orderId: number, reference: string, status: string) => {
      const result = await applyObservation(
        database.db,
        { target: { orderId }, tradeId: `trd-${reference}`, status, source: 'api', observedAt: new Date() },
        settings,
      )
      if (result.outcome !== 'applied') throw new Error(`${reference} → ${status}: ${result.outcome}`)
      return result
    }

    // latency: one transition at a time, the dispatcher idle and listening
    const latencies: number[] = []
    {
      const running = dispatcher()
      await running.start()
      const samples = quick ? 100 : 400
      for (let i = 0; i < samples; i++) {
        const reference = `lat-${i}`
        const { order } = await createOrder(database.db, { externalReference: reference, now: () => new Date() }, settings)
        const before = done
        const handled = new Promise<void>((resolve) => {
          onDone = () => done > before && resolve()
        })
        await move(order.id, reference, 'funded')
        const committed = performance.now()
        await handled
        const [eventCalledAt] = [...calls.values()].slice(-1)
        // the handler may be called before the commit's answer reaches this client: that counts as 0
        latencies.push(Math.max(0, eventCalledAt! - committed))
      }
      onDone = undefined
      await running.stop()
    }
    latencies.sort((a, b) => a - b)

    // throughput: N waiting jobs over many orders, then the dispatcher started
    const orders = quick ? 1_000 : 5_000
    const jobs = orders * STATUSES.length
    const references = Array.from({ length: orders }, (_, i) => `thr-${i}`)
    await inParallel(references, 8, async (reference) => {
      const { order } = await createOrder(database.db, { externalReference: reference, now: () => new Date() }, settings)
      for (const status of STATUSES) await move(order.id, reference, status)
    })
    const oursPerSecond = await (async () => {
      done = 0
      const finished = new Promise<void>((resolve) => {
        onDone = () => done >= jobs && resolve()
      })
      const running = dispatcher()
      const started = performance.now()
      await running.start()
      await finished
      const seconds = (performance.now() - started) / 1000
      await running.stop()
      return jobs / seconds
    })()

    const graphilePerSecond = await (async () => {
      const utils = await makeWorkerUtils({ connectionString: url, schema: graphileSchema, logger: quietGraphile })
      try {
        await utils.migrate()
        const specs = Array.from({ length: jobs }, (_, i) => ({ identifier: 'noop', payload: { i } }))
        for (let i = 0; i < specs.length; i += 5_000) await utils.addJobs(specs.slice(i, i + 5_000))
      } finally {
        await utils.release()
      }
      let completed = 0
      let resolveAll: () => void = () => {}
      const finished = new Promise<void>((resolve) => (resolveAll = resolve))
      const started = performance.now()
      const runner = await runGraphileWorker({
        connectionString: url,
        schema: graphileSchema,
        concurrency: CONCURRENCY,
        maxPoolSize: 10,
        noHandleSignals: true,
        logger: quietGraphile,
        taskList: { noop: async () => {} },
      })
      runner.events.on('job:success', () => {
        if (++completed >= jobs) resolveAll()
      })
      await finished
      const seconds = (performance.now() - started) / 1000
      await runner.stop()
      return jobs / seconds
    })()

    return {
      latency: {
        samples: latencies.length,
        p50Ms: round(percentile(latencies, 50)),
        p99Ms: round(percentile(latencies, 99)),
        maxMs: round(latencies.at(-1)!),
      },
      dispatch: {
        jobs,
        orders,
        concurrency: CONCURRENCY,
        oursPerSecond: Math.round(oursPerSecond),
        graphilePerSecond: Math.round(graphilePerSecond),
      },
    }
  } finally {
    await database.close()
    const admin = new pg.Client({ connectionString: url })
    await admin.connect()
    await admin.query(`drop schema if exists ${graphileSchema} cascade`)
    await admin.end()
  }
}

const quietGraphile = new GraphileLogger(() => () => {})

function round(ms: number): number {
  return Math.round(ms * 100) / 100
}
