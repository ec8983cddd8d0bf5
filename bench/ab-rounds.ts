// What the A/B benchmarks of two compiled trees share (ab-cpu.ts, dispatch-cpu.ts): a schema of their own on
// the bench database, the rounds of alternating pairs, Postgres's CPU for the service's connections, a median.
import { randomBytes } from 'node:crypto'
import pg from 'pg'
import { cpuMs } from './service-process.js'

export interface BenchSchema {
  /** Connected to the bench database (not in the schema). */
  admin: pg.Client
  /** The bench database with the schema as its search_path: what the services are started with. */
  url: string
  schema: string
  drop: () => Promise<void>
}

/** A new schema named `<prefix>_<random>` on BENCH_DATABASE_URL (default: the local `test` database). */
export async function createBenchSchema(prefix: string): Promise<BenchSchema> {
  const baseUrl = process.env.BENCH_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test'
  const schema = `${prefix}_${randomBytes(4).toString('hex')}`
  const admin = new pg.Client({ connectionString: baseUrl })
  await admin.connect()
  await admin.query(`create schema ${schema}`)
  const url = new URL(baseUrl)
  url.searchParams.set('options', `-c search_path=${schema}`)
  return {
    admin,
    url: url.toString(),
    schema,
    drop: async () => {
      await admin.query(`drop schema ${schema} cascade`)
      await admin.end()
    },
  }
}

/** The trees of one pair, in turn: A first in even pairs, B first in odd ones. */
function pairOrder(pair: number, distA: string, distB: string): ['A' | 'B', string][] {
  return pair % 2 === 0
    ? [
        ['A', distA],
        ['B', distB],
      ]
    : [
        ['B', distB],
        ['A', distA],
      ]
}

/**
 * Runs `round` once for each tree of each of `pairs` pairs, the trees in turn (pairOrder), then drops the
 * bench schema, also when a round fails.
 */
export async function inAlternatingPairs(
  { pairs, distA, distB, schema }: { pairs: number; distA: string; distB: string; schema: BenchSchema },
  round: (name: 'A' | 'B', dist: string) => Promise<void>,
): Promise<void> {
  try {
    for (let pair = 0; pair < pairs; pair++) {
      for (const [name, dist] of pairOrder(pair, distA, distB)) await round(name, dist)
    }
  } finally {
    await schema.drop()
  }
}

/**
 * The CPU (ms) each client backend of the database has used so far, by pid: the service's pool and listener,
 * not `admin`'s own, autovacuum's, the WAL writer's or the checkpointer's.
 */
export async function backendCpu(admin: pg.Client): Promise<Map<number, number>> {
  const { rows } = await admin.query<{ pid: number }>(
    `select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'`,
  )
  const cpu = new Map<number, number>()
  for (const { pid } of rows) {
    try {
      cpu.set(pid, cpuMs(pid))
    } catch {
      // ended meanwhile
    }
  }
  return cpu
}

/** The CPU (ms) the backends of `before` and those started since used from `before` to now. */
export async function backendCpuSince(admin: pg.Client, before: Map<number, number>): Promise<number> {
  let ms = 0
  for (const [pid, after] of await backendCpu(admin)) ms += after - (before.get(pid) ?? 0)
  return ms
}

export const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

/** AB_B_ENV='NAME=value NAME=value': more of B's environment (a setting's effect, with one tree as A and B). */
export function environmentOfB(): Record<string, string> {
  const pairs = (process.env.AB_B_ENV ?? '').split(' ').filter(Boolean)
  return Object.fromEntries(pairs.map((pair) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]))
}

/**
 * Resolves once every reaction job of the schema `url` names is done and every transition taken by its handlers'
 * streams: what a run with a handler waits for before it reads the CPU the dispatch took.
 */
export async function reactionsDone(url: string): Promise<void> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    for (;;) {
      const { rows } = await client.query(`select (select count(*)::int from reaction_jobs where state in ('pending', 'running'))
           + coalesce((select count(*)::int from reaction_streams s join order_status_history h
               on h.stream_position is not null and (h.stream_position, h.id) > (s.position, s.history_id)), 0) as left`)
      if (rows[0].left === 0) return
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  } finally {
    await client.end()
  }
}

/** The console's token of a service asked for a page first (AB_CONSOLE, ALLOC_CONSOLE). */
export const CONSOLE_TOKEN = 'ab-console-token-0123456789abcdef'
// one page of the operator console; then the page's deadline (CONSOLE_PAGE_ANSWER_MS, 5 s) and a second more
export const visitConsole = async (adminPort: number) => {
  const page = await fetch(`http://127.0.0.1:${adminPort}/console/`, { headers: { authorization: `Bearer ${CONSOLE_TOKEN}` } })
  if (page.status !== 200) throw new Error(`the console answered ${page.status}`)
  await page.arrayBuffer()
  await new Promise((resolve) => setTimeout(resolve, 6_500))
}
