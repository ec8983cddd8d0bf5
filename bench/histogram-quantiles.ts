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

/** The buckets of `name` for one handler label from the text exposition format. */
export function parseBuckets(text: string, name: string, handler: string): Buckets {
  const buckets: Buckets = []
  const line = new RegExp(`^${name}_bucket\\{(?:[^}]*,)?le="([^"]+)"(?:,[^}]*)?\\} (\\d+)`, 'gm')
  for (const match of text.matchAll(line)) {
    if (!match[0].includes(`handler="${handler}"`)) continue
    buckets.push([match[1] === '+Inf' ? Infinity : Number(match[1]), Number(match[2])])
  }
  return buckets.sort((a, b) => a[0] - b[0])
}

/** The reaction_latency_seconds buckets of `handler`, scraped from the service's admin port. */
export async function reactionLatencyBuckets(adminPort: number, handler: string): Promise<Buckets> {
  const response = await fetch(`http://127.0.0.1:${adminPort}/metrics`)
  return parseBuckets(await response.text(), 'reaction_latency_seconds', handler)
}

/** Runs `work` and gives what `handler`'s reaction_latency_seconds histogram took in meanwhile. */
export async function reactionLatencyDuring<T>(adminPort: number, handler: string, work: () => Promise<T>): Promise<[T, HistogramQuantiles]> {
  const before = await reactionLatencyBuckets(adminPort, handler)
  const result = await work()
  return [result, histogramQuantiles(before, await reactionLatencyBuckets(adminPort, handler))]
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
