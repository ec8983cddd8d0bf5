// Quantiles of a Prometheus histogram over an interval, read from a running service's /metrics: the
// cumulative bucket counts scraped before and after, subtracted. A quantile is given as the upper bound of the
// bucket it falls in (what the histogram knows; histogram_quantile() would interpolate inside the bucket).

/** Cumulative count by upper bound (`le`), in increasing order of the bound; Infinity for +Inf. */
export type Buckets = [number, number][]

export interface HistogramQuantiles {
  samples: number
  /** Upper bounds of the buckets the median and the 99th percentile fall in (Infinity: above the last bound). */
  p50UpToS: number
  p99UpToS: number
  /** The largest finite bound, for a quantile above it. */
  lastBoundS: number
}

/**
 * The buckets of `name` from the text exposition format: of the series with the label `only` (`handler="noop"`),
 * or, without it, every series's summed (the ingest's histogram across its outcomes).
 */
export function parseBuckets(text: string, name: string, only?: string): Buckets {
  const sums = new Map<number, number>()
  const line = new RegExp(`^${name}_bucket\\{(?:[^}]*,)?le="([^"]+)"(?:,[^}]*)?\\} (\\d+)`, 'gm')
  for (const match of text.matchAll(line)) {
    if (only !== undefined && !match[0].includes(only)) continue
    const bound = match[1] === '+Inf' ? Infinity : Number(match[1])
    sums.set(bound, (sums.get(bound) ?? 0) + Number(match[2]))
  }
  return [...sums].sort((a, b) => a[0] - b[0])
}

async function scrapeBuckets(adminPort: number, name: string, only?: string): Promise<Buckets> {
  const response = await fetch(`http://127.0.0.1:${adminPort}/metrics`)
  return parseBuckets(await response.text(), name, only)
}

/** Runs `work` and gives what the histogram `name` (its series with the label `only`, or all) took meanwhile. */
export async function histogramDuring<T>(adminPort: number, name: string, only: string | undefined, work: () => Promise<T>): Promise<[T, HistogramQuantiles]> {
  const before = await scrapeBuckets(adminPort, name, only)
  const result = await work()
  return [result, histogramQuantiles(before, await scrapeBuckets(adminPort, name, only))]
}

/** Runs `work` and gives what `handler`'s reaction_latency_seconds histogram took meanwhile. */
export function reactionLatencyDuring<T>(adminPort: number, handler: string, work: () => Promise<T>): Promise<[T, HistogramQuantiles]> {
  return histogramDuring(adminPort, 'reaction_latency_seconds', `handler="${handler}"`, work)
}

/** Runs `work` and gives what webhook_ingest_duration_seconds took meanwhile, every outcome together. */
export function ingestDurationDuring<T>(adminPort: number, work: () => Promise<T>): Promise<[T, HistogramQuantiles]> {
  return histogramDuring(adminPort, 'webhook_ingest_duration_seconds', undefined, work)
}

export function histogramQuantiles(before: Buckets, after: Buckets): HistogramQuantiles {
  const earlier = new Map(before)
  const counts = after.map(([bound, count]) => [bound, count - (earlier.get(bound) ?? 0)] as const)
  const samples = counts.at(-1)?.[1] ?? 0
  const upTo = (quantile: number) => counts.find(([, count]) => count >= quantile * samples)?.[0] ?? Infinity
  const lastBoundS = Math.max(0, ...counts.map(([bound]) => bound).filter(Number.isFinite))
  return { samples, p50UpToS: upTo(0.5), p99UpToS: upTo(0.99), lastBoundS }
}

const seconds = (s: number) => (s >= 1 ? `${s} s` : `${Math.round(s * 1000)} ms`)

/** "≤ 25 ms" / "> 60 s" for a quantile's bucket bound. */
export function describeBound(boundS: number, { lastBoundS }: HistogramQuantiles): string {
  return Number.isFinite(boundS) ? `≤ ${seconds(boundS)}` : `> ${seconds(lastBoundS)}`
}
