// Commit-to-handler latency read from the commit itself, where the Postgres cluster records commit times
// (track_commit_timestamp = on): from each transition's commit (pg_xact_commit_timestamp of its history row's
// xmin) to the moment its handler was called (the no-op handler notes it: bench/serve-noop-handler.mjs) or its
// forward reached the partner's receiver (bench/server.ts, `receiver`): the first of each, a retry's later
// arrival aside. The service's own reaction_latency_seconds counts from the delivery's receipt instead (a
// replica cannot know when another one committed), so the ingest's time before the commit is in it, and it
// has only its histogram's buckets. Both clocks here are this machine's.
import pg from 'pg'

/** When each event reached the handler: its event id, and the time in ms since the epoch. */
export interface Arrivals {
  ids: string[]
  atMs: number[]
}

export interface CommitLatency {
  /** Transitions recorded since the load began that reached the handler. */
  samples: number
  /** Of those, the ones whose commit time Postgres did not have (none expected within a run). */
  withoutCommitTime: number
  p50Ms: number
  p99Ms: number
  maxMs: number
}

/** Whether the cluster behind `url` records commit times; the figures below exist only where it does. */
export async function commitTimesTracked(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query<{ on: boolean }>(`select current_setting('track_commit_timestamp')::bool as on`)
    return rows[0]?.on === true
  } finally {
    await client.end()
  }
}

/** From the commit of each transition recorded at or after `since` to its first arrival. */
export async function commitToArrivalLatency(url: string, arrivals: Arrivals, since: Date): Promise<CommitLatency> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query<{ samples: number; without: number; p50: number | null; p99: number | null; max: number | null }>(
      `with arrived as (
         select event_id, min(at_ms) as at_ms from unnest($1::uuid[], $2::float8[]) as a(event_id, at_ms) group by event_id
       ), taken as (
         select a.at_ms - extract(epoch from pg_xact_commit_timestamp(h.xmin)) * 1000 as ms
         from arrived a join order_status_history h on h.event_id = a.event_id
         where h.recorded_at >= $3
       )
       select count(*)::int as samples, count(*) filter (where ms is null)::int as without,
         percentile_cont(0.5) within group (order by ms) as p50,
         percentile_cont(0.99) within group (order by ms) as p99,
         max(ms)::float8 as max
       from taken`,
      [arrivals.ids, arrivals.atMs, since],
    )
    const row = rows[0]!
    return { samples: row.samples, withoutCommitTime: row.without, p50Ms: row.p50 ?? NaN, p99Ms: row.p99 ?? NaN, maxMs: row.max ?? NaN }
  } finally {
    await client.end()
  }
}
