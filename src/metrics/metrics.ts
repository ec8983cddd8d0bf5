// Prometheus metrics (prom-client), one registry per service instance so tests can build several.
// What the receiver and the poller record, and what is read from the database at scrape time.
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client'

export interface MetricsSources {
  /** Orders due for a poll now, and how long the oldest has waited. */
  dueOrders?: () => Promise<{ ordersDue: number; oldestDueAgeS: number }>
  /** Database connections: in use, idle, and callers waiting for one. */
  poolStats?: () => { total: number; idle: number; waiting: number }
}

export interface Metrics {
  readonly registry: Registry
  readonly deliveries: Counter<'outcome'>
  readonly signatureFailures: Counter
  readonly ingestSeconds: Histogram<'outcome'>
  readonly ingestBatchSize: Histogram
  readonly pollResults: Counter<'result'>
}

export function createMetrics(sources: MetricsSources = {}, { defaultMetrics = true } = {}): Metrics {
  const registry = new Registry()
  if (defaultMetrics) collectDefaultMetrics({ register: registry })

  const deliveries = new Counter({
    name: 'webhook_deliveries_total',
    help: 'Webhook deliveries answered, by outcome (applied, duplicate, duplicate_effect, stale, unknown_status, id_reused, unmatched, ignored, invalid, rejected)',
    labelNames: ['outcome'] as const,
    registers: [registry],
  })
  const signatureFailures = new Counter({
    name: 'webhook_signature_failures_total',
    help: 'Webhook deliveries refused with 401 because the signature was missing, malformed or wrong',
    registers: [registry],
  })
  const ingestSeconds = new Histogram({
    name: 'webhook_ingest_duration_seconds',
    help: 'Time from the end of the request body to the answer, by outcome',
    labelNames: ['outcome'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  })
  const ingestBatchSize = new Histogram({
    name: 'webhook_ingest_batch_size',
    help: 'Trade-event deliveries written by one statement and one commit (group commit)',
    buckets: [1, 2, 5, 10, 20, 50, 100, 200, 500],
    registers: [registry],
  })
  const pollResults = new Counter({
    name: 'poller_polls_total',
    help: 'Trades polled by the reconciler, by result',
    labelNames: ['result'] as const,
    registers: [registry],
  })

  const dueOrders = sources.dueOrders
  if (dueOrders) {
    // one query per scrape feeds both gauges
    let pending: Promise<{ ordersDue: number; oldestDueAgeS: number }> | undefined
    const read = () => {
      pending ??= dueOrders().finally(() => {
        pending = undefined
      })
      return pending
    }
    new Gauge({
      name: 'poller_orders_due',
      help: 'Orders whose next poll time has passed',
      registers: [registry],
      async collect() {
        this.set((await read()).ordersDue)
      },
    })
    new Gauge({
      name: 'poller_oldest_due_age_seconds',
      help: 'How long the longest-waiting due order has been due',
      registers: [registry],
      async collect() {
        this.set((await read()).oldestDueAgeS)
      },
    })
  }
  const poolStats = sources.poolStats
  if (poolStats) {
    new Gauge({
      name: 'database_pool_connections',
      help: 'Database connections by state (in_use, idle) and callers waiting for one',
      labelNames: ['state'] as const,
      registers: [registry],
      collect() {
        const stats = poolStats()
        this.set({ state: 'in_use' }, stats.total - stats.idle)
        this.set({ state: 'idle' }, stats.idle)
        this.set({ state: 'waiting' }, stats.waiting)
      },
    })
  }

  return { registry, deliveries, signatureFailures, ingestSeconds, ingestBatchSize, pollResults }
}
