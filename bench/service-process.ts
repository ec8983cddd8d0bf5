// The real receiver as a benchmark drives it: the compiled CLI's `serve` (run `npm run build` first) in its
// own process, and its memory as /proc tells it. Shared by the ingest benchmark and the soak.
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { CompiledQuery } from 'kysely'
import pg from 'pg'
import { BENCH_SECRET } from './bench-secrets.js'

const root = path.resolve(import.meta.dirname, '..')

// The real receiver as it ships: the compiled CLI's `serve` (npm run build), poller off, logging on at info
// (to a pipe this process drains). On Postgres (a URL) in remote mode, its orders and seen deliveries seeded
// once it has migrated; on embedded PGlite ({ dataDir }), as `npm start` runs it, that directory seeded
// before it starts (PGlite is one process's).
export async function startService(
  database: string | { dataDir: string },
  seed: { orders: number; seen: number },
  /** More of the service's environment, e.g. FORWARD_URL and FORWARD_SECRET to run with a reaction handler. */
  extraEnv: Record<string, string> = {},
  /** The compiled tree to run (a private copy keeps a long run's code fixed while dist/ is rebuilt). */
  dist = path.join(root, 'dist'),
  /**
   * noopHandler: one in-process reaction handler registered for every transition, doing nothing.
   * nodeFlags: Node's flags for this process (default: BENCH_NODE_FLAGS, else the image's).
   * cpuProfileDir: where its V8 CPU profile goes, written as it exits (default: BENCH_CPU_PROF, else none).
   * node: the Node binary it runs on (default: this process's).
   */
  {
    noopHandler = false,
    nodeFlags: flags,
    cpuProfileDir = process.env.BENCH_CPU_PROF,
    node = process.execPath,
  }: { noopHandler?: boolean; nodeFlags?: string; cpuProfileDir?: string; node?: string } = {},
): Promise<{ child: ChildProcess; port: number; adminPort: number }> {
  const profile = cpuProfileDir ? ['--cpu-prof', `--cpu-prof-dir=${cpuProfileDir}`] : []
  // the flags the Docker image runs with (NODE_OPTIONS there); BENCH_NODE_FLAGS overrides them
  const nodeFlags = (flags ?? process.env.BENCH_NODE_FLAGS ?? '--max-semi-space-size=8 --max-old-space-size=512').split(' ').filter(Boolean)
  if (typeof database !== 'string') await seedPglite(database.dataDir, seed)
  const entry = noopHandler ? [path.join(root, 'bench/serve-noop-handler.mjs'), dist] : [path.join(dist, 'src/cli.js'), 'serve']
  const child = spawn(node, [...profile, ...nodeFlags, ...entry], {
    cwd: root,
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      ...(typeof database === 'string' ? { DATABASE_URL: database } : { DATA_DIR: database.dataDir }),
      PORT: '0',
      ADMIN_PORT: '0',
      POLL_ENABLED: 'false',
      LOG_LEVEL: 'info',
      PARTNER_API_BASE_URL: 'http://127.0.0.1:1',
      PARTNER_API_KEY_ID: 'pk_bench',
      PARTNER_API_SECRET: 'bench-api-secret-0123456789abcdef',
      WEBHOOK_SECRETS: BENCH_SECRET,
      // tuning experiments: these pass through from the bench's environment
      ...pick(process.env, ['DATABASE_POOL_SIZE', 'WEBHOOK_BATCH_MAX', 'WEBHOOK_BATCH_STATEMENTS', 'WEBHOOK_SEEN_CACHE', 'REACTION_CONCURRENCY']),
      ...extraEnv,
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const [port, adminPort] = await new Promise<[number, number]>((resolve, reject) => {
    let buffer = ''
    const read = (chunk: Buffer) => {
      buffer += chunk
      const match = /"url":"http:\/\/127\.0\.0\.1:(\d+)","adminUrl":"http:\/\/127\.0\.0\.1:(\d+)"[^\n]*"msg":"service listening"/.exec(buffer)
      if (match) {
        // from here on the log lines are only drained: this process is also the load generator
        child.stdout!.off('data', read).on('data', () => {})
        resolve([Number(match[1]), Number(match[2])])
      } else if (buffer.length > 100_000) buffer = buffer.slice(-1000)
    }
    child.stdout!.on('data', read)
    child.once('exit', (code) => reject(new Error(`service exited with ${code}`)))
  })
  if (typeof database === 'string') {
    const client = new pg.Client({ connectionString: database })
    await client.connect()
    await seedTables((text, values) => client.query(text, values), seed)
    await client.end()
  }
  return { child, port, adminPort }
}

type Query = (text: string, values: unknown[]) => Promise<{ rowCount?: number | null }>

// orders bench-1..N to match, and deliveries seen-1..M for the duplicate path
async function seedTables(query: Query, seed: { orders: number; seen: number }): Promise<void> {
  const orders = await query(`insert into orders (external_reference) select 'bench-' || i from generate_series(1, $1::int) i on conflict do nothing`, [seed.orders])
  const seen = await query(
    // the exact body the bench's retries send (run.ts, seen()): a delivery is its id and its body's hash
    `insert into webhook_deliveries (delivery_id, event_type, outcome, raw_body, body_sha256)
     select 'seen-' || i, 'trade.funded', 'applied', body, encode(sha256(convert_to(body, 'UTF8')), 'hex')
     from generate_series(1, $1::int) i,
       lateral (select '{"trade_id":"trd-' || i || '","reference":"R-' || i || '","status":"funded","external_reference":"bench-' || i || '"}' as body) seen
     on conflict do nothing`,
    [seed.seen],
  )
  if ((orders.rowCount ?? 0) + (seen.rowCount ?? 0) === 0) return
  // a table just filled in bulk carries work a table grown over months does not: autovacuum's insert
  // threshold and analyze, the hint bits of rows never read, the checkpoint of the seed's dirty pages. Done
  // now, before the warm-up, not inside the measured run (as the growth part does after its seed;
  // bench/results/latest.md, "morning round": 2 alternating pairs, full/minimal 1.47 -> 1.72 and 1.34 -> 1.57)
  await query('vacuum analyze orders', [])
  await query('vacuum analyze webhook_deliveries', [])
  await query('checkpoint', [])
}

/** The schema a service would make at its start, made here: for a seed that comes before any service. */
export async function migrateSchema(databaseUrl: string): Promise<void> {
  const { openDatabase } = await import('../src/db/open-database.js')
  const { migrateToLatest } = await import('../src/db/migrate.js')
  const database = openDatabase({ databaseUrl })
  try {
    await migrateToLatest(database.db)
  } finally {
    await database.close()
  }
}

// an embedded database made and seeded here, then closed, for the service to start on
async function seedPglite(dataDir: string, seed: { orders: number; seen: number }): Promise<void> {
  const { openDatabase } = await import('../src/db/open-database.js')
  const { migrateToLatest } = await import('../src/db/migrate.js')
  const database = openDatabase({ dataDir })
  try {
    await migrateToLatest(database.db)
    await seedTables(async (text, values) => {
      const result = await database.db.executeQuery(CompiledQuery.raw(text, values))
      return { rowCount: Number(result.numAffectedRows ?? 0) }
    }, seed)
  } finally {
    await database.close()
  }
}

/**
 * One of bench/server.ts's servers (bare, minimal, receiver) in its own process, from source; its port
 * once it listens.
 */
export async function startBenchServer(kind: string, env: Record<string, string>): Promise<{ child: ChildProcess; port: number }> {
  // BENCH_CPU_PROF=dir writes a V8 profile of each server (summarize with bench/profile-summary.ts)
  const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : []
  const child = spawn(process.execPath, [...profile, '--import', 'tsx', path.join(root, 'bench/server.ts'), kind], {
    cwd: root,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const port = await new Promise<number>((resolve, reject) => {
    let output = ''
    child.stdout!.on('data', (chunk) => {
      output += chunk
      const match = /\{"port":"?(\d+)"?\}/.exec(output)
      if (match) resolve(Number(match[1]))
    })
    child.once('exit', (code) => reject(new Error(`${kind} server exited with ${code}`)))
  })
  return { child, port }
}

/** Stops a service startService started, as Ctrl-C does, and waits until it has exited. */
export async function stopService(child: ChildProcess): Promise<void> {
  child.kill('SIGINT')
  await once(child, 'exit')
}

function pick(env: NodeJS.ProcessEnv, names: string[]): Record<string, string> {
  return Object.fromEntries(names.filter((name) => env[name] !== undefined).map((name) => [name, env[name]!]))
}

export function peakRssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8')
  const kb = Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0)
  return Math.round(kb / 1024)
}

/** Resident memory now, in MB. */
export function rssMb(pid: number): number {
  return Math.round(Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024)
}

/** CPU time (user + system) the process (or only its thread `thread`) has used so far, in ms, as /proc tells it. */
export function cpuMs(pid: number, thread?: number): number {
  // the fields after the command's closing parenthesis: utime and stime are the 12th and 13th
  const stat = thread === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${thread}/stat`
  const fields = readFileSync(stat, 'utf8').split(') ')[1]!.split(' ')
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS
}

/**
 * The CPU (ms) the whole Postgres cluster has used so far: the postmaster's own, its ended children's (which it
 * reaped: autovacuum workers, backends that closed) and its live children's (backends, the WAL writer, the
 * checkpointer). A difference of two readings is what the cluster did meanwhile, whichever process did it.
 */
export function clusterCpuMs(postmaster: number): number {
  const stat = (pid: number) => readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
  const own = stat(postmaster)
  // utime, stime, cutime, cstime: the 12th to 15th fields; the parent's pid is the 2nd after the command
  let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14])
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const fields = stat(Number(entry))
      if (Number(fields[1]) === postmaster) ticks += Number(fields[11]) + Number(fields[12])
    } catch {
      // ended meanwhile (its time is now the postmaster's cutime)
    }
  }
  return (ticks * 1000) / CLOCK_TICKS
}

/** The postmaster's pid of the cluster behind `url` (its data directory's postmaster.pid; needs a superuser and the same machine). */
export async function postmasterPid(url: string): Promise<number | undefined> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    const { rows } = await client.query<{ data_directory: string }>('show data_directory')
    return Number(readFileSync(path.join(rows[0]!.data_directory, 'postmaster.pid'), 'utf8').split('\n')[0])
  } catch {
    return undefined
  } finally {
    await client.end()
  }
}

// USER_HZ: 100 on every Linux this runs on
const CLOCK_TICKS = 100
